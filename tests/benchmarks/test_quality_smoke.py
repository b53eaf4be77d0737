"""Smoke test of benchmarks/quality.py: the protocol on a few thousand
`longtail_synth` rows and on a tiny CSV directory prints test AUC, logloss
and the gap to the Bayes AUC."""

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import quality  # noqa: E402

import reckeras as rk  # noqa: E402

pytestmark = pytest.mark.slow  # trains the protocol's (400, 400, 400) towers


def table_rows(lines):
    return {line.split("|")[1].strip(" `"): [cell.strip() for cell in
                                             line.strip("|").split("|")]
            for line in lines if line.startswith("| `")}


def test_packaged_rows_print_auc_logloss_and_gap(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["quality.py", "--datasets", "longtail_synth",
                                      "--rows", "4000", "--epochs", "2"])
    quality.main()
    rows = table_rows(capsys.readouterr().out.splitlines())
    assert sorted(rows) == ["dcn_v2", "deepfm"]
    bayes = rk.datasets.load("longtail_synth", split="test").bayes_auc()
    for cells in rows.values():
        assert cells[1] == "`longtail_synth`"
        auc, logloss, bayes_cell, gap = map(float, cells[2:6])
        assert bayes_cell == pytest.approx(bayes, abs=5e-5)
        assert gap == pytest.approx(auc - bayes_cell, abs=1.5e-4)
        assert 0.45 < auc < bayes and 0.3 < logloss < 1.0
        assert int(cells[6]) in (1, 2)


def test_csv_dir_runs_the_protocol(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(0)
    for split, rows in (("train", 3000), ("valid", 500), ("test", 500)):
        user = rng.integers(0, 50, rows)
        site = rng.choice(np.array(["a", "b", "c"]), rows)
        probability = 1 / (1 + np.exp(-(np.sin(user) + (site == "a"))))
        pa_csv.write_csv(pa.table({
            "label": (rng.random(rows) < probability).astype(np.int64),
            "user": user, "site": site}), tmp_path / f"{split}.csv")
    monkeypatch.setattr(sys, "argv", ["quality.py", "--csv-dir", str(tmp_path),
                                      "--epochs", "3"])
    quality.main()
    rows = table_rows(capsys.readouterr().out.splitlines())
    assert sorted(rows) == ["dcn_v2", "deepfm"]
    for cells in rows.values():
        auc, logloss = map(float, cells[2:4])
        assert 0.5 < auc <= 1.0 and 0.0 < logloss < 1.0
        assert 1 <= int(cells[4]) <= 3


def test_csv_dir_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["quality.py", "--csv-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"valid\.csv"):
        quality.main()


def rank_auc(labels, scores):
    """AUC as the Mann-Whitney statistic (ties count half)."""
    positive, negative = scores[labels == 1], scores[labels == 0]
    greater = (positive[:, None] > negative[None, :]).sum()
    ties = (positive[:, None] == negative[None, :]).sum()
    return (greater + 0.5 * ties) / (len(positive) * len(negative))


def test_multitask_aucs_are_each_tasks_own():
    table = rk.datasets.load("aliccp_synth", split="train").to_table()
    train, test = table.slice(0, 3000), table.slice(3000, 2000)
    builder, columns = quality.DATASETS["aliccp_synth"]["esmm"]
    model = builder(columns())
    result, _, _ = quality.train_and_test(model, train, test, test, epochs=1, seed=0,
                                          labels=quality.TASKS)
    predictions = model.predict(test, batch_size=4096, verbose=0)
    for task, label in quality.TASKS.items():
        expected = rank_auc(test[label].to_numpy(), predictions[task].reshape(-1))
        assert result[task][0] == pytest.approx(expected, abs=2e-3), task
