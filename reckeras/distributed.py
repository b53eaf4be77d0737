"""Process-group setup for multi-process training (torchrun).

A script written for one process runs unchanged under
`torchrun --nproc_per_node=N`: the first time reckeras needs the world
(building the embedding engine's routes, or `fit`), it joins the process
group that torchrun's environment describes (NCCL on GPU hosts, gloo on CPU).
Call `init` first to choose the timeout or the node layout.

Every collective carries the timeout: a rank that dies or hangs makes the
others raise `torch.distributed.DistBackendError` (a RuntimeError) after
`timeout_s` seconds instead of hanging; reckeras's own collectives raise
`PeerFailureError`, saying what they were doing.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from reckeras import config

DEFAULT_TIMEOUT_S = config.Options.timeout_s


class PeerFailureError(RuntimeError):
    """A collective failed: a peer rank died, hung past the timeout, or left.

    The message names the rank, what it was doing and the underlying error
    (chained as `__cause__`).

    Example:

    ```python
    try:
        with rk.distributed.collective("averaging dense gradients"):
            raise RuntimeError("Connection closed by peer")   # as gloo raises
    except rk.distributed.PeerFailureError as error:
        print(error)   # rank 0 of 1: averaging dense gradients did not complete: ...
    ```
    """


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place among the training processes.

    Made by `init`; `world()` returns the current one.

    Args:
        rank: this process's rank, in `[0, size)`.
        size: the number of processes.
        ranks_per_node: the number of ranks on each node.
        hierarchical: whether exchanges go intra-node, then inter-node.
        timeout_s: seconds before a collective that a peer never joins fails.

    Example:

    ```python
    world = rk.distributed.world()
    if world.is_main:
        print(f"training on {world.size} rank(s)")
    ```
    """

    rank: int = 0
    size: int = 1
    ranks_per_node: int = 1
    hierarchical: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the one that logs and writes files)."""
        return self.rank == 0



_world = None


def init(timeout_s: float | None = None, ranks_per_node: int | None = None,
         hierarchical: bool | None = None, backend: str | None = None) -> World:
    """Joins the process group described by torchrun's environment.

    In a single process (`WORLD_SIZE` unset or 1) it joins nothing and
    returns a world of size 1. Calling it again replaces the current world.

    Args:
        timeout_s: seconds before a collective that a peer never joins fails
            (default `RECKERAS_TIMEOUT_S` or 300).
        ranks_per_node: ranks per node (default `RECKERAS_RANKS_PER_NODE`,
            else torchrun's `LOCAL_WORLD_SIZE`); set it below the world size
            on one machine to simulate several nodes.
        hierarchical: use the hierarchical (intra-node, then inter-node)
            exchange; default: when there is more than one node.
        backend: `"gloo"` or `"nccl"`; default NCCL when CUDA is available.

    Returns:
        The `World`.

    Raises:
        ValueError: when `ranks_per_node` does not divide the world size.

    Example:

    ```python
    world = rk.distributed.init(timeout_s=120)
    world.rank, world.size   # (0, 1) in a single process
    ```
    """
    global _world
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if timeout_s is None:
        timeout_s = config.options().timeout_s
    if size > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        atexit.register(_leave_process_group)
    if dist.is_initialized():
        size, rank = dist.get_world_size(), dist.get_rank()
    else:
        rank = 0
    if ranks_per_node is None:
        ranks_per_node = config.options().ranks_per_node or int(
            os.environ.get("LOCAL_WORLD_SIZE", size))
    if ranks_per_node < 1 or size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} must divide the world "
                         f"size {size}")
    if hierarchical is None:
        hierarchical = ranks_per_node < size
    _world = World(rank, size, ranks_per_node, bool(hierarchical), float(timeout_s))
    return _world


def _leave_process_group() -> None:
    """Destroys the process group `init` created, at exit.

    It runs while the interpreter is still whole: gloo's worker threads can
    still hold tensors of finished collectives, and freeing them during
    interpreter finalization aborts the process ("terminate called without
    an active exception").
    """
    if dist.is_initialized():
        dist.destroy_process_group()


def world() -> World:
    """The current `World`, joining the process group on first use.

    Returns:
        The `World` of the last `init`, or of an `init()` with the default
        arguments when there was none.

    Example:

    ```python
    rank = rk.distributed.world().rank
    ```
    """
    return _world if _world is not None else init()


@contextlib.contextmanager
def collective(what: str) -> Iterator[None]:
    """Turns a failed collective into a `PeerFailureError` saying what happened.

    A context manager: a `RuntimeError` raised inside it (gloo and NCCL
    timeouts, closed peers) becomes a `PeerFailureError` naming this rank
    and `what`.

    Args:
        what: what the collective does, for the message (e.g. "averaging
            dense gradients").

    Example:

    ```python
    import torch.distributed as dist

    counts = torch.tensor([4096])
    with rk.distributed.collective("summing the example counts"):
        if rk.distributed.world().size > 1:
            dist.all_reduce(counts)
    ```
    """
    try:
        yield
    except RuntimeError as error:        # gloo/NCCL timeouts and closed peers
        current = world()
        raise PeerFailureError(
            f"rank {current.rank} of {current.size}: {what} did not complete: a peer "
            f"rank died, hung for more than {current.timeout_s:g} s or left "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]})") from error


def barrier(what: str) -> None:
    """Waits until every rank reaches this point (nothing to do on one rank).

    Args:
        what: what the ranks wait for, for a `PeerFailureError`'s message.

    Raises:
        PeerFailureError: a peer died or hung past the timeout.

    Example:

    ```python
    rk.distributed.barrier("every rank's table files are written")
    ```
    """
    if world().size > 1:
        with collective(what):
            dist.barrier()


def all_reduce_mean_(tensors: list[torch.Tensor]) -> None:
    """Averages a list of tensors across ranks in place, in one collective.

    Every rank must call it with tensors of the same shapes; in one process
    it does nothing.

    Args:
        tensors: the tensors to average (e.g. the dense gradients).

    Raises:
        PeerFailureError: when a peer does not take part.

    Example:

    ```python
    grads = [torch.ones(3), torch.zeros(2, 2)]
    rk.distributed.all_reduce_mean_(grads)   # the mean over the ranks
    ```
    """
    if world().size == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    with collective("averaging dense gradients"):
        dist.all_reduce(flat)
    flat /= world().size
    start = 0
    for t in tensors:
        t.copy_(flat[start:start + t.numel()].view_as(t))
        start += t.numel()


def check_same_on_all_ranks(description: str, value: str) -> None:
    """Raises if `value` differs between ranks, naming them.

    Every rank must call it; in one process it does nothing.

    Args:
        description: what `value` describes, for the message.
        value: a string that must be equal on every rank (e.g. a plan's
            fingerprint).

    Raises:
        RuntimeError: when some rank's value differs from rank 0's.
        PeerFailureError: when a peer does not take part.

    Example:

    ```python
    specs = [rk.features.Numeric("I1"), rk.features.Categorical("C1", dim=16)]
    rk.distributed.check_same_on_all_ranks("the feature specs", repr(specs))
    ```
    """
    if world().size == 1:
        return
    values = [None] * world().size
    with collective(f"comparing {description}"):
        dist.all_gather_object(values, value)
    differing = [r for r, v in enumerate(values) if v != values[0]]
    if differing:
        raise RuntimeError(f"{description} differs across ranks: rank 0 has "
                           f"{values[0]!r}, rank(s) {differing} have "
                           f"{[values[r] for r in differing]!r}")
