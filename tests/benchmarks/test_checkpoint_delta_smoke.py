"""Smoke test of benchmarks/checkpoint_delta.py: four small days print one row
per day (nothing saved in the history, no delta on its last day) and the
median ratio on the last line."""

import statistics
import sys

import pytest

import checkpoint_delta  # noqa: E402  (benchmarks/ is on the path: conftest)

import reckeras as rk  # noqa: E402

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


def run(monkeypatch, capsys, *options):
    monkeypatch.setattr(sys, "argv", ["checkpoint_delta.py", "--rows-per-day", "3000",
                                      "--bottom", "16", "--top", "16", "--dim", "8",
                                      *options])
    checkpoint_delta.main()
    lines = capsys.readouterr().out.splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in lines if line.startswith("| 2026-")]
    return lines, rows


def test_rows_per_day_and_the_median_ratio(monkeypatch, capsys, tmp_path):
    lines, rows = run(monkeypatch, capsys, "--days", "4", "--history-days", "2",
                      "--vocabulary", "criteo")
    assert [r[0] for r in rows] == ["2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04"]
    assert rows[0][2:11] == ["-"] * 9            # history: nothing saved
    assert rows[1][2:4] == ["-"] * 2 and rows[1][6:11] == ["-"] * 5   # the first full
    table_rows = [int(r[1].replace(",", "")) for r in rows]
    assert table_rows[0] < table_rows[1] < table_rows[2] < table_rows[3]
    ratios = []
    for r in rows[2:]:
        changed, share = int(r[2].replace(",", "")), float(r[3])
        assert 0 < changed <= int(r[1].replace(",", ""))
        assert share == pytest.approx(changed / int(r[1].replace(",", "")), abs=0.001)
        full, delta, ratio = float(r[4]), float(r[6]), float(r[8])
        assert delta < full
        assert ratio == pytest.approx(delta / full, abs=0.01)
        assert 0 < float(r[9]) < 1
        assert 1.0 <= float(r[10]) < 2.0     # tracking and framing on top of the rows
        ratios.append(ratio)
    bayes = [day.metadata["bayes_auc"] for day in rk.datasets.generate(
        "criteo_stream", path=tmp_path, rows_per_day=3000, days=4).windows("dt")]
    assert [float(r[12]) for r in rows] == pytest.approx(bayes, abs=5e-5)
    assert lines[-1].startswith("delta_to_full_bytes=")
    assert float(lines[-1].split("=")[1]) == pytest.approx(statistics.median(ratios),
                                                           abs=0.002)


def test_history_must_leave_measured_days(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run(monkeypatch, capsys, "--days", "3", "--history-days", "3")
