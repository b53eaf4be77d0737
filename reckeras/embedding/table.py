"""A physical embedding table: a dynamic hash index plus row storage.

Several logical tables of one dim are packed into one physical table (see
``packing``); their keys are salted so they never share a row. Storage grows
without bound: the index is rehashed to keep its load under one half, and the
row arrays double when full. A new row's initial value is a function of its
key and the table's seed only, so it is the same whatever the batch order or
the rank that creates it.

A table may sit behind a device cache (``cache.RowCache``, storage
``"host_cached"``): the cache then holds the newest value of the rows it
caches, so ``sync`` writes those back before anything reads the rows here in
bulk (export, lifecycle compaction), and ``load`` empties the cache.
"""

import numpy as np
import torch

from reckeras.backend_kernels import hash_table
from reckeras.backend_kernels.hashing import initial_rows


def available_host_bytes():
    """Host memory the kernel reports available (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PhysicalTable:
    """Rows of one dim, found by int64 key.

    Args:
        dim: row width.
        init_scale: new rows are uniform in ``[-init_scale, init_scale]``.
        seed: seed of the initial values.
        device: torch device of the storage.
        name: how errors name the table (its logical tables).
        pin_memory: allocate rows and state in pinned host memory (a host
            tier copied to and from a GPU cache).
    """

    def __init__(self, dim, init_scale=0.05, seed=0, device=None, name=None,
                 pin_memory=False):
        self.dim = dim
        self.init_scale = init_scale
        self.seed = seed
        self.device = torch.device(device or "cpu")
        self.name = name or f"dim {dim}"
        self.pin_memory = pin_memory
        self.cache = None            # a RowCache holding some rows' newest values
        self.slot_keys, self.slot_rows = hash_table.new_slots(16, self.device)
        self.num_rows = 0
        self.keys = torch.empty(1, dtype=torch.int64, device=self.device)
        self.weights = torch.zeros(1, dim, device=self.device)
        self.state = torch.zeros(1, 0, device=self.device)
        self.state_init = 0.0

    def configure_state(self, width, initial_value):
        """Sets the per-row optimizer state layout.

        State already of this width (for example loaded from a checkpoint) is
        kept; otherwise every row starts at ``initial_value``.
        """
        if self.state.shape[1] != width:
            self.state = self._rows_storage(self.weights.shape[0], width, initial_value)
        self.state_init = initial_value

    def _reserve(self, extra_keys):
        needed = self.num_rows + extra_keys
        if needed > self.slot_keys.numel() * hash_table.MAX_LOAD:
            self.slot_keys, self.slot_rows = hash_table.rehash(
                self.slot_keys, self.slot_rows, hash_table.capacity_for(needed))

    def _rows_storage(self, rows, width, fill):
        """A ``[rows, width]`` float32 array filled with ``fill`` (left
        uninitialized when ``fill`` is None), or MemoryError naming the table."""
        size = rows * width * 4
        available = available_host_bytes() if self.device.type == "cpu" else None
        # Refuse before the kernel's OOM killer would end the process silently.
        if available is not None and size > available:
            raise MemoryError(f"embedding table {self.name}: {rows} rows of width "
                              f"{width} need {size} bytes, host memory has {available} "
                              f"bytes available")
        try:
            if fill is None:
                return torch.empty((rows, width), device=self.device,
                                   pin_memory=self.pin_memory)
            return torch.full((rows, width), fill, device=self.device,
                              pin_memory=self.pin_memory)
        except (RuntimeError, MemoryError) as error:
            raise MemoryError(f"embedding table {self.name}: cannot allocate {size} "
                              f"bytes for {rows} rows of width {width}: {error}") from error

    def _grow_rows(self, needed):
        capacity = self.weights.shape[0]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity)
        # Rows past num_rows are written when they are created, so the new
        # capacity needs no initial fill (filling ~all of it again each time
        # the table doubles showed in the step time).
        weights = self._rows_storage(new_capacity, self.dim, None)
        weights[:self.num_rows] = self.weights[:self.num_rows]
        state = self._rows_storage(new_capacity, self.state.shape[1], None)
        state[:self.num_rows] = self.state[:self.num_rows]
        keys = torch.empty(new_capacity, dtype=torch.int64, device=self.device)
        keys[:self.num_rows] = self.keys[:self.num_rows]
        self.weights, self.state, self.keys = weights, state, keys

    def find_or_insert(self, keys):
        """Rows of ``keys``, creating (and initializing) rows for new keys."""
        # Look up first and insert only the absent ids: sizing the index for
        # them (not for the whole batch) keeps it small enough to stay in cache.
        rows = self.find(keys)
        absent = (rows < 0).nonzero().squeeze(1)
        if absent.numel() == 0:
            return rows
        new_keys = keys.index_select(0, absent)
        self._reserve(new_keys.numel())
        before = self.num_rows
        new_rows, after = hash_table.find_or_insert(self.slot_keys, self.slot_rows,
                                                    new_keys, before)
        rows.index_copy_(0, absent, new_rows)
        if after > before:
            self._grow_rows(after)
            # Every new row's key, from the absent ids that resolved to it (all
            # of them resolved to new rows: they were absent).
            created = torch.empty(after - before, dtype=torch.int64, device=self.device)
            created[new_rows - before] = new_keys
            self.keys[before:after] = created
            self.weights[before:after] = initial_rows(created, self.dim,
                                                      self.init_scale, self.seed)
            self.state[before:after] = self.state_init
            self.num_rows = after
        return rows

    def find(self, keys):
        """Rows of ``keys``; -1 where a key has no row. Creates nothing."""
        return hash_table.find(self.slot_keys, self.slot_rows, keys)

    def rows_of(self, keys, insert):
        return self.find_or_insert(keys) if insert else self.find(keys)

    # ---- checkpoints ---------------------------------------------------------

    def sync(self):
        """Makes this table's rows current (writes back its cache's dirty rows)."""
        if self.cache is not None:
            self.cache.write_back()

    def export(self):
        """``{"keys", "weights", "state"}`` numpy arrays of the live rows."""
        self.sync()
        n = self.num_rows
        return {"keys": self.keys[:n].cpu().numpy(),
                "weights": self.weights[:n].cpu().numpy(),
                "state": self.state[:n].cpu().numpy()}

    def load(self, arrays):
        """Replaces the content with exported arrays."""
        keys = torch.as_tensor(np.asarray(arrays["keys"]), dtype=torch.int64,
                               device=self.device)
        weights = torch.as_tensor(np.asarray(arrays["weights"]), device=self.device)
        state = torch.as_tensor(np.asarray(arrays["state"]), device=self.device)
        if weights.shape != (keys.numel(), self.dim):
            raise ValueError(f"table of dim {self.dim} cannot load weights of shape "
                             f"{tuple(weights.shape)} for {keys.numel()} keys")
        self.slot_keys, self.slot_rows = hash_table.new_slots(
            hash_table.capacity_for(keys.numel()), self.device)
        self.num_rows = 0
        self.weights = self._rows_storage(max(1, keys.numel()), self.dim, 0.0)
        self.keys = torch.empty(max(1, keys.numel()), dtype=torch.int64, device=self.device)
        width = state.shape[1] if state.ndim == 2 else self.state.shape[1]
        self.state = self._rows_storage(self.weights.shape[0], width, self.state_init)
        rows = self.find_or_insert(keys)
        self.weights[rows] = weights.float()
        if state.numel():
            self.state[rows] = state.float()
        if self.cache is not None:       # rows were renumbered: cached copies are void
            self.cache.clear()

    def memory_bytes(self):
        tensors = (self.slot_keys, self.slot_rows, self.keys, self.weights, self.state)
        return sum(t.numel() * t.element_size() for t in tensors)
