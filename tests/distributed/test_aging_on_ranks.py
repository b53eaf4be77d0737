"""Aging out by windows on 2 ranks: the History's row counts are the sums
over the ranks and equal the hand count, the rows held are those of 1 rank,
a delta saved after aging out loads to the full checkpoint's state, and a
delta chain saved on 2 ranks after window 2 resumes on 1 rank to age out
window 3 as the run that never stopped."""

import json

import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes

HAND_COUNTS = [[18, 0, 18], [2, 0, 20], [2, 1, 21], [2, 5, 18]]   # test_aging.py's


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    results = {}
    for nproc in (1, 2):
        directory = tmp_path_factory.mktemp(f"ranks{nproc}")
        torchrun("aging.py", nproc, directory, directory / "out.json")
        results[nproc] = json.loads((directory / "out.json").read_text())
    torchrun("aging.py", 1, "resume", directory, directory / "resumed.json")
    results["resumed"] = json.loads((directory / "resumed.json").read_text())
    return results


@pytest.mark.parametrize("storage", ["device", "host_cached"])
def test_two_ranks_age_out_the_rows_of_one(runs, storage):
    single, double = runs[1][storage], runs[2][storage]
    assert single["counts"] == double["counts"] == HAND_COUNTS
    assert double["keys"] == single["keys"] and len(double["keys"]) == HAND_COUNTS[-1][2]
    assert single["delta_equals_full"] and double["delta_equals_full"]


@pytest.mark.parametrize("storage", ["device", "host_cached"])
def test_a_two_rank_checkpoint_resumes_on_one_rank_with_the_rows_ages(runs, storage):
    resumed, straight = runs["resumed"][storage], runs[2][storage]
    assert resumed["counts"] == straight["counts"][3:] == HAND_COUNTS[3:]
    assert resumed["keys"] == straight["keys"]
