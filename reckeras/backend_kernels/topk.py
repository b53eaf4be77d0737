"""Exact top-K by dot product in bounded memory: the pure-torch core.

Every candidate is scored, `chunk_size` candidate rows at a time, and a
running top K is kept per query, so memory is `O(B * (chunk_size + k))`
whatever the corpus size. Ranking is exact and deterministic: scores are
compared as float32, and equal scores go to the lower candidate position.
A chunk's best k come from a float `torch.topk`; only rows with a tie
across their cut fold score and position into one int64 key (the score's
order-preserving bits above the inverted position) to break it. The
running top K is kept as such keys, so merging is one `torch.topk`.

It imports nothing but torch, so that evaluation in training
(`reckeras.retrieval`, which re-exports both functions) and the Keras-free
serving predictor (`reckeras.serving`) run this one implementation.
"""

from __future__ import annotations

from typing import Any

import torch

DEFAULT_CHUNK_SIZE = 16_384
# Positions live in the low 32 bits of a key.
_MAX_POSITIONS = 2**32
_LOW_BITS = _MAX_POSITIONS - 1
# The key of an empty slot (no candidate): below the key of any real score,
# -inf included, since the score bits of -inf are above int32's minimum.
_EMPTY = torch.iinfo(torch.int64).min


def _keys(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as (score descending, position ascending).

    Args:
        scores: float32 scores (NaN-free).
        positions: int64 positions in [0, 2**32), broadcastable to `scores`.
    """
    # + 0.0 turns -0.0 into +0.0, which compare equal as floats.
    bits = (scores + 0.0).view(torch.int32).to(torch.int64)
    # Negative floats order backwards as integers: flip their magnitude bits.
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered << 32) | (_LOW_BITS - positions)


def _decoded(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(scores, positions)` of keys; an empty slot is `(-inf, -1)`."""
    ordered = keys >> 32
    bits = torch.where(ordered < 0, ordered ^ 0x7FFFFFFF, ordered).to(torch.int32)
    empty = keys == _EMPTY
    scores = torch.where(empty, float("-inf"), bits.view(torch.float32))
    positions = torch.where(empty, -1, _LOW_BITS - (keys & _LOW_BITS))
    return scores, positions


def check_k(k: Any) -> int:
    """`k` when it is a positive int (a bool is not).

    Args:
        k: the top-K length asked for.

    Returns:
        `k`.

    Raises:
        ValueError: `k` is not a positive int.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    return k


def _check_finite(tensor: torch.Tensor, what: str) -> None:
    if not torch.isfinite(tensor).all():
        raise ValueError(f"exact_top_k: {what} hold NaN or inf")


def _excluded_locally(exclude: torch.Tensor, positions: torch.Tensor | None,
                      count: int) -> torch.Tensor:
    """`exclude`'s global positions as local rows of the candidates, -1 where
    a position is not among them."""
    exclude = exclude.to(torch.int64)
    if positions is None:
        return torch.where((exclude >= 0) & (exclude < count), exclude, -1)
    sorted_positions, order = torch.sort(positions)
    slot = torch.searchsorted(sorted_positions, exclude).clamp_(max=count - 1)
    found = (sorted_positions[slot] == exclude) & (exclude >= 0)
    return torch.where(found, order[slot], -1)


def exact_top_k(queries: torch.Tensor, candidates: torch.Tensor, k: int,
                exclude: torch.Tensor | None = None,
                chunk_size: int = DEFAULT_CHUNK_SIZE,
                positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` best candidates of every query by dot product, exactly.

    Scores are `queries @ candidates.T`, computed `chunk_size` candidates at
    a time in the inputs' dtype and ranked as float32. Ties go to the lower
    position. A query with fewer than `k` candidates left (after
    `exclude`) gets its remaining slots filled with position -1 and score
    -inf.

    Args:
        queries: float `[B, D]`.
        candidates: float `[N, D]`, on the device of `queries`.
        k: how many candidates to return per query, a positive int (it may
            exceed `N`: the extra slots are empty).
        exclude: int `[B, E]` candidate positions to leave out per query
            (e.g. the user's training items), -1 padded; positions not among
            the candidates are ignored. None for none.
        chunk_size: candidate rows scored at once: the memory bound.
        positions: int64 `[N]` distinct global positions of the candidate
            rows, in [0, 2**32), when they are a shard of a larger corpus
            (see `all_gather_top_k`); None for `0..N-1`.

    Returns:
        `(scores, positions)`: float32 `[B, k]` and int64 `[B, k]`, best
        first.

    Raises:
        ValueError: for mismatched shapes, a bad `k` or `chunk_size`, NaN or
            inf inputs, or more than 2**32 candidates.

    Example:

    ```python
    queries = torch.randn(4, 16)
    items = torch.randn(10_000, 16)
    seen = torch.tensor([[3, 7, -1], [5, -1, -1], [-1, -1, -1], [0, 1, 2]])
    scores, top = rk.retrieval.exact_top_k(queries, items, 20, exclude=seen)
    ```
    """
    k = check_k(k)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if queries.dim() != 2 or candidates.dim() != 2 or queries.shape[1] != candidates.shape[1]:
        raise ValueError(f"exact_top_k needs queries [B, D] and candidates [N, D]; got "
                         f"{tuple(queries.shape)} and {tuple(candidates.shape)}")
    count = candidates.shape[0]
    if count > _MAX_POSITIONS:
        raise ValueError(f"exact_top_k ranks at most 2**32 candidates, got {count}")
    if exclude is not None and (exclude.dim() != 2 or exclude.shape[0] != queries.shape[0]):
        raise ValueError(f"exclude must be [B, E] with B = {queries.shape[0]} queries, "
                         f"got {tuple(exclude.shape)}")
    if positions is not None and positions.shape != (count,):
        raise ValueError(f"positions must be [N] = [{count}], got {tuple(positions.shape)}")
    _check_finite(queries, "queries")
    _check_finite(candidates, "candidates")
    device = queries.device
    global_positions = (torch.arange(count, device=device) if positions is None
                        else positions.to(device=device, dtype=torch.int64))
    local_exclude = None if exclude is None or exclude.shape[1] == 0 or count == 0 else \
        _excluded_locally(exclude.to(device), None if positions is None else global_positions,
                          count)
    best = torch.full((queries.shape[0], k), _EMPTY, dtype=torch.int64, device=device)
    rows = torch.arange(queries.shape[0], device=device)
    for start in range(0, count, chunk_size):
        stop = min(start + chunk_size, count)
        scores = (queries @ candidates[start:stop].T).to(torch.float32)
        if local_exclude is not None:
            column = local_exclude - start
            inside = (column >= 0) & (column < stop - start)
            scores[rows[:, None].expand_as(column)[inside], column[inside]] = float("-inf")
        keys = _chunk_keys(scores, global_positions[start:stop], k)
        best = torch.topk(torch.cat([best, keys], dim=1), k, dim=1).values
    return _decoded(best)


def _chunk_keys(scores: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """The keys of each row's best `k` scores of one chunk (-inf: excluded).

    A float `topk` finds each row's best k + 1 scores; a row whose k-th and
    (k+1)-th differ (no tie across the cut) takes its best k as they are.
    Only a row with a tie at its cut has keys made for its whole chunk, so
    that the tie goes to the lower position: elementwise int64 work over
    every score is what made ranking slow.
    """
    width = min(k, scores.shape[1])
    # One more than k shows a tie across the cut: the (k+1)-th equals the
    # k-th (ties among excluded -inf scores do not matter: none is kept).
    values, columns = torch.topk(scores, min(k + 1, scores.shape[1]), dim=1)
    if values.shape[1] > width:
        cut, after = values[:, width - 1], values[:, width]
        tied = ((after == cut) & (cut != float("-inf"))).nonzero().squeeze(1)
        values, columns = values[:, :width], columns[:, :width]
    else:
        tied = values.new_zeros(0, dtype=torch.int64)
    keys = torch.where(values == float("-inf"), _EMPTY, _keys(values, positions[columns]))
    if len(tied):
        tied_scores = scores[tied]
        exact = torch.where(tied_scores == float("-inf"), _EMPTY,
                            _keys(tied_scores, positions))
        keys[tied] = torch.topk(exact, width, dim=1).values
    return keys


def merge_top_k(parts: list[tuple[torch.Tensor, torch.Tensor]],
                k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top `k` of several top-K lists of the same queries.

    Args:
        parts: `(scores, positions)` pairs as `exact_top_k` returns them,
            each `[B, k_i]`, over disjoint candidates.
        k: the length of the merged lists.

    Returns:
        `(scores, positions)`, `[B, k]`, best first, ties to the lower
        position, empty slots `(-inf, -1)`.

    Example:

    ```python
    left = rk.retrieval.exact_top_k(q, items[:500], 10)
    right = rk.retrieval.exact_top_k(q, items[500:], 10,
                                     positions=torch.arange(500, 1000))
    scores, top = rk.retrieval.merge_top_k([left, right], 10)
    ```
    """
    k = check_k(k)
    keys = []
    for scores, positions in parts:
        real = positions >= 0
        keys.append(torch.where(real, _keys(scores.to(torch.float32),
                                            torch.where(real, positions, 0)), _EMPTY))
    merged = torch.cat(keys, dim=1)
    if merged.shape[1] < k:
        merged = torch.nn.functional.pad(merged, (0, k - merged.shape[1]), value=_EMPTY)
    return _decoded(torch.topk(merged, k, dim=1).values)
