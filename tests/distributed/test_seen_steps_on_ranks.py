"""Per-row sighting counts on 2 ranks: each key's count is the number of
global steps whose examples hold it (counted here from the data), and a full
checkpoint and a delta chain saved on 2 ranks load on 1 with the same counts."""

import json

import numpy as np
import pytest
import torch

from launch import torchrun
from reckeras.backend_kernels.hashing import mix64
from reckeras.embedding.packing import table_salt
from workers import common

pytestmark = pytest.mark.slow  # spawns torchrun processes

STEPS = len(common.data()) // common.GLOBAL_BATCH


def hand_counts(seeds):
    """{key: steps} of the Categorical features a (table "a"), b and c
    (table "shared"), one count per global batch that holds the key."""
    counts = {}
    for seed in seeds:
        table = common.data(seed=seed)
        for step in range(STEPS):
            rows = slice(step * common.GLOBAL_BATCH, (step + 1) * common.GLOBAL_BATCH)
            keys = set()
            for column, name in (("a", "a"), ("b", "shared"), ("c", "shared")):
                ids = torch.from_numpy(np.asarray(table[column])[rows].astype(np.int64))
                keys |= set((mix64(ids) ^ table_salt(name)).tolist())
            for k in keys:
                counts[k] = counts.get(k, 0) + 1
    return counts


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("counts")
    torchrun("seen_steps.py", 2, "save", root)
    return root


def trained(saved, checkpoint):
    """{key: seen_steps} of the 2-rank model when it saved `checkpoint`."""
    counts = json.loads((saved / "trained.json").read_text())[checkpoint]
    return {int(k): v for k, v in counts.items()}


@pytest.mark.parametrize("checkpoint, seeds", [("full", [0]), ("delta", [0, 1])])
def test_two_ranks_count_each_key_once_per_global_step(saved, checkpoint, seeds):
    expected, counts = hand_counts(seeds), trained(saved, checkpoint)
    assert {k: counts[k] for k in expected} == expected
    assert max(expected.values()) == len(seeds) * STEPS and min(expected.values()) == 1


@pytest.mark.parametrize("checkpoint", ["full", "delta"])
def test_counts_saved_on_two_ranks_load_on_one(saved, checkpoint, tmp_path):
    torchrun("seen_steps.py", 1, "load", saved / checkpoint, tmp_path / "out.json")
    loaded = json.loads((tmp_path / "out.json").read_text())
    assert {int(k): v for k, v in loaded.items()} == trained(saved, checkpoint)
