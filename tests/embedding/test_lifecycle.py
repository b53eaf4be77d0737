"""Admission and eviction of rows."""

import dataclasses

import pytest
import torch

import reckeras as rk
from reckeras.backend_kernels.hashing import mix64
from reckeras.embedding.engine import EmbeddingEngine
from reckeras.embedding.packing import PackingPlan, table_salt
from reckeras.features.plan import TransformPlan


def make(options, optimizer=None):
    specs = [rk.features.Categorical("a", dim=2), rk.features.Categorical("b", dim=2)]
    plan = TransformPlan(specs)
    engine = EmbeddingEngine(PackingPlan(plan.slots, plan.sparse_in_declaration_order,
                                         options))
    engine.set_optimizer(optimizer or rk.optimizers.SGD(1.0))
    return plan, engine


def step(plan, engine, a, b, grad=1.0):
    packed = plan.packed_sparse({"a": torch.tensor(a), "b": torch.tensor(b)})
    (out, _), = engine.lookup(packed["ids"], packed["offsets"], training=True)
    out.backward(torch.full_like(out, grad))
    return out.detach()


def has_row(engine, table, raw_id):
    key = mix64(torch.tensor([raw_id])) ^ table_salt(table)
    return bool(engine.tables[0].index.find(key)[0] >= 0)


def test_a_training_lookup_without_tags_is_a_clear_error():
    _, engine = make({"a": rk.embedding.TableOptions(admit_after=2)})
    store = engine.tables[0]
    with pytest.raises(ValueError, match=r"table \['a', 'b'\] .* needs the keys' tags"):
        store.resolve(torch.tensor([1, 2]), training=True)
    rows, _ = store.resolve(torch.tensor([1, 2]), training=False)    # inference: no tags
    assert rows.tolist() == [-1, -1]


def test_admission_after_k_sightings_reads_zeros_until_then():
    plan, engine = make({"a": rk.embedding.TableOptions(admit_after=3)},
                        rk.optimizers.Adagrad(0.1))
    out = step(plan, engine, [7, 7], [1, 1])      # one step, twice: counts once
    out = step(plan, engine, [7, 8], [1, 1])      # second step
    assert not has_row(engine, "a", 7) and has_row(engine, "b", 1)
    assert torch.equal(out[:, 0], torch.zeros(2, 2)) and out[:, 1].abs().sum() > 0
    assert engine.tables[0].num_rows == 1          # no update created or moved rows
    out = step(plan, engine, [7], [1])            # third step: admitted
    assert has_row(engine, "a", 7) and out[0, 0].abs().sum() > 0
    assert engine.tables[0].num_rows == 2


def test_idle_rows_are_evicted_and_slots_reused():
    options = rk.embedding.TableOptions(evict_idle_steps=2, evict_every=2)
    plan, engine = make({"a": options})
    step(plan, engine, [1, 2], [5, 5])            # step 1
    step(plan, engine, [1], [5])                  # step 2: eviction pass, none idle > 2
    assert has_row(engine, "a", 2)
    step(plan, engine, [1], [5])                  # step 3
    step(plan, engine, [1], [5])                  # step 4: id 2 idle for 3 steps
    assert not has_row(engine, "a", 2) and has_row(engine, "a", 1)
    assert has_row(engine, "b", 5)                 # table "b" has no eviction
    assert engine.tables[0].evicted == 1 and engine.tables[0].num_rows == 2
    key_a1 = mix64(torch.tensor([1])) ^ table_salt("a")
    table = engine.tables[0].index
    kept = table.weights[table.find(key_a1)].clone()
    step(plan, engine, [3], [5])                  # a new id takes the freed slot
    assert engine.tables[0].num_rows == 3
    assert torch.equal(table.weights[table.find(key_a1)], kept)


def test_rarely_hit_rows_are_evicted():
    options = rk.embedding.TableOptions(evict_min_hits=2, evict_every=2)
    plan, engine = make({"a": options})
    step(plan, engine, [1, 2], [5, 5])
    step(plan, engine, [1, 1], [5, 5])            # pass: id 2 hit once, id 1 three times
    assert has_row(engine, "a", 1) and not has_row(engine, "a", 2)


def test_options_validation():
    with pytest.raises(ValueError, match="unknown table\\(s\\) \\['zz'\\]"):
        make({"zz": rk.embedding.TableOptions(admit_after=2)})
    with pytest.raises(ValueError, match="admit_after"):
        rk.embedding.TableOptions(admit_after=0)
    with pytest.raises(ValueError, match="evict_idle_steps"):
        rk.embedding.TableOptions(evict_idle_steps=-3)


def row_of(engine, table, raw_id):
    key = mix64(torch.tensor([raw_id])) ^ table_salt(table)
    index = engine.tables[0].index
    row = index.find(key)[0]
    return index.weights[row].clone() if row >= 0 else None


def window(plan, engine, batches):
    """Trains one window on `batches` of (a ids, b ids); returns its counts."""
    engine.begin_window()
    for a, b in batches:
        step(plan, engine, a, b)
    return engine.end_window()


def test_rows_unseen_for_k_windows_age_out_and_come_back_fresh():
    plan, engine = make({"a": rk.embedding.TableOptions(evict_idle_windows=2)})
    # Window 0: a=1 (every window), a=2 (window 0 only), a=3 (windows 0 and 1).
    assert window(plan, engine, [([1, 2], [5, 5]), ([3], [6])]) == \
        {"rows_added": 5, "rows_evicted": 0, "rows_kept": 5}
    assert window(plan, engine, [([1, 3], [5, 5])]) == \
        {"rows_added": 0, "rows_evicted": 0, "rows_kept": 5}
    # End of window 2: a=2 was not trained in windows 1 and 2; b has no aging.
    assert window(plan, engine, [([1, 4], [5, 5])]) == \
        {"rows_added": 1, "rows_evicted": 1, "rows_kept": 5}
    assert row_of(engine, "a", 2) is None and row_of(engine, "a", 3) is not None
    assert row_of(engine, "b", 6) is not None
    # Window 3: a=3 was last trained in window 1: gone; a=1 and a=4 stay.
    assert window(plan, engine, [([1, 4], [5, 5])]) == \
        {"rows_added": 0, "rows_evicted": 1, "rows_kept": 4}
    assert row_of(engine, "a", 3) is None
    assert row_of(engine, "a", 1) is not None and row_of(engine, "a", 4) is not None
    # An aged-out id reads zeros, and training gives it a fresh row at the
    # initial value a new engine gives the same id.
    packed = plan.packed_sparse({"a": torch.tensor([2]), "b": torch.tensor([5])})
    (out, _), = engine.lookup(packed["ids"], packed["offsets"], training=False)
    assert torch.equal(out[0, 0], torch.zeros(2))
    step(plan, engine, [2], [5], grad=0.0)
    fresh_plan, fresh = make({})
    step(fresh_plan, fresh, [2], [5], grad=0.0)
    assert torch.equal(row_of(engine, "a", 2), row_of(fresh, "a", 2))


def test_loaded_rows_count_as_trained_in_the_window_they_were_loaded_in():
    plan, engine = make({"a": rk.embedding.TableOptions(evict_idle_windows=1)})
    window(plan, engine, [([1, 2], [5, 5])])
    snapshot = engine.table_states()
    window(plan, engine, [([1], [5])])                  # a=2 ages out
    assert row_of(engine, "a", 2) is None
    # A state with its windows puts the rows' ages back: a=2 ages out again.
    engine.load_table_states(snapshot)
    assert [state.window for state in snapshot] == [1]        # one window ended
    assert window(plan, engine, [([1], [5])])["rows_evicted"] == 1
    # A state without them (a model.save of before windows were saved):
    # its rows count as trained in the window they are loaded in.
    engine.load_table_states([dataclasses.replace(state, last_window=None, window=None)
                              for state in snapshot])         # before window 3
    assert window(plan, engine, [([1], [5])])["rows_evicted"] == 0
    assert row_of(engine, "a", 2) is not None           # K=1: loaded in window 2
    assert window(plan, engine, [([1], [5])])["rows_evicted"] == 1
    assert row_of(engine, "a", 2) is None


def test_window_options_validation():
    with pytest.raises(ValueError, match="TableOptions.evict_idle_windows must be None or "
                                         "an int >= 1, got 0"):
        rk.embedding.TableOptions(evict_idle_windows=0)
    with pytest.raises(ValueError, match="evict_idle_windows"):
        rk.embedding.TableOptions(evict_idle_windows=1.5)
    _, engine = make({"a": rk.embedding.TableOptions(evict_idle_windows=1)})
    with pytest.raises(RuntimeError, match="end_window\\(\\) without begin_window"):
        engine.end_window()
