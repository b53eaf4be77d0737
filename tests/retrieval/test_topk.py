"""`exact_top_k`, `merge_top_k` and `BruteForceTopK` against numpy: a full
score matrix ranked by (score descending, position ascending). Integer-valued
embeddings make every dot product exact, so ties are many and exact."""

import keras
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk
from reckeras.retrieval import BruteForceTopK, exact_top_k, merge_top_k


def reference(queries, candidates, k, exclude=None, positions=None):
    """numpy top k: every score, excluded ones dropped, stable lexsort."""
    scores = queries.astype(np.float64) @ candidates.astype(np.float64).T
    positions = np.arange(len(candidates)) if positions is None else positions
    top_scores = np.full((len(queries), k), -np.inf)
    top = np.full((len(queries), k), -1)
    for b in range(len(queries)):
        keep = ~np.isin(positions, [] if exclude is None else exclude[b])
        order = np.lexsort((positions[keep], -scores[b][keep]))[:k]
        top[b, :len(order)] = positions[keep][order]
        top_scores[b, :len(order)] = scores[b][keep][order]
    return top_scores, top


@st.composite
def problems(draw):
    b, n, d = draw(st.integers(0, 6)), draw(st.integers(0, 40)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    queries = rng.integers(-2, 3, (b, d)).astype(np.float32)
    candidates = rng.integers(-2, 3, (n, d)).astype(np.float32)
    width = draw(st.integers(0, 6))
    exclude = rng.integers(-1, n + 3, (b, width))      # padding and unknown positions too
    return queries, candidates, exclude, draw(st.integers(1, 12)), draw(st.integers(1, 9))


@settings(max_examples=150, deadline=None)
@given(problems())
def test_equals_numpy_with_ties_exclusions_and_chunks(problem):
    queries, candidates, exclude, k, chunk = problem
    scores, top = exact_top_k(torch.from_numpy(queries), torch.from_numpy(candidates), k,
                              exclude=torch.from_numpy(exclude), chunk_size=chunk)
    expected_scores, expected = reference(queries, candidates, k, exclude)
    assert top.dtype == torch.int64 and scores.dtype == torch.float32
    np.testing.assert_array_equal(top.numpy(), expected)
    np.testing.assert_array_equal(scores.numpy(), expected_scores)


def test_distinct_float_scores_take_the_untied_path():
    """Random floats rarely tie at a cut: the rows keep the float top k."""
    rng = np.random.default_rng(3)
    queries = rng.normal(size=(50, 8)).astype(np.float32)
    candidates = rng.normal(size=(700, 8)).astype(np.float32)
    candidates[100:120] = 0.0          # and 20 zero rows: a tie in every row
    exclude = rng.integers(-1, 700, (50, 30))
    scores, top = exact_top_k(torch.from_numpy(queries), torch.from_numpy(candidates), 25,
                              exclude=torch.from_numpy(exclude), chunk_size=64)
    expected_scores, expected = reference(queries, candidates, 25, exclude)
    np.testing.assert_array_equal(top.numpy(), expected)
    np.testing.assert_allclose(scores.numpy(), expected_scores, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(problems(), st.integers(2, 4))
def test_shards_with_global_positions_merge_to_the_whole(problem, shards):
    queries, candidates, exclude, k, chunk = problem
    permutation = np.random.default_rng(len(candidates)).permutation(len(candidates))
    parts = []
    for shard in range(shards):
        mine = permutation[shard::shards]
        parts.append(exact_top_k(torch.from_numpy(queries), torch.from_numpy(candidates[mine]),
                                 k, exclude=torch.from_numpy(exclude), chunk_size=chunk,
                                 positions=torch.from_numpy(mine)))
    scores, top = merge_top_k(parts, k)
    expected_scores, expected = reference(queries, candidates, k, exclude)
    np.testing.assert_array_equal(top.numpy(), expected)
    np.testing.assert_array_equal(scores.numpy(), expected_scores)


def test_float_scores_negative_zero_and_infinities_keep_their_order():
    rng = np.random.default_rng(0)
    queries = rng.standard_normal((8, 16)).astype(np.float32)
    candidates = rng.standard_normal((1000, 16)).astype(np.float32)
    candidates[5] = 0.0                       # scores of exactly +-0.0
    scores, top = exact_top_k(torch.from_numpy(queries), torch.from_numpy(candidates), 1000,
                              chunk_size=97)
    full = (torch.from_numpy(queries) @ torch.from_numpy(candidates).T).numpy()
    # Against torch's own scores, sorted stably: the same order, bit for bit.
    order = np.stack([np.lexsort((np.arange(1000), -row)) for row in full])
    np.testing.assert_array_equal(top.numpy(), order)
    np.testing.assert_array_equal(scores.numpy(), np.take_along_axis(full, order, 1))
    huge = torch.tensor([[1.0]]), torch.tensor([[-3e38], [3e38], [0.0]])
    assert exact_top_k(*huge, 3)[1].tolist() == [[1, 2, 0]]


def test_bad_inputs_are_refused():
    q, c = torch.zeros(2, 3), torch.zeros(5, 3)
    with pytest.raises(ValueError, match="k must be a positive int"):
        exact_top_k(q, c, 0)
    with pytest.raises(ValueError, match=r"queries \[B, D\] and candidates \[N, D\]"):
        exact_top_k(q, torch.zeros(5, 4), 2)
    with pytest.raises(ValueError, match="chunk_size"):
        exact_top_k(q, c, 2, chunk_size=0)
    with pytest.raises(ValueError, match=r"exclude must be \[B, E\] with B = 2"):
        exact_top_k(q, c, 2, exclude=torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="queries hold NaN"):
        exact_top_k(torch.full((2, 3), float("nan")), c, 2)
    with pytest.raises(ValueError, match=r"positions must be \[N\]"):
        exact_top_k(q, c, 2, positions=torch.arange(4))


def test_layer_ranks_its_candidates_and_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    items = rng.integers(-2, 3, (30, 4)).astype(np.float32)
    queries = rng.integers(-2, 3, (6, 4)).astype(np.float32)
    seen = np.array([[0, 3, -1]] * 6, dtype=np.float32)     # floats, as features give them
    query_input = keras.Input((4,), name="q")
    seen_input = keras.Input((3,), name="seen")
    layer = BruteForceTopK(5, num_candidates=30, chunk_size=7)
    model = keras.Model([query_input, seen_input], layer(query_input, exclude=seen_input))
    layer.set_candidates(items)
    _, expected = reference(queries, items, 5, seen.astype(np.int64))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model([queries, seen])), expected)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded([queries, seen])),
                                  expected)
    assert loaded.layers[-1].get_config()["num_candidates"] == 30
    with pytest.raises(ValueError, match=r"holds candidates of shape \(30, 4\)"):
        layer.set_candidates(items[:3])
    with pytest.raises(ValueError, match="num_candidates must be a positive int"):
        BruteForceTopK(5, num_candidates=0)
    with pytest.raises(ValueError, match="is not built"):
        BruteForceTopK(5, num_candidates=3).set_candidates(items[:3])
    assert rk.retrieval.BruteForceTopK is BruteForceTopK
