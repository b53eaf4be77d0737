"""Runs a worker script under torchrun (gloo, CPU) for the distributed tests."""

import os
import socket
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(worker, nproc, *args, timeout=240, env=None, check=True, max_restarts=None):
    """Runs ``workers/<worker>`` on ``nproc`` processes; returns the result.

    With ``max_restarts``, torchrun restarts the whole group up to that many
    times when a rank fails (``--max-restarts``).
    """
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    environment.pop("KERAS_BACKEND", None)
    port = [f"--master_port={free_port()}"]
    if max_restarts is not None:
        # torchrun (torch 2.13) serves every attempt from the store of the
        # first, where the ranks' process-group keys are not per attempt: a
        # restarted rank can read the address its dead predecessor published
        # and wait for it until the timeout. Unshared, each attempt gets a
        # fresh store on a fresh port (see docs/distributed.md, Elastic resume).
        environment["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        port = [f"--max-restarts={max_restarts}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", *port, str(WORKERS / worker), *map(str, args)]
    if nproc == 1:          # plain process: the single-process code path
        command = [sys.executable, str(WORKERS / worker), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=environment)
    if check and result.returncode != 0:
        raise AssertionError(f"{worker} on {nproc} ranks failed:\n{result.stdout[-3000:]}"
                             f"\n{result.stderr[-6000:]}")
    return result
