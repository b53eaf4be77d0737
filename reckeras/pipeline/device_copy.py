"""The h2d stage: a batch's tensors reach the GPU while earlier steps run.

On a CUDA device, ``fit``/``evaluate``/``predict`` encode batches into host
tensors and this stage copies them: each tensor is placed in pinned (page
locked) memory and copied with ``non_blocking=True`` on a CUDA stream of the
stage's own, so the copy of batch i+1 overlaps the kernels of step i instead
of queueing behind them. The copy records an event; ``ready``, called on the
training thread when it takes the batch, makes that thread's stream wait for
the event (a GPU-side wait: the host does not block) and tells the caching
allocator that the tensors are used on that stream (``record_stream``), so
their memory is not reused while the step still reads it.
"""

import torch


class _Copied:
    """A batch's device tensors and the event that marks their arrival."""

    def __init__(self, tensors, event, device):
        self.tensors, self.event, self.device = tensors, event, device


def _map_tensors(fn, batch):
    """``(inputs dict, labels or None, weights or None)`` with fn applied."""
    inputs, labels, weights = batch
    return ({name: fn(t) for name, t in inputs.items()},
            None if labels is None else fn(labels),
            None if weights is None else fn(weights))


class DeviceCopy:
    """The pipeline stage that copies ``(rows, (inputs, labels, weights))``
    items to ``device`` (a CUDA device).

    Args:
        device: the CUDA device the step runs on.

    Example:
        >>> copy = DeviceCopy("cuda")
        >>> rows, batch = ready(copy(encoded_item))    # on the training thread
    """

    name = "h2d"

    def __init__(self, device):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"the h2d stage copies to a CUDA device, not {self.device}")
        self.stream = torch.cuda.Stream(self.device)

    def __call__(self, item):
        rows, batch = item
        with torch.cuda.stream(self.stream):
            tensors = _map_tensors(
                lambda t: t.pin_memory().to(self.device, non_blocking=True), batch)
            event = torch.cuda.Event()
            event.record(self.stream)
        return rows, _Copied(tensors, event, self.device)


def ready(item):
    """The item with its device tensors, safe to use on this thread's
    current stream (items that no h2d stage copied pass unchanged)."""
    rows, batch = item
    if not isinstance(batch, _Copied):
        return item
    stream = torch.cuda.current_stream(batch.device)
    stream.wait_event(batch.event)
    _map_tensors(lambda t: t.record_stream(stream), batch.tensors)
    return rows, batch.tensors
