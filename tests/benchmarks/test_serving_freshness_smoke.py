"""Smoke test of benchmarks/serving_freshness.py: three tiny days, a real
server taking two deltas from its watched directory; one row per delta and
the summary line, with no failed or mixed response."""

import sys

import pytest

import serving_freshness  # noqa: E402  (benchmarks/ is on the path: conftest)

pytestmark = pytest.mark.slow  # runs the benchmarks' workloads


def test_two_deltas_are_served_with_no_failed_or_mixed_response(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["serving_freshness.py", "--rows-per-day", "2000",
                                      "--days", "3", "--bottom", "8", "--top", "8",
                                      "--settle", "1"])
    serving_freshness.main()
    lines = capsys.readouterr().out.splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in lines if line.startswith("| 2026-")]
    assert [r[0] for r in rows] == ["2026-12-02", "2026-12-03"]
    for r in rows:
        trained, export, freshness, landed = (float(c) for c in r[3:7])
        assert 0 < landed <= freshness
        assert freshness == pytest.approx(export + landed, abs=0.02)
    fields = dict(field.split("=") for field in lines[-1].split())
    assert list(fields) == ["freshness_s", "failed_requests", "mixed_responses",
                            "p99_ratio"]
    assert fields["failed_requests"] == "0" and fields["mixed_responses"] == "0"
    assert float(fields["freshness_s"]) > 0 and float(fields["p99_ratio"]) > 0
