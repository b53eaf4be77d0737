"""Retrieval: picking the best candidates of a whole corpus for each query.

`exact_top_k` ranks every candidate by dot product in bounded memory (ties
to the lower position, a user's training items left out); `merge_top_k` and
`all_gather_top_k` merge top-K lists over disjoint candidates, on one rank or
across ranks; `BruteForceTopK` is the Keras layer whose output the retrieval
metrics (`rk.metrics.RecallAtK`, `NDCGAtK`, `HitRateAtK`, `MRR`) read.

Example:

```python
scores, top = rk.retrieval.exact_top_k(user_vectors, item_vectors, 20,
                                       exclude=train_items)
```
"""

from reckeras.retrieval.topk import BruteForceTopK, all_gather_top_k, exact_top_k, merge_top_k

__all__ = ["BruteForceTopK", "all_gather_top_k", "exact_top_k", "merge_top_k"]
