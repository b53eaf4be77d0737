"""The embedding engine on 2 ranks: routed lookups equal unrouted ones, and
deferred updates (the non-finite guard's engine side) equal immediate ones;
one rank's NaN gradient makes every rank discard and changes no rank's rows
(see workers/engine_steps.py for what each run checks)."""

import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


@pytest.mark.parametrize("mode, env", [
    ("device", {}),
    ("host_cached", {}),
    ("lifecycle", {}),
    ("host_cached", {"RECKERAS_RANKS_PER_NODE": "1"}),     # the hierarchical exchange
])
def test_engine_steps_on_two_ranks(mode, env):
    result = torchrun("engine_steps.py", 2, mode, env=env)
    assert result.stdout.count(": ok") == 2
