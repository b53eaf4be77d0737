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


def torchrun(worker, nproc, *args, timeout=240, env=None, check=True):
    """Runs ``workers/<worker>`` on ``nproc`` processes; returns the result."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    environment.pop("KERAS_BACKEND", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
               str(WORKERS / worker), *map(str, args)]
    if nproc == 1:          # plain process: the single-process code path
        command = [sys.executable, str(WORKERS / worker), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=environment)
    if check and result.returncode != 0:
        raise AssertionError(f"{worker} on {nproc} ranks failed:\n{result.stdout[-3000:]}"
                             f"\n{result.stderr[-6000:]}")
    return result
