"""Process-group setup for multi-process training (torchrun).

A script written for one process runs unchanged under
``torchrun --nproc_per_node=N``: the first time reckeras needs the world
(building the embedding engine's routes, or ``fit``), it joins the process
group that torchrun's environment describes (NCCL on GPU hosts, gloo on CPU).
Call :func:`init` first to choose the timeout or the node layout.

Every collective carries the timeout: a rank that dies or hangs makes the
others raise ``torch.distributed.DistBackendError`` (a RuntimeError) after
``timeout_s`` seconds instead of hanging.
"""

import atexit
import contextlib
import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 300.0


class PeerFailureError(RuntimeError):
    """A collective failed: a peer rank died, hung past the timeout, or left."""


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    ranks_per_node: int = 1
    hierarchical: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def is_main(self):
        return self.rank == 0



_world = None


def init(timeout_s=None, ranks_per_node=None, hierarchical=None, backend=None):
    """Joins the process group described by torchrun's environment.

    Args:
        timeout_s: seconds before a collective that a peer never joins fails
            (default ``RECKERAS_TIMEOUT_S`` or 300).
        ranks_per_node: ranks per node (default ``RECKERAS_RANKS_PER_NODE``,
            else torchrun's ``LOCAL_WORLD_SIZE``); set it below the world size
            on one machine to simulate several nodes.
        hierarchical: use the hierarchical (intra-node, then inter-node)
            exchange; default: when there is more than one node.
        backend: ``"gloo"`` or ``"nccl"``; default NCCL when CUDA is available.

    Returns:
        The :class:`World`.

    Example:
        >>> world = rk.distributed.init(timeout_s=120, ranks_per_node=2)
        >>> world.rank, world.size
    """
    global _world
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if timeout_s is None:
        timeout_s = float(os.environ.get("RECKERAS_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    if size > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        atexit.register(_leave_process_group)
    if dist.is_initialized():
        size, rank = dist.get_world_size(), dist.get_rank()
    else:
        rank = 0
    if ranks_per_node is None:
        ranks_per_node = int(os.environ.get("RECKERAS_RANKS_PER_NODE",
                                            os.environ.get("LOCAL_WORLD_SIZE", size)))
    if ranks_per_node < 1 or size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} must divide the world "
                         f"size {size}")
    if hierarchical is None:
        hierarchical = ranks_per_node < size
    _world = World(rank, size, ranks_per_node, bool(hierarchical), float(timeout_s))
    return _world


def _leave_process_group():
    """Destroys the process group ``init`` created, at exit, while the
    interpreter is still whole: gloo's worker threads can still hold tensors
    of finished collectives, and freeing them during interpreter finalization
    aborts the process ("terminate called without an active exception")."""
    if dist.is_initialized():
        dist.destroy_process_group()


def world():
    """The current :class:`World`, joining the process group on first use."""
    return _world if _world is not None else init()


@contextlib.contextmanager
def collective(what):
    """Turns a failed collective into a PeerFailureError saying what happened."""
    try:
        yield
    except RuntimeError as error:        # gloo/NCCL timeouts and closed peers
        current = world()
        raise PeerFailureError(
            f"rank {current.rank} of {current.size}: {what} did not complete: a peer "
            f"rank died, hung for more than {current.timeout_s:g} s or left "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]})") from error


def all_reduce_mean_(tensors):
    """Averages a list of tensors across ranks in place, in one collective."""
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


def check_same_on_all_ranks(description, value):
    """Raises if ``value`` (a string) differs between ranks, naming them."""
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
