"""host_cached tables on 2 ranks: each rank caches the rows it owns, and
training gives the same weights, tables and optimizer state as without cache."""

import json

import numpy as np
import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


def load(path):
    with np.load(path) as f:
        return dict(f)


@pytest.mark.parametrize("env", [
    {"RK_TEST_CACHE": "lfu"},
    {"RK_TEST_CACHE": "lru", "RK_TEST_LIFECYCLE": "1",
     "RECKERAS_RANKS_PER_NODE": "1"},              # hierarchical exchange, lifecycle
])
def test_cached_equals_uncached_on_two_ranks(tmp_path, env):
    plain_env = {k: v for k, v in env.items() if k != "RK_TEST_CACHE"}
    torchrun("train.py", 2, tmp_path / "plain.npz", 2, env=plain_env)
    torchrun("train.py", 2, tmp_path / "cached.npz", 2, env=env)
    plain, cached = load(tmp_path / "plain.npz"), load(tmp_path / "cached.npz")
    assert set(plain) == set(cached)
    for name in sorted(plain):
        np.testing.assert_array_equal(cached[name], plain[name], err_msg=name)
    with open(tmp_path / "cached.npz.cache.json") as f:
        per_rank = next(iter(json.load(f).values()))["per_rank"]
    for rank in per_rank:
        (table,) = rank["tables"]
        cache = table["cache"]
        assert cache["cache_rows"] == 90 and cache["cached_rows"] <= 90
        assert table["rows"] > 90                   # more rows than the cache holds
        assert cache["rows_out"] > 0 and 0 < cache["hit_rate"] < 1
        assert cache["prefetches"] > 0 and cache["rows_in_prefetched"] > 0
