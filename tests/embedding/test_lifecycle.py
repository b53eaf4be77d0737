"""Admission and eviction of rows."""

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
