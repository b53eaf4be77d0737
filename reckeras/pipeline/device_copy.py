"""The h2d stage: a batch's tensors reach the GPU while earlier steps run.

On a CUDA device, `fit`/`evaluate`/`predict` encode batches into host
tensors and this stage copies them: each tensor is placed in pinned (page
locked) memory and copied with `non_blocking=True` on a CUDA stream of the
stage's own, so the copy of batch i+1 overlaps the kernels of step i instead
of queueing behind them. The features are then packed on that same stream
(`FeatureColumns.pack`: the fused transform kernels run on the device, beside
the step). The stage records an event; `ready`, called on the training thread
when it takes the batch, makes that thread's stream wait for the event (a
GPU-side wait: the host does not block) and tells the caching allocator that
the tensors are used on that stream (`record_stream`), so their memory is not
reused while the step still reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class _Copied:
    """A batch whose device tensors are ready once `event` has passed."""

    def __init__(self, batch, event, device):
        self.batch, self.event, self.device = batch, event, device


class DeviceCopy:
    """The pipeline stage that copies `stream.PreparedBatch` items to
    `device` (a CUDA device) and packs them there.

    Args:
        device: the CUDA device the step runs on.
        pack: fills a copied batch's `packed` (run on the copy stream).

    Example:

    ```python
    copy = DeviceCopy("cuda", pack)
    batch = ready(copy(encoded_batch))      # on the training thread
    ```
    """

    name = "h2d"

    def __init__(self, device: torch.device | str, pack: Callable):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"the h2d stage copies to a CUDA device, not {self.device}")
        self.pack = pack
        self.stream = torch.cuda.Stream(self.device)

    def __call__(self, batch) -> _Copied:
        def copy(tensor):
            return tensor.pin_memory().to(self.device, non_blocking=True)

        with torch.cuda.stream(self.stream):
            batch.inputs = {name: copy(t) for name, t in batch.inputs.items()}
            batch.labels = None if batch.labels is None else copy(batch.labels)
            batch.weights = None if batch.weights is None else copy(batch.weights)
            self.pack(batch)
            event = torch.cuda.Event()
            event.record(self.stream)
        return _Copied(batch, event, self.device)


def wait_for_copy(item: Any) -> Any:
    """The batch of `item`, safe to use on this (stage) thread's current
    stream; the item itself travels on unchanged to `ready`.

    Args:
        item: what the h2d stage (or, on a CPU, the encode stage) produced.

    Returns:
        The `PreparedBatch`.
    """
    if not isinstance(item, _Copied):
        return item
    torch.cuda.current_stream(item.device).wait_event(item.event)
    return item.batch


def ready(item: Any) -> Any:
    """The batch of `item`, safe to use on the training thread's current
    stream (items that no h2d stage copied pass unchanged).

    Args:
        item: what the last host stage produced.

    Returns:
        The `PreparedBatch`.
    """
    if not isinstance(item, _Copied):
        return item
    stream = torch.cuda.current_stream(item.device)
    stream.wait_event(item.event)
    for tensor in item.batch.tensors():
        tensor.record_stream(stream)
    return item.batch
