"""DESIGN invariant 2: N ranks at batch b == 1 rank at batch N*b."""

import numpy as np
import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


def load(path):
    with np.load(path) as f:
        return dict(f)


LIFECYCLE = {"RK_TEST_LIFECYCLE": "1"}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    results = {}
    for name, env in (("plain", {}), ("lifecycle", LIFECYCLE)):
        path = tmp_path_factory.mktemp("ws") / f"single_{name}.npz"
        torchrun("train.py", 1, path, 2, env=env)
        results[name] = load(path)
    return results


@pytest.mark.parametrize("nproc, env", [
    (2, {}),
    (4, {}),
    (4, {"RECKERAS_RANKS_PER_NODE": "2"}),       # 2 simulated nodes: hierarchical
    (4, {"RECKERAS_RANKS_PER_NODE": "2", **LIFECYCLE}),   # admission + eviction
])
def test_same_weights_tables_and_state(single, tmp_path, nproc, env):
    path = tmp_path / f"n{nproc}.npz"
    torchrun("train.py", nproc, path, 2, env=env)
    multi = load(path)
    single = single["lifecycle" if env.get("RK_TEST_LIFECYCLE") else "plain"]
    assert set(multi) == set(single)
    for name in sorted(single):
        if name.startswith("keys"):
            np.testing.assert_array_equal(multi[name], single[name], err_msg=name)
        else:
            np.testing.assert_allclose(multi[name], single[name], rtol=2e-4, atol=2e-5,
                                       err_msg=name)
