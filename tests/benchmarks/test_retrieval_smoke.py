"""Smoke test of benchmarks/retrieval.py: a few steps of each system and the
top-K latency lines come out, with positive figures."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import retrieval  # noqa: E402

pytestmark = pytest.mark.slow  # runs the benchmark's workloads


def test_every_system_and_the_top_k_report(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["retrieval.py", "--steps", "2", "--warmup", "1",
                                      "--repeats", "1", "--corpus", "5000",
                                      "--serve-calls", "3"])
    retrieval.main()
    out = capsys.readouterr().out
    for system in retrieval.SYSTEMS:
        rate = re.search(rf"^retrieval {system} examples_per_s=(\d+)$", out, re.MULTILINE)
        assert rate and int(rate.group(1)) > 0, out
    for baseline in retrieval.SYSTEMS[1:]:
        assert re.search(rf"^retrieval reckeras_over_{baseline} median=\d+\.\d\d "
                         rf"min=\S+ max=\S+ pairs=1$", out, re.MULTILINE), out
    for shape in ("6000x2000", "256x5000"):
        assert re.search(rf"^topk {shape} exact_top_k_ms=\d+\.\d torch_topk_ms=\d+\.\d$",
                         out, re.MULTILINE), out
    for corpus, items in (("retrieval_synth", 2000), ("random_5000x32", 5000)):
        found = re.search(rf"^serve {corpus} exact_p50_ms=\S+ ann_p50_ms=\S+ "
                          rf"ann_recall_at_20=(\d\.\d+) .* ann=hnsw items={items} ", out,
                          re.MULTILINE)
        assert found and float(found.group(1)) > 0.5, out


def test_the_plain_masked_top_k_equals_exact_top_k():
    import torch

    import reckeras as rk

    queries, items = torch.randn(7, 4), torch.randn(50, 4)
    seen = torch.tensor([[3, 7, -1]] * 7)
    _, expected = rk.retrieval.exact_top_k(queries, items, 5, exclude=seen)
    assert torch.equal(retrieval.masked_topk(queries, items, 5, seen).indices, expected)
