"""fit_windows on 2 ranks: every rank sees the same windows (or every rank
fails saying which differ), each window is evaluated with the weights of
before it on all ranks, and in-memory windows give 1 rank's figures."""

import json

import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes

DATES = ["2026-12-01", "2026-12-02", "2026-12-03"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    results = {}
    for nproc in (1, 2):
        directory = tmp_path_factory.mktemp(f"ranks{nproc}")
        torchrun("progressive.py", nproc, directory / "progressive", directory / "logs")
        results[nproc] = [json.loads((directory / f"progressive.rank{rank}.json").read_text())
                          for rank in range(nproc)]
    return results


def test_every_rank_gets_the_same_per_window_history(runs):
    first, second = runs[2]
    assert first["files"] == second["files"]
    assert first["memory"] == second["memory"]
    assert first["files"]["window"] == [f"dt={date}" for date in DATES]
    assert {"progressive_loss", "progressive_auc", "progressive_gauc", "loss",
            "auc"} <= set(first["files"])


def test_windows_on_two_ranks_match_one_rank(runs):
    single, double = runs[1][0], runs[2][0]
    # In memory, global batch k holds the same rows on 1 and 2 ranks.
    assert set(single["memory"]) == set(double["memory"])
    for name, values in single["memory"].items():
        if name != "window":
            assert double["memory"][name] == pytest.approx(values, rel=2e-4, abs=2e-5), name
    # From files, the ranks read contiguous shards (other batches than 1
    # rank's), but window 0 is evaluated before any step: with the same
    # (broadcast) weights on all the rows.
    for name in ("progressive_loss", "progressive_auc", "progressive_gauc"):
        assert double["files"][name][0] == pytest.approx(single["files"][name][0],
                                                         rel=2e-4, abs=2e-5), name


def test_ranks_with_other_windows_all_fail_naming_them(runs):
    assert runs[1][0]["mismatch"] is None
    for result in runs[2]:
        message = result["mismatch"]
        assert "the windows of fit_windows differs across ranks" in message
        assert "rank(s) [1]" in message and "dt=2026-12-03" in message
