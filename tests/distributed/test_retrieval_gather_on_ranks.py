"""Cross-rank retrieval candidates: 2 ranks give 1 rank's loss and gradients."""

import numpy as np
import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


def load(path):
    with np.load(path) as f:
        return dict(f)


def test_gathered_candidates_are_world_size_invariant(tmp_path):
    torchrun("retrieval_gather.py", 1, tmp_path / "one")
    torchrun("retrieval_gather.py", 2, tmp_path / "two")
    one = load(f"{tmp_path / 'one'}.rank0.npz")
    ranks = [load(f"{tmp_path / 'two'}.rank{r}.npz") for r in range(2)]
    # Each rank's loss is its rows' mean against all 12 candidates; their
    # mean is the loss of the whole batch on one rank.
    np.testing.assert_allclose(np.mean([r["loss"] for r in ranks]), one["loss"], rtol=1e-6)
    for rank, part in enumerate(ranks):
        rows = slice(6 * rank, 6 * rank + 6)
        np.testing.assert_array_equal(part["gathered_ids"], one["gathered_ids"])
        # rk.Model averages gradients over the 2 ranks: half of each rank's
        # gradient is its slice of the one-rank gradient, the candidates'
        # (which every rank's loss reaches) included.
        np.testing.assert_allclose(part["query_grad"] / 2, one["query_grad"][rows],
                                   rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(part["candidate_grad"] / 2,
                                   one["candidate_grad"][rows], rtol=1e-5, atol=1e-7)
        assert part["uneven"].tolist() == [0, 1, 1]
        assert int(part["uneven_offset"]) == rank
