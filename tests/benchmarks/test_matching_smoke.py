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
                                      "--epochs", "3", "--negatives", "50", "--dim", "8",
                                      "--patience", "1", "--eval-every", "2"])
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
    selected = re.findall(r"^matching select epoch=(\d+) val_recall_at_20=0\.\d+ "
                          r"rate=(\S+)$", out, re.MULTILINE)
    assert [int(e) for e, _ in selected] == [1, 2, 3], out
    best = re.search(r"^matching select best_epoch=([123]) val_recall_at_20=0\.\d+$", out,
                     re.MULTILINE)
    assert best, out
    # The final fit replays the selected epochs' rates, test figures every 2.
    epochs = int(best.group(1))
    rates = ",".join(rate for _, rate in selected[:epochs])
    shown = [int(e) for e in re.findall(r"^matching epoch=(\d+) recall_at_20=0\.\d+ "
                                        r"ndcg_at_20=0\.\d+ rate=\S+$", out, re.MULTILINE)]
    assert shown == sorted({e for e in (2, epochs) if e <= epochs}), out
    assert re.search(rf"^matching recall_at_20=0\.\d+ ndcg_at_20=0\.\d+ epochs={epochs} "
                     rf"schedule={rates} fit_s=\d+$", out, re.MULTILINE), out


def test_a_given_schedule_skips_the_selection(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["matching.py", "--users", "200", "--items", "300",
                                      "--negatives", "50", "--dim", "8",
                                      "--schedule", "0.001,0.0001", "--eval-every", "1"])
    matching.main()
    out = capsys.readouterr().out
    assert "matching select" not in out
    assert re.search(r"^matching epoch=2 recall_at_20=0\.\d+ ndcg_at_20=0\.\d+ rate=0\.0001$",
                     out, re.MULTILINE), out
    assert re.search(r"^matching recall_at_20=0\.\d+ ndcg_at_20=0\.\d+ epochs=2 "
                     r"schedule=0\.001,0\.0001 ", out, re.MULTILINE), out


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
