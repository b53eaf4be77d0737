"""Elastic resume: a rank SIGKILLed mid-epoch under torchrun --max-restarts,
and a backup of 2 ranks resumed on 1, end as the run never interrupted."""

import json

import numpy as np
import pytest

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes

KILL_RANK, KILL_STEP = 1, 6      # before step 6 of epoch 1 (8 steps an epoch)
# Backups every 3 global steps: the last before the kill is after global
# step 12, i.e. 4 steps into epoch 1.
RESUMED_STEP = 4


def load(path):
    with np.load(path) as f:
        return dict(f)


def events(path):
    """`[(event, rank, attempt, epoch, step, time)]` of the worker's log."""
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(e, int(r), int(a), int(ep), int(s), float(t)) for e, r, a, ep, s, t in rows]


def run(tmp_path, nproc, kill_rank, kill_step, **kwargs):
    backup, out, log = tmp_path / "backup", tmp_path / "out.npz", tmp_path / "events.log"
    result = torchrun("elastic.py", nproc, backup, out, log, kill_rank, kill_step,
                      timeout=120, **kwargs)
    return result, backup, out, log


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    _, backup, out, _ = run(tmp_path_factory.mktemp("straight"), 2, -1, -1)
    assert not backup.exists()           # deleted when the fit ended
    return load(out)


def test_a_killed_rank_restarted_by_torchrun_resumes_mid_epoch(tmp_path, uninterrupted):
    _, backup, out, log = run(tmp_path, 2, KILL_RANK, KILL_STEP, max_restarts=1)
    found = events(log)
    kill = [e for e in found if e[0] == "kill"]
    assert [e[1:5] for e in kill] == [(KILL_RANK, 0, 1, KILL_STEP)]
    # The restarted attempt's first trained step, on both ranks, is the one
    # after the backup: nothing before it is trained again.
    resumed = [e for e in found if e[0] == "trained" and e[2] == 1]
    assert sorted(e[1:5] for e in resumed) == [(0, 1, 1, RESUMED_STEP),
                                              (1, 1, 1, RESUMED_STEP)]
    print(f"\nkill -> first step of the restarted job: "
          f"{max(e[5] for e in resumed) - kill[0][5]:.1f} s")
    # The same 2 ranks run the same float operations in the same order as the
    # uninterrupted run: weights, rows and optimizer state are equal bit for bit.
    got = load(out)
    assert set(got) == set(uninterrupted)
    for name in sorted(uninterrupted):
        np.testing.assert_array_equal(got[name], uninterrupted[name], err_msg=name)
    assert not backup.exists()


def test_a_backup_of_2_ranks_resumes_on_1(tmp_path, uninterrupted):
    result, backup, out, log = run(tmp_path, 2, KILL_RANK, KILL_STEP, max_restarts=0,
                                   check=False)
    assert result.returncode != 0
    record = json.loads((backup / "backup.json").read_text())
    assert (record["epoch"], record["step"], record["world_size"]) == (1, RESUMED_STEP, 2)
    run(tmp_path, 1, -1, -1)
    assert [e[3:5] for e in events(log) if e[0] == "trained"][-1] == (1, RESUMED_STEP)
    # After the resume one rank takes the mean loss of the whole global batch
    # where two ranks averaged the means of its halves: the same sums in
    # another order (measured: at most 1.2e-7 apart).
    got = load(out)
    assert set(got) == set(uninterrupted)
    for name in sorted(uninterrupted):
        if name.startswith("keys"):
            np.testing.assert_array_equal(got[name], uninterrupted[name], err_msg=name)
        else:
            np.testing.assert_allclose(got[name], uninterrupted[name], rtol=0, atol=1e-6,
                                       err_msg=name)
    assert not backup.exists()
