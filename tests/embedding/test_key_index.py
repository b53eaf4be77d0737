"""The two key indexes of a physical table, and the `index` table option.

The reference is a dict of key -> row kept beside the table, and a table
with the other index: the same keys give the same rows' values.
"""

import keras
import numpy as np
import pytest
import torch

import reckeras as rk
from reckeras.backend_kernels import bucket_index
from reckeras.embedding import key_index as key_index_module
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan
from reckeras.embedding.physical_table import PhysicalTable
from reckeras.features.plan import TransformPlan


def grow(table, keys, chunk):
    mapping = {}
    for part in keys.split(chunk):
        rows = table.find_or_insert(part)
        for key, row in zip(part.tolist(), rows.tolist()):
            assert mapping.setdefault(key, row) == row
    return mapping


@pytest.mark.parametrize("index", ["hash", "compact"])
def test_a_table_of_each_index_keeps_every_key(index):
    table = PhysicalTable(dim=2, seed=3, index=index)
    keys = torch.randperm(20_000, generator=torch.Generator().manual_seed(1)) * 7919 - 10**12
    keys = torch.cat([keys, keys[:5000]])          # keys seen again
    mapping = grow(table, keys, 997)
    assert table.num_rows == 20_000
    assert sorted(mapping.values()) == list(range(20_000))
    assert torch.equal(table.keys[table.find(keys)], keys)
    assert bool((table.find(torch.arange(5) * 3 + 1) == -1).all())
    assert table.key_index.kind == index


def test_compact_and_hash_tables_hold_the_same_rows():
    keys = torch.randint(-2**62, 2**62, (6000,), generator=torch.Generator().manual_seed(2))
    tables = {index: PhysicalTable(dim=4, seed=9, index=index) for index in ("hash", "compact")}
    for table in tables.values():
        grow(table, keys, 500)
    exported = {index: table.export() for index, table in tables.items()}
    order = {index: np.argsort(e["keys"]) for index, e in exported.items()}
    for name in ("keys", "weights", "state"):
        np.testing.assert_array_equal(exported["hash"][name][order["hash"]],
                                      exported["compact"][name][order["compact"]])


def test_a_compact_index_takes_about_7_bytes_a_key(monkeypatch):
    monkeypatch.setattr(key_index_module, "RESERVE_FROM_BUCKETS", 64)
    table = PhysicalTable(dim=16, index="compact")
    grow(table, torch.arange(200_000) * 104729, 50_000)
    shape = table.key_index.arrays[2]
    index_bytes = table.memory_by_part()["index"]
    # Buckets of 128 bytes (25 slots) and the directory's entries in use:
    # past RESERVE_FROM_BUCKETS the arrays are in reserved memory, where
    # only those count.
    assert index_bytes == int(shape[0]) * 128 + 2 ** int(shape[1]) * 4
    assert 0.6 <= bucket_index.load(shape, 200_000) <= 1.0
    assert index_bytes / 200_000 < 10
    # The hash map: 16 bytes a slot at a load under 1/2.
    hashed = PhysicalTable(dim=16)
    grow(hashed, torch.arange(200_000) * 104729, 50_000)
    assert hashed.memory_by_part()["index"] / 200_000 >= 32


def test_a_large_compact_index_grows_in_reserved_memory_without_moving(monkeypatch):
    monkeypatch.setattr(key_index_module, "RESERVE_FROM_BUCKETS", 64)
    table = PhysicalTable(dim=2, index="compact")
    grow(table, torch.arange(4000) * 31, 1000)                # past 64 buckets
    buckets, directory = table.key_index.arrays[0], table.key_index.arrays[1]
    pointers = (buckets.data_ptr(), directory.data_ptr())
    mapping = grow(table, torch.arange(4000, 60_000) * 31, 4000)
    assert (table.key_index.arrays[0].data_ptr(),
            table.key_index.arrays[1].data_ptr()) == pointers
    shape = table.key_index.arrays[2]
    # Reserved memory counts the buckets and directory entries in use.
    assert table.memory_by_part()["index"] == int(shape[0]) * 128 + 2 ** int(shape[1]) * 4
    keys = torch.tensor(list(mapping))
    assert torch.equal(table.find(keys), torch.tensor(list(mapping.values())))


def test_load_and_compact_rebuild_a_compact_index():
    table = PhysicalTable(dim=2, seed=1, index="compact")
    grow(table, torch.arange(3000) * 13, 700)
    kept = table.compact(torch.arange(0, 3000, 3))
    assert table.key_index.kind == "compact" and table.num_rows == 1000
    assert torch.equal(table.find(torch.arange(0, 3000, 3) * 13), kept)
    assert bool((table.find(torch.arange(1, 3000, 3) * 13) == -1).all())
    other = PhysicalTable(dim=2, seed=1, index="compact")
    other.load(table.export())
    assert torch.equal(other.keys[other.find(torch.arange(0, 3000, 3) * 13)],
                       torch.arange(0, 3000, 3) * 13)


def test_the_index_option_is_checked_and_shared_by_a_physical_table():
    with pytest.raises(ValueError, match="TableOptions.index must be one of"):
        rk.embedding.TableOptions(index="btree")
    with pytest.raises(ValueError, match="must be one of"):
        PhysicalTable(dim=2, index="btree")
    plan = TransformPlan([rk.features.Categorical("a", dim=4),
                          rk.features.Categorical("b", dim=4)])
    packing = PackingPlan(plan.slots, plan.sparse_in_declaration_order, table_options={
        "a": rk.embedding.TableOptions(index="compact")})
    with pytest.raises(ValueError, match=r"need one key index.*'a': 'compact'"):
        EmbeddingEngine(packing, device="cpu")


def test_a_model_trains_the_same_with_either_index():
    data = rk.datasets.load("criteo_synth", split="train").to_table().slice(0, 2048)
    results = []
    for index in ("hash", "compact"):
        keras.utils.set_random_seed(0)
        columns = rk.layers.FeatureColumns(
            [rk.features.Numeric(f"I{i}", transform="log1p") for i in range(1, 4)]
            + [rk.features.Categorical(f"C{i}", dim=8) for i in range(1, 6)])
        inputs = columns.inputs()
        dense, sparse = columns(inputs)
        options = {f"C{i}": rk.embedding.TableOptions(index=index) for i in range(1, 6)}
        emb = rk.layers.ShardedEmbedding(columns, table_options=options)(sparse)
        x = rk.layers.MLP([8, 1], output_activation="sigmoid")(
            rk.layers.DotInteraction()([rk.layers.MLP([8])(dense), emb]))
        model = rk.Model(inputs, x)
        model.compile(optimizer="adam", loss="binary_crossentropy",
                      embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05))
        history = model.fit(data, batch_size=256, epochs=1, verbose=0)
        results.append((history.history["loss"], model.predict(data, verbose=0)))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5, atol=1e-6)
