"""Smoke test of benchmarks/zoo.py's multi-task rows: `--models esmm mmoe` on a
few thousand train rows prints both tasks against the recorded Bayes AUCs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import zoo  # noqa: E402

import reckeras as rk  # noqa: E402

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


def test_multitask_rows_report_both_tasks(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["zoo.py", "--models", "esmm", "mmoe",
                                      "--rows", "5000"])
    monkeypatch.setitem(zoo.MULTITASK_RECIPE, "epochs", 1)
    zoo.main()
    lines = capsys.readouterr().out.splitlines()
    bayes = rk.datasets.load("aliccp_synth", split="test").metadata["bayes_auc"]
    rows = {line.split("|")[1].strip(" `"): line for line in lines
            if line.startswith("| `")}
    assert sorted(rows) == ["esmm", "mmoe"]
    for name, line in rows.items():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[1] == "`aliccp_synth`"
        ctr, ctr_bayes, ctr_gap, ctcvr, ctcvr_bayes, ctcvr_gap = map(float, cells[2:8])
        assert ctr_bayes == pytest.approx(bayes["click"], abs=5e-5)
        assert ctcvr_bayes == pytest.approx(bayes["conversion"], abs=5e-5)
        assert ctr_gap == pytest.approx(ctr - ctr_bayes, abs=1.5e-4)
        assert ctcvr_gap == pytest.approx(ctcvr - ctcvr_bayes, abs=1.5e-4)
        # 5,000 rows in one epoch teach something, but nowhere near the teacher.
        assert 0.52 < ctr < ctr_bayes and 0.52 < ctcvr < ctcvr_bayes
        assert float(cells[8].replace(",", "")) > 0
