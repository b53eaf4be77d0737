"""A peer that dies or hangs during the sparse-dist stage's key exchange (on
its stage thread, beside the running step) makes the survivor's fit raise
`PeerFailureError` naming that exchange, within the timeout (5 s), as the
step's own collectives do. Real processes: the peer kills itself (SIGKILL)
or sleeps past the timeout inside its key send of batch 3."""

import json

import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes

TIMEOUT_S = 5          # the workers' distributed.init(timeout_s=...)
MARGIN_S = 3           # a loaded 2-core machine


def run(mode, tmp_path):
    prefix = tmp_path / "report"
    result = torchrun("sparse_dist_faults.py", 2, mode, 3, prefix, check=False,
                      timeout=150)
    assert result.returncode != 0
    assert (tmp_path / "report0.json").exists(), result.stderr[-6000:]
    with open(f"{prefix}0.json") as f:
        survivor = json.load(f)
    with open(f"{prefix}1.json") as f:
        peer = json.load(f)
    assert survivor["error"] == "PeerFailureError", survivor
    detected_s = survivor["raised_at"] - peer["fault_at"]
    print(f"{mode}: detected after {detected_s:.2f} s")
    return survivor, detected_s


@pytest.mark.parametrize("mode, within_s", [
    ("kill", MARGIN_S),                 # closed sockets: at once
    ("hang", TIMEOUT_S + MARGIN_S),     # the exchange's timeout
])
def test_survivor_fails_naming_the_sparse_dist_exchange(tmp_path, mode, within_s):
    survivor, detected_s = run(mode, tmp_path)
    assert "rank 0 of 2: the sparse-dist stage's exchange of embedding ids did not " \
           "complete" in survivor["message"]
    # It reached the training loop's caller through the step waiting for
    # the batch's routes (`steps.forward` -> `functional.forward`).
    traceback = survivor["traceback"]
    assert "sparse_dist.py" in traceback and "steps.py" in traceback
    assert "functional.py" in traceback and ", in forward\n" in traceback
    assert detected_s < within_s
    if mode == "hang":
        # Rank 0 entered the exchange a second before rank 1 stopped in it.
        assert detected_s > TIMEOUT_S - 1 - MARGIN_S


def test_peer_killed_while_the_survivor_is_in_a_step_collective(tmp_path):
    # Killed at once: rank 0's main thread is still inside the step before
    # (its row or gradient exchange fails) or already waits for the routes.
    survivor, detected_s = run("kill_at_once", tmp_path)
    # (Keras prefixes errors raised inside a layer's call with the layer.)
    assert "rank 0 of 2: " in survivor["message"]
    assert "did not complete: a peer rank died" in survivor["message"]
    assert detected_s < MARGIN_S
