"""Serving deltas written on 2 ranks: every rank's changed rows in the
delta, one version agreed by both, and applied in one process it gives the
predictor of a full export of the same state, bit for bit."""

import json

import numpy as np
import pytest

import reckeras.serving
from launch import torchrun
from reckeras.serving import artifact
from workers import common

pytestmark = pytest.mark.slow  # spawns torchrun processes


def test_a_delta_written_on_two_ranks_applies_in_one_process(tmp_path):
    torchrun("serving_deltas.py", 2, tmp_path)
    delta = json.loads((tmp_path / "v2" / artifact.MANIFEST).read_text())
    assert delta["world_size"] == 2 and delta["kind"] == "delta"
    assert delta["base"] == json.loads((tmp_path / "v1" / artifact.MANIFEST).read_text())[
        "version"]
    files = [name for table in delta["embedding_layers"][0]["tables"]
             for name in table["files"]]
    assert any(name.endswith(".r1.safetensors") for name in files)
    assert all(table["num_rows"] > 0 for table in delta["embedding_layers"][0]["tables"])
    predictor = reckeras.serving.load(tmp_path / "v1")
    assert predictor.apply_delta(tmp_path / "v2") == delta["version"]
    batch = common.data(seed=2)
    np.testing.assert_array_equal(predictor.predict(batch),
                                  reckeras.serving.load(tmp_path / "full").predict(batch))
