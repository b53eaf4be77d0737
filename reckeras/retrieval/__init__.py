"""Retrieval: picking the best candidates of a whole corpus for each query.

Training: `rk.models.two_tower` learns query and candidate towers with
in-batch and sampled negatives (`NegativeSampler`), a sampling-bias (logQ)
correction from a streaming estimate (`FrequencyEstimator`) and one of the
losses here, candidates gathered across ranks (`gather_candidates`).

Evaluation: `exact_top_k` ranks every candidate by dot product in bounded
memory (ties to the lower position, a user's training items left out);
`merge_top_k` and `all_gather_top_k` merge top-K lists over disjoint
candidates, on one rank or across ranks; `BruteForceTopK` is the Keras layer
whose output the retrieval metrics (`rk.metrics.RecallAtK`, `NDCGAtK`,
`HitRateAtK`, `MRR`) read. `evaluate` runs all of it for a trained
two-tower model in one call (its query and candidate towers, exact top-K
over the corpus, training items left out, the metrics), and
`RetrievalEvaluation` is the callback that reports it at the end of epochs.

Example:

```python
scores, top = rk.retrieval.exact_top_k(user_vectors, item_vectors, 20,
                                       exclude=train_items)
```
"""

from reckeras.retrieval.cross_rank import gather_candidates
from reckeras.retrieval.evaluation import RetrievalEvaluation, evaluate
from reckeras.retrieval.frequency import FrequencyEstimator
from reckeras.retrieval.losses import (
    accidental_hits,
    bpr_loss,
    cosine_contrastive_loss,
    sampled_softmax_loss,
)
from reckeras.retrieval.negatives import NegativeSampler
from reckeras.retrieval.topk import BruteForceTopK, all_gather_top_k, exact_top_k, merge_top_k

__all__ = ["BruteForceTopK", "FrequencyEstimator", "NegativeSampler", "RetrievalEvaluation",
           "accidental_hits", "all_gather_top_k", "bpr_loss", "cosine_contrastive_loss",
           "evaluate", "exact_top_k", "gather_candidates", "merge_top_k",
           "sampled_softmax_loss"]
