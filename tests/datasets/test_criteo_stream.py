"""criteo_stream: days as hive partitions, churning ids, a drifting teacher."""

import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras.datasets as rkd
from reckeras.datasets import criteo_stream
from reckeras.datasets._stats import roc_auc
from reckeras.datasets._synth import SPECS, popularity, scatter_ids, unscatter_ids

ROWS, DAYS, SEED = 20_000, 4, 3
COLUMNS = {c.name: c for c in SPECS["criteo_synth"].categoricals}
CATEGORICAL = list(COLUMNS)
CARDINALITY = {name: c.cardinality for name, c in COLUMNS.items()}
# Fields so small that every live id shows up in a day of ROWS rows.
SMALL = [name for name in CATEGORICAL if CARDINALITY[name] <= 60]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    return rkd.generate("criteo_stream", path=tmp_path_factory.mktemp("s") / "stream",
                        rows_per_day=ROWS, days=DAYS, seed=SEED)


@pytest.fixture(scope="module")
def days(stream):
    return stream.windows("dt")


@pytest.fixture(scope="module")
def tables(days):
    return [day.to_table() for day in days]


def ids_of(table, name):
    column = table[name].drop_null()
    return set(column.to_numpy().tolist())


def test_layout_dates_and_description(stream, days, tmp_path_factory):
    assert stream.name == "criteo_stream"
    assert stream.num_rows == ROWS * DAYS
    assert stream.schema.field("dt").type == "string"
    dates = ["2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04"]
    assert [day.partition["dt"] for day in days] == dates
    assert [day.files[0].split("/")[-2:] for day in days] == [
        [f"dt={d}", "part-0.parquet"] for d in dates]
    for index, day in enumerate(days):
        assert day.num_rows == ROWS
        assert day.metadata["day"] == index
        assert day.metadata["dt"] == dates[index]
        assert day.metadata["seed"] == SEED
    assert stream.metadata["day"] == 0


@pytest.mark.slow
def test_same_arguments_same_bytes_and_teachers_depend_on_seed_and_day(
        stream, tmp_path):
    again = rkd.generate("criteo_stream", path=tmp_path / "again", rows_per_day=ROWS,
                         days=DAYS, seed=SEED)
    for first, second in zip(stream.files, again.files):
        assert pathlib.Path(first).read_bytes() == pathlib.Path(second).read_bytes()
    # Fewer days and rows: the same teachers, so a prefix of each day.
    short = rkd.generate("criteo_stream", path=tmp_path / "short", rows_per_day=500,
                         days=2, seed=SEED, start="2027-01-30")
    assert [d.partition["dt"] for d in short.windows("dt")] == ["2027-01-30",
                                                                "2027-01-31"]
    for short_day, day in zip(short.windows("dt"), stream.windows("dt")):
        assert short_day.to_table().drop_columns("dt").equals(
            day.to_table().slice(0, 500).drop_columns("dt"))
    other = rkd.generate("criteo_stream", path=tmp_path / "other", rows_per_day=500,
                         days=1, seed=SEED + 1)
    assert not other.to_table().drop_columns("dt").equals(
        short.windows("dt")[0].to_table().drop_columns("dt"))


def test_recorded_bayes_auc_equals_recomputation(days, tables):
    for day, table in zip(days, tables):
        labels = table["label"].to_numpy()
        prob = table["teacher_prob"].to_numpy()
        negatives = np.sort(prob[labels == 0])
        positives = prob[labels == 1]
        below = np.searchsorted(negatives, positives, side="left")
        not_above = np.searchsorted(negatives, positives, side="right")
        expected = (below + not_above).sum() / 2 / (len(positives) * len(negatives))
        assert day.metadata["bayes_auc"] == day.bayes_auc()
        assert day.metadata["bayes_auc"] == pytest.approx(expected, abs=1e-12)
        assert 0.78 < day.metadata["bayes_auc"] < 0.9


@pytest.mark.slow
def test_teacher_prob_is_the_day_teachers(tables):
    for index, table in enumerate(tables):
        teacher = criteo_stream.day_teacher(SEED, index)
        np.testing.assert_allclose(teacher.probabilities(table),
                                   table["teacher_prob"].to_numpy(), rtol=0, atol=1e-6)


def test_ids_appear_and_stop(days, tables):
    seen = {name: ids_of(tables[0], name) for name in CATEGORICAL}
    for index in range(1, DAYS):
        replaced = days[index].metadata["replaced_ids"]
        for name in SMALL:
            before, today = ids_of(tables[index - 1], name), ids_of(tables[index], name)
            assert len(before) == len(today) == CARDINALITY[name]
            assert len(today - before) == len(before - today) == replaced[name]
            assert not (today - before) & seen[name], f"{name}: a new id is not new"
        for name in CATEGORICAL:
            seen[name] |= ids_of(tables[index], name)
    # Ids are replaced at rate ID_CHURN: over 3 days of 26 fields (~3.2M ids),
    # the count is binomial; 5 standard deviations of slack.
    trials = sum(CARDINALITY.values()) * (DAYS - 1)
    replaced = sum(sum(d.metadata["replaced_ids"].values()) for d in days[1:])
    spread = 5 * np.sqrt(trials * criteo_stream.ID_CHURN * (1 - criteo_stream.ID_CHURN))
    assert abs(replaced - trials * criteo_stream.ID_CHURN) < spread
    # Huge fields: today's ids are the live ones, those of replaced ranks were
    # never seen before, and rows hold them as often as Zipf says for those
    # ranks.
    previous = criteo_stream.day_teacher(SEED, 2)
    today = criteo_stream.day_teacher(SEED, 3)
    for name in ("C3", "C12"):
        replaced = today.slots[name] != previous.slots[name]
        assert replaced.sum() == days[3].metadata["replaced_ids"][name] > 15_000
        new_ids = today.ids[name][replaced]
        assert ids_of(tables[3], name) <= set(today.ids[name].tolist())
        earlier = set().union(*(ids_of(t, name) for t in tables[:3]))
        assert not set(new_ids.tolist()) & earlier
        present = tables[3][name].drop_null().to_numpy()
        share = np.isin(present, new_ids).mean()
        mass = np.diff(popularity(COLUMNS[name])[0], prepend=0.0)[replaced].sum()
        assert abs(share - mass) < 5 * np.sqrt(mass * (1 - mass) / len(present))


@pytest.mark.slow
def test_yesterdays_teacher_scores_today_worse(days, tables):
    for index in range(1, DAYS):
        labels = tables[index]["label"].to_numpy()
        stale = criteo_stream.day_teacher(SEED, index - 1).probabilities(tables[index])
        assert roc_auc(labels, stale) < days[index].metadata["bayes_auc"] - 0.005


def test_a_few_weights_change_every_day(days):
    for index in range(1, DAYS):
        before, now = days[index - 1].metadata, days[index].metadata
        changed = {name for name in now["weights"]
                   if now["weights"][name] != before["weights"][name]}
        assert changed <= set(now["reweighted"])
        assert len(now["reweighted"]) == criteo_stream.REWEIGHTED_PER_DAY
        for name, factor in now["reweighted"].items():
            assert now["weights"][name] == factor
            assert 0.25 <= factor <= 1.75
    assert days[0].metadata["reweighted"] == {}


@pytest.mark.parametrize("kwargs, message", [
    ({"rows_per_day": 0}, "rows_per_day"),
    ({"days": 1.5}, "days"),
    ({"start": "tomorrow"}, "start"),
    ({"seed": -1}, "seed"),
    ({"rows": 10}, "rows_per_day"),
    ({"split": "test"}, "no splits"),
    ({"hours": 3}, "hours"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        rkd.generate("criteo_stream", path=tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_not_packaged_and_other_datasets_take_no_options(tmp_path):
    with pytest.raises(ValueError, match="generate"):
        rkd.load("criteo_stream")
    with pytest.raises(ValueError, match="no options"):
        rkd.generate("criteo_synth", 10, tmp_path / "x.parquet", days=2)
    with pytest.raises(ValueError, match="path"):
        rkd.generate("criteo_stream", days=2)


def test_production_vocabulary_scales_the_large_fields_only():
    spec = criteo_stream.stream_spec("production")
    for col in spec.categoricals:
        if CARDINALITY[col.name] >= 100_000:
            assert col.cardinality == 10 * CARDINALITY[col.name]
            assert col.zipf_exponent == criteo_stream.PRODUCTION_ZIPF_EXPONENT
        else:
            assert col == COLUMNS[col.name]
    assert max(c.cardinality for c in spec.categoricals) == 10_000_000
    assert criteo_stream.stream_spec("criteo") is SPECS["criteo_synth"]
    with pytest.raises(ValueError, match="vocabulary must be one of"):
        rkd.generate("criteo_stream", path="/nonexistent/never-written", days=1,
                     vocabulary="huge")


@pytest.mark.slow
def test_a_production_day_brings_mostly_new_ids_of_the_large_fields(tmp_path):
    stream = rkd.generate("criteo_stream", path=tmp_path / "p", rows_per_day=20_000,
                          days=2, seed=SEED, vocabulary="production")
    first, second = [day.to_table() for day in stream.windows("dt")]
    assert stream.metadata["vocabulary"] == "production"
    assert stream.metadata["cardinalities"]["C3"] == 10_000_000
    # Flat tails: most of a large field's ids of a day were not seen the day
    # before, where criteo_synth's steep laws repeat them (test above: C6).
    new = ids_of(second, "C3") - ids_of(first, "C3")
    assert len(new) > 0.5 * len(ids_of(second, "C3"))
    teacher = criteo_stream.day_teacher(SEED, 1, "production")
    np.testing.assert_allclose(second["teacher_prob"].to_numpy(),
                               teacher.probabilities(second), rtol=1e-6)


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.integers(0, 2**40 - 1), max_size=50),
       multiplier=st.integers(0, 2**39 - 1), offset=st.integers(0, 2**40 - 1))
def test_unscatter_ids_inverts_scatter_ids(values, multiplier, offset):
    multiplier, offset = np.uint64(2 * multiplier + 1), np.uint64(offset)
    values = np.array(values, dtype=np.int64)
    ids = scatter_ids(values, multiplier, offset)
    np.testing.assert_array_equal(unscatter_ids(ids, multiplier, offset), values)


def test_unscatter_ids_refuses_ids_outside_the_id_space():
    ids = np.array([-1, -2**63, 2**40, 2**62], dtype=np.int64)
    np.testing.assert_array_equal(unscatter_ids(ids, np.uint64(3), np.uint64(5)), -1)


def test_a_teacher_finds_each_ids_latent_by_its_popularity_rank():
    # Two days in: some ids churned, so retired slots must read as unknown.
    teacher = criteo_stream.day_teacher(SEED, 2)
    name = "C3"
    ids = teacher.ids[name]
    rng = np.random.default_rng(0)
    ranks = rng.integers(0, len(ids), 500)
    retired = scatter_ids(np.flatnonzero(~np.isin(np.arange(teacher.next_slot[name]),
                                                  teacher.slots[name]))[:50],
                          *teacher.common.id_scatter[name])
    assert len(retired) > 0
    strangers = np.array([-5, 2**40 + 3, 2**62], dtype=np.int64)
    queried = np.concatenate([ids[ranks], retired, strangers])
    missing = np.zeros(len(queried), dtype=bool)
    missing[0] = True
    rank_of = {int(i): r for r, i in enumerate(ids)}   # an independent lookup
    expected = np.array([teacher.latent[name][rank_of[int(i)]] if int(i) in rank_of
                         else np.zeros(teacher.latent[name].shape[1]) for i in queried])
    expected[0] = teacher.common.missing_latent[name]
    np.testing.assert_array_equal(teacher.latent_of(name, queried, missing), expected)
