"""The epoch stream packs each batch once (FeatureColumns.pack) for all its
consumers: the cache-prefetch stage, the graph's FeatureColumns node and the
embedding lookup (the sparse-dist stage too: tests/distributed)."""

import runpy
import typing

import pytest

from reckeras.features.encode import as_tensors
from reckeras.features.plan import TransformPlan
from reckeras.pipeline import stream
from test_fit_cached import SMALL, build, synthetic


@pytest.fixture
def pack_calls(monkeypatch):
    calls = []
    original = TransformPlan.packed_sparse

    def counting(self, inputs):
        calls.append(next(iter(inputs.values())).shape[0])
        return original(self, inputs)

    monkeypatch.setattr(TransformPlan, "packed_sparse", counting)
    return calls


@pytest.mark.parametrize("pipeline", [True, False])
def test_each_batch_is_packed_once_with_a_cache_prefetch_stage(pack_calls, pipeline):
    model = build(SMALL)
    data = synthetic(1024)
    model.fit(data, batch_size=128, epochs=1, verbose=0, pipeline=pipeline)
    assert "cache_prefetch" in model.pipeline_stats
    assert len(pack_calls) == 8               # 1024 / 128 batches, one pack each
    del pack_calls[:]
    model.evaluate(data, batch_size=256, verbose=0)
    model.predict(data, batch_size=512)
    assert pack_calls == [256] * 4 + [512] * 2


def test_a_direct_call_still_packs(pack_calls):
    model = build()
    data = synthetic(64)
    tensors = as_tensors(model.feature_columns.encode(data))
    model(tensors)
    assert pack_calls == [64]


def test_the_module_runs_where_typing_has_no_self(monkeypatch):
    # Python 3.10 (pyproject's oldest) has no typing.Self: `from typing
    # import Self` made the package fail to import there.
    monkeypatch.delattr(typing, "Self", raising=False)
    namespace = runpy.run_path(stream.__file__)
    assert namespace["StepData"].__name__ == "StepData"
