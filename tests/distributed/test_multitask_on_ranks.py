"""Per-output metrics (AUC, GAUC) and losses of a two-output model are the
same on 2 ranks at batch b as on 1 rank at batch 2b (exact metrics across
ranks; DESIGN invariant 2)."""

import json

import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


def run(tmp_path, nproc):
    path = tmp_path / f"multitask{nproc}.json"
    torchrun("multitask.py", nproc, path)
    return json.loads(path.read_text())


def test_two_ranks_equal_one(tmp_path):
    single, double = run(tmp_path, 1), run(tmp_path, 2)
    assert set(single["history"]) == set(double["history"]) >= {
        "loss", "click_auc", "conv_auc", "conv_gauc"}
    for name, values in single["history"].items():
        assert double["history"][name] == pytest.approx(values, rel=2e-4, abs=2e-5), name
    for name, value in single["evaluate"].items():
        assert double["evaluate"][name] == pytest.approx(value, rel=2e-4, abs=2e-5), name
