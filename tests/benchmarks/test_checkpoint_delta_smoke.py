"""Smoke test of benchmarks/checkpoint_delta.py: three small days print one row
per day (no delta the first day) and the median ratio on the last line."""

import statistics
import sys

import pytest

import checkpoint_delta  # noqa: E402  (benchmarks/ is on the path: conftest)

import reckeras as rk  # noqa: E402

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


def test_rows_per_day_and_the_median_ratio(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["checkpoint_delta.py", "--rows-per-day", "3000",
                                      "--days", "3", "--bottom", "16", "--top", "16",
                                      "--dim", "8"])
    checkpoint_delta.main()
    lines = capsys.readouterr().out.splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in lines if line.startswith("| 2026-")]
    assert [r[0] for r in rows] == ["2026-12-01", "2026-12-02", "2026-12-03"]
    assert rows[0][4:8] == ["-"] * 4
    table_rows = [int(r[1].replace(",", "")) for r in rows]
    assert table_rows[0] < table_rows[1] < table_rows[2]
    ratios = []
    for r in rows[1:]:
        full, delta, ratio = float(r[2]), float(r[4]), float(r[6])
        assert delta < full
        assert ratio == pytest.approx(delta / full, abs=0.01)
        assert 0 < float(r[7]) < 1
        ratios.append(ratio)
    bayes = [day.metadata["bayes_auc"] for day in rk.datasets.generate(
        "criteo_stream", path=tmp_path, rows_per_day=3000, days=3).windows("dt")]
    assert [float(r[9]) for r in rows] == pytest.approx(bayes, abs=5e-5)
    assert lines[-1].startswith("delta_to_full_bytes=")
    assert float(lines[-1].split("=")[1]) == pytest.approx(statistics.median(ratios),
                                                           abs=0.002)
