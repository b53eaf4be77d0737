"""Packing: logical tables of equal dim merged into one physical table.

Planned once, when the embedding layer is built. Every slot (sparse feature)
gets its logical table's salt, its physical table, its combiner and its output
position; per batch these are looked up by slot index in small tensors.
"""

import torch

from reckeras.backend_kernels.hashing import mix64
from reckeras.features.specs import Sequence

COMBINER_CODES = {"sum": 0, "mean": 1, "sqrtn": 2}


def table_salt(table_name):
    """A 64-bit salt of a table name (stable across processes and runs)."""
    code = 0
    for byte in table_name.encode("utf-8"):          # build time only
        code = (code * 131 + byte) % (2**61 - 1)
    return int(mix64(torch.tensor(code, dtype=torch.int64)))


class PackingPlan:
    """Which physical table and output position each slot uses.

    Args:
        slots: sparse feature specs in slot order (see ``features.plan``).
        declaration_order: the same specs in the order the user declared them,
            which is the order of the output features.
    """

    def __init__(self, slots, declaration_order):
        self.slots = list(slots)
        self.dims = sorted({s.dim for s in self.slots})
        self.tables = {}
        for spec in self.slots:
            self.tables.setdefault(spec.table, spec.dim)
        slot_names = [s.name for s in self.slots]
        self.output_names = [s.name for s in declaration_order]
        self.slot_group = torch.tensor([self.dims.index(s.dim) for s in self.slots])
        self.slot_salt = torch.tensor([table_salt(s.table) for s in self.slots],
                                      dtype=torch.int64)
        self.slot_combiner = torch.tensor(
            [COMBINER_CODES[s.combiner] if isinstance(s, Sequence) else 0
             for s in self.slots])
        # Output position of each slot inside its group: declaration order.
        self.group_outputs = [[n for n in self.output_names
                               if self.slots[slot_names.index(n)].dim == dim]
                              for dim in self.dims]
        self.slot_position = torch.tensor(
            [self.group_outputs[self.dims.index(s.dim)].index(s.name)
             for s in self.slots])
        self.has_sequences = any(isinstance(s, Sequence) for s in self.slots)

    @property
    def num_slots(self):
        return len(self.slots)

    def to(self, device):
        for name in ("slot_group", "slot_salt", "slot_combiner", "slot_position"):
            setattr(self, name, getattr(self, name).to(device))
        return self
