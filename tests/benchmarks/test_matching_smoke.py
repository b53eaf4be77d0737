"""Smoke test of benchmarks/matching.py: the synthetic, the baselines and a
few MF epochs report, and its plain-torch metrics agree with rk.metrics."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import matching

import reckeras as rk


def test_a_small_synthetic_run_reports_every_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["matching.py", "--users", "300", "--items", "400",
                                      "--epochs", "2", "--negatives", "50", "--dim", "8"])
    matching.main()
    out = capsys.readouterr().out
    teacher = re.search(r"^matching data=synthetic users=300 items=400 "
                        r"teacher_recall_at_20=(\S+)$", out, re.MULTILINE)
    assert teacher and 0.0 < float(teacher.group(1)) <= 1.0, out
    assert re.search(r"^matching train_rows=\d+ test_rows=\d+ users=300 items=400$", out,
                     re.MULTILINE), out
    for name in ("popularity", "svd8"):
        assert re.search(rf"^matching baseline={name} recall_at_20=0\.\d+ ndcg_at_20=0\.\d+$",
                         out, re.MULTILINE), out
    for epoch in (1, 2):
        assert re.search(rf"^matching epoch={epoch} recall_at_20=0\.\d+ ndcg_at_20=0\.\d+ "
                         rf"fit_s=\S+$", out, re.MULTILINE), out
    assert re.search(r"^matching recall_at_20=0\.\d+ ndcg_at_20=0\.\d+ best_epoch=[12]$", out,
                     re.MULTILINE), out


def test_the_synthetic_holds_out_a_fifth_of_each_users_items(tmp_path):
    matching.generate(tmp_path, users=50, items=300)
    train = [line.split() for line in (tmp_path / "train.txt").read_text().splitlines()]
    test = [line.split() for line in (tmp_path / "test.txt").read_text().splitlines()]
    assert [t[0] for t in train] == [t[0] for t in test] == [str(u) for u in range(50)]
    for kept, held in zip(train, test, strict=True):
        assert not set(kept[1:]) & set(held[1:])
        assert len(held) - 1 == max(1, round(0.2 * (len(kept) + len(held) - 2)))


@pytest.mark.parametrize("seed", range(3))
def test_the_plain_metrics_equal_rk_metrics(seed):
    rng = np.random.default_rng(seed)
    top = torch.from_numpy(np.stack([rng.permutation(60)[:matching.K] for _ in range(40)]))
    relevant = torch.from_numpy(rng.integers(0, 60, (40, 7)))
    relevant[rng.random((40, 7)) < 0.4] = -1
    relevant[:, 0] = torch.from_numpy(rng.integers(0, 60, 40))  # one relevant item at least
    # rk.metrics count a duplicate relevant position once, so hand them unique rows.
    unique = torch.full_like(relevant, -1)
    for row, items in enumerate(relevant.tolist()):
        kept = sorted({i for i in items if i >= 0})
        unique[row, :len(kept)] = torch.tensor(kept)
    recall, ndcg = matching.recall_and_ndcg(top, unique)
    for metric, value in ((rk.metrics.RecallAtK(matching.K), recall),
                          (rk.metrics.NDCGAtK(matching.K), ndcg)):
        metric.update_state(unique.numpy(), top.numpy())
        assert float(metric.result()) == pytest.approx(value, rel=1e-5)


def test_towers_and_another_loss_build_the_asked_model(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["matching.py", "--units", "16", "8", "--loss", "softmax"])
    parser_args = matching.parse_args()
    model = matching.build_model(parser_args, items=40)
    assert model.loss_name == "softmax"
    assert tuple(model.query_units) == tuple(model.candidate_units) == (16, 8)
