import numpy as np
import pytest
import torch

from reckeras.backend_kernels.hashing import initial_rows
from reckeras.embedding.table import PhysicalTable


def test_rows_created_on_first_sight_and_stable():
    table = PhysicalTable(dim=3, init_scale=0.1, seed=7)
    keys = torch.tensor([10, 20, 10, -(2**63), 2**63 - 1])
    rows = table.find_or_insert(keys)
    assert table.num_rows == 4
    assert rows[0] == rows[2] and len(set(rows.tolist())) == 4
    assert sorted(set(rows.tolist())) == [0, 1, 2, 3]
    again = table.find_or_insert(torch.tensor([2**63 - 1, 20, 30]))
    assert again[:2].tolist() == [rows[4].item(), rows[1].item()]
    assert table.num_rows == 5
    assert table.find(torch.tensor([10, 99])).tolist() == [rows[0].item(), -1]


def test_growth_without_bound_keeps_mapping():
    table = PhysicalTable(dim=2)
    keys = torch.randperm(50_000) * 7919 - 10**9
    rows = table.find_or_insert(keys)
    assert table.num_rows == 50_000
    assert torch.equal(table.find(keys), rows)
    assert torch.equal(table.keys[rows], keys)
    assert table.slot_keys.numel() >= 100_000


def test_initial_rows_depend_on_key_and_seed_only():
    table_a, table_b = PhysicalTable(4, 0.05, seed=1), PhysicalTable(4, 0.05, seed=1)
    table_a.find_or_insert(torch.tensor([1, 2, 3]))
    table_b.find_or_insert(torch.tensor([3, 9, 2, 1]))
    rows_a = table_a.find(torch.tensor([1, 2, 3]))
    rows_b = table_b.find(torch.tensor([1, 2, 3]))
    assert torch.equal(table_a.weights[rows_a], table_b.weights[rows_b])
    values = initial_rows(torch.arange(10_000), 8, 0.05, 1)
    assert values.abs().max() <= 0.05 and abs(values.mean()) < 0.002
    assert not torch.equal(values, initial_rows(torch.arange(10_000), 8, 0.05, 2))


def test_export_load_round_trip():
    table = PhysicalTable(dim=3)
    table.configure_state(1, 0.5)
    table.find_or_insert(torch.tensor([5, 6, 7]))
    table.state[:3, 0] = torch.tensor([1.0, 2.0, 3.0])
    exported = table.export()
    other = PhysicalTable(dim=3)
    other.load(exported)
    other.configure_state(1, 0.5)          # keeps the loaded state
    rows = other.find(torch.tensor([7, 6, 5]))
    np.testing.assert_array_equal(other.weights[rows].numpy(), exported["weights"][::-1])
    np.testing.assert_array_equal(other.state[rows, 0].numpy(), [3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="dim 4"):
        PhysicalTable(dim=4).load(exported)
