"""examples/continuous_training.py on a tiny stream, so that it cannot rot:
the three strategies start from the same model, the continuous model's row
counts match the data, and the table and the PNG come out."""

import sys
from pathlib import Path

import pytest

import reckeras as rk

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import continuous_training  # noqa: E402

pytestmark = pytest.mark.slow  # runs an example end to end


def ids(day, column):
    return set(day[column].drop_null().to_pylist())


def test_the_example_compares_the_strategies_on_three_days(tmp_path):
    stream = rk.datasets.generate("criteo_stream", path=tmp_path / "stream",
                                  rows_per_day=3000, days=3, seed=1)
    days = stream.windows("dt")
    results = continuous_training.compare(days, dim=4, bottom=(8,), top=(8,), aging=1,
                                          seed=0, directory=tmp_path / "serving")
    assert results["day"] == ["2026-12-02", "2026-12-03"]
    assert results["bayes_auc"] == [day.metadata["bayes_auc"] for day in days[1:]]
    # After day 1 the three models are one: the same weights, data and seed.
    first = [results[strategy][0] for strategy in continuous_training.STRATEGIES]
    assert max(first) - min(first) < 1e-6 and 0.3 < first[0] < 1.0
    assert all(len(results[s]) == 2 for s in continuous_training.STRATEGIES)
    # The served model (a full export, then a delta with aged-out ids) scores
    # the next day as the trained model does.
    assert results["served"] == pytest.approx(results["continuous"], abs=1e-4)
    assert len(results["serve_s"]) == 2 and all(s > 0 for s in results["serve_s"])
    # Day 1 gives one row per distinct id of every categorical column.
    day1, day2 = days[0].to_table(), days[1].to_table()
    distinct = sum(len(ids(day1, f"C{i}")) for i in range(1, 27))
    assert results["rows_added"][0] == results["rows_kept"][0] == distinct
    assert results["rows_evicted"][0] == 0
    # Day 2 (aging after 1 day) drops the day-1 ids day 2 did not bring back.
    gone = sum(len(ids(day1, f"C{i}") - ids(day2, f"C{i}")) for i in range(1, 27))
    assert results["rows_evicted"][1] == gone > 0
    assert results["rows_kept"][1] == distinct + results["rows_added"][1] - gone
    lines = continuous_training.table(results).splitlines()
    assert len(lines) == 4 and lines[2].startswith("| day 1 | day 2 (2026-12-02) |")
    png = tmp_path / "auc.png"
    assert continuous_training.plot(results, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
