"""Table copies written in place by deltas (`reckeras.serving.table_copies`):
random sequences of deltas against a dict, compaction, and a predictor that
applies deltas without rebuilding its tables."""

import keras
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk
import reckeras.serving
from reckeras.embedding.packing import PackingPlan
from reckeras.embedding.table_state import TableState
from reckeras.features.plan import TransformPlan
from reckeras.serving.table_copies import COMPACT_AT, TableCopy, new_engine

DIM = 3
UNIVERSE = 80


def packing():
    plan = TransformPlan([rk.features.Categorical("a", dim=DIM)])
    return PackingPlan(plan.slots, plan.sparse_in_declaration_order)


def row(key, step):
    return [float(key), float(step), 1.0]


def read(copy, keys):
    """Each key's row, zeros where the table holds none (as a lookup reads)."""
    index = copy.layers[0][1].tables[0].index
    rows = index.find(torch.tensor(keys, dtype=torch.int64))
    values = index.weights[rows.clamp(min=0)].clone()
    values[rows < 0] = 0
    return values.numpy()


deltas = st.lists(st.tuples(st.sets(st.integers(0, UNIVERSE - 1), max_size=30),
                            st.sets(st.integers(0, UNIVERSE - 1), max_size=30)),
                  min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(initial=st.sets(st.integers(0, UNIVERSE - 1), max_size=40), deltas=deltas)
def test_a_copy_written_by_random_deltas_equals_a_dict(initial, deltas):
    plan = packing()
    layout = new_engine(plan).table_layouts()[0]
    keys = sorted(initial)
    state = TableState(layout, np.array(keys, dtype=np.int64),
                       np.array([row(k, 0) for k in keys], np.float32).reshape(-1, DIM),
                       np.zeros((len(keys), 0), np.float32))
    copy = TableCopy([(plan, new_engine(plan, [state]), "stack")])
    reference = {k: row(k, 0) for k in keys}
    for step, (written, removed) in enumerate(deltas, start=1):
        removed = removed - written          # an export never removes a key it writes
        written = sorted(written)
        copy.write([[(torch.tensor(written, dtype=torch.int64),
                      torch.tensor([row(k, step) for k in written]).reshape(-1, DIM),
                      torch.tensor(sorted(removed), dtype=torch.int64))]])
        reference.update({k: row(k, step) for k in written})
        for k in removed:
            reference.pop(k, None)
        if step % 2:
            copy.compact()
            store = copy.layers[0][1].tables[0]
            assert copy.dead_rows()[0][0] <= COMPACT_AT * store.num_rows
        expected = np.array([reference.get(k, [0.0] * DIM) for k in range(UNIVERSE)],
                            np.float32)
        np.testing.assert_array_equal(read(copy, list(range(UNIVERSE))), expected)
        store = copy.layers[0][1].tables[0]
        assert store.num_rows - copy.dead_rows()[0][0] == len(reference)


def test_compaction_keeps_the_live_rows_only():
    plan = packing()
    layout = new_engine(plan).table_layouts()[0]
    keys = np.arange(100, dtype=np.int64)
    state = TableState(layout, keys, np.ones((100, DIM), np.float32),
                       np.zeros((100, 0), np.float32))
    copy = TableCopy([(plan, new_engine(plan, [state]), "stack")])
    engine = copy.layers[0][1]
    copy.write([[(torch.zeros(0, dtype=torch.int64), torch.zeros(0, DIM),
                  torch.arange(25))]])
    copy.compact()                            # 25 dead of 100: not past COMPACT_AT
    assert copy.layers[0][1] is engine and copy.dead_rows() == [[25]]
    copy.write([[(torch.zeros(0, dtype=torch.int64), torch.zeros(0, DIM),
                  torch.arange(25, 26))]])
    copy.compact()                            # 26 of 100: rebuilt from the 74 live rows
    assert copy.layers[0][1] is not engine and copy.dead_rows() == [[0]]
    assert copy.layers[0][1].tables[0].num_rows == 74
    np.testing.assert_array_equal(read(copy, [0, 25, 26, 99]),
                                  [[0] * DIM, [0] * DIM, [1] * DIM, [1] * DIM])


def test_a_predictor_writes_deltas_into_the_tables_it_loaded(tmp_path):
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4)])
    model = rk.models.dlrm(columns, bottom_units=(8, 4), top_units=(8, 1))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    rng = np.random.default_rng(0)
    query = pa.table({"n": rng.normal(size=50).astype(np.float32),
                      "a": np.arange(-5, 45)})

    def train(ids):
        model.fit_windows([pa.table({"n": rng.normal(size=len(ids)).astype(np.float32),
                                     "a": ids, "label": (rng.random(len(ids)) < 0.5)
                                     .astype(np.float32)})], batch_size=8, verbose=0)
    train(np.arange(30))
    paths = [tmp_path / "v1"]
    model.export_serving(paths[0])
    predictor = reckeras.serving.load(paths[0])
    loaded = [engine for _, engine, _ in predictor.served.layers]
    for day, ids in enumerate([np.arange(20, 40), np.arange(35, 45)], start=2):
        train(ids)
        paths.append(tmp_path / f"v{day}")
        model.export_serving(paths[-1], base=paths[-2])
        predictor.apply_delta(paths[-1])
    # Two deltas later the version is served from the first copy again: the
    # very engines loaded, their tables written in place (not rebuilt).
    assert [engine for _, engine, _ in predictor.served.layers] == loaded
    full = reckeras.serving.load(model.export_serving(tmp_path / "full"))
    np.testing.assert_array_equal(predictor.predict(query), full.predict(query))


def test_a_write_that_fails_halfway_changes_no_served_row_and_is_redone(tmp_path,
                                                                        monkeypatch):
    # Two physical tables (dims 4 and 2): the standby copy's write fails for
    # real on the second table's insert, after the first table was written.
    keras.utils.set_random_seed(0)
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=4),
                                        rk.features.Categorical("b", dim=2)])
    inputs = columns.inputs()
    dense, sparse = columns(inputs)
    embedded = rk.layers.ShardedEmbedding(columns, output="concat")(sparse)
    joined = keras.layers.Concatenate()([dense, embedded])
    model = rk.Model(inputs, rk.layers.MLP([8, 1], output_activation="sigmoid")(joined))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    rng = np.random.default_rng(0)
    query = pa.table({"n": rng.normal(size=100).astype(np.float32),
                      "a": np.arange(-5, 95), "b": np.arange(100) % 7})

    def train(ids, b=None):
        model.fit_windows([pa.table({"n": rng.normal(size=len(ids)).astype(np.float32),
                                     "a": ids, "b": ids % 7 if b is None else b, "label": (
                                         rng.random(len(ids)) < 0.5).astype(np.float32)})],
                          batch_size=8, verbose=0)
    train(np.arange(30))
    model.export_serving(tmp_path / "v1")
    predictor = reckeras.serving.load(tmp_path / "v1")
    before = predictor.predict(query)
    train(np.arange(20, 60))
    model.export_serving(tmp_path / "v2", base=tmp_path / "v1")
    from reckeras.embedding.physical_table import PhysicalTable
    real = PhysicalTable.find_or_insert

    def fail_at(call):
        inserts = []

        def failing(self, keys, tags=None):
            inserts.append(len(keys))
            if len(inserts) == call:
                raise MemoryError("injected: no memory for the second table's rows")
            return real(self, keys, tags)
        monkeypatch.setattr(PhysicalTable, "find_or_insert", failing)

    # Calls 1 and 2 write the standby copy, 3 and 4 the copy served before.
    fail_at(2)
    with pytest.raises(MemoryError, match="injected"):
        predictor.apply_delta(tmp_path / "v2")
    monkeypatch.setattr(PhysicalTable, "find_or_insert", real)
    assert predictor.version == reckeras.serving.load(tmp_path / "v1").version
    np.testing.assert_array_equal(predictor.predict(query), before)
    predictor.apply_delta(tmp_path / "v2")           # applied again: exact
    np.testing.assert_allclose(predictor.predict(query), model.predict(query, verbose=0),
                               atol=1e-5, rtol=0)
    # After the swap: the version is served, the copy left half-written is
    # rebuilt before the next delta is written into it.
    train(np.arange(50, 90))
    model.export_serving(tmp_path / "v3", base=tmp_path / "v2")
    fail_at(4)
    predictor.apply_delta(tmp_path / "v3")
    monkeypatch.setattr(PhysicalTable, "find_or_insert", real)
    np.testing.assert_allclose(predictor.predict(query), model.predict(query, verbose=0),
                               atol=1e-5, rtol=0)
    train(np.arange(0, 100, 3), b=np.zeros(34, np.int64))   # b's other rows as in v3
    model.export_serving(tmp_path / "v4", base=tmp_path / "v3")
    predictor.apply_delta(tmp_path / "v4")           # into the rebuilt copy
    np.testing.assert_allclose(predictor.predict(query), model.predict(query, verbose=0),
                               atol=1e-5, rtol=0)
