"""`aliccp_synth`: schema, labels (a conversion only after a click), the
teacher's probabilities recomputed from the columns, the recorded Bayes AUCs,
and the packaged files against what `generate` writes."""

import numpy as np
import pyarrow.parquet as pq
import pytest

import reckeras as rk
from reckeras.datasets import aliccp
from reckeras.datasets._registry import DATA_DIR
from reckeras.datasets._stats import roc_auc

IDS = ["user_id", "user_gender", "user_age", "user_city_level", "user_occupation",
       "item_id", "item_category", "item_shop", "item_brand", "position", "hour"]
NULLABLE = {"user_occupation", "item_brand"}


@pytest.fixture(scope="module")
def splits():
    return {split: rk.datasets.load("aliccp_synth", split=split)
            for split in ("train", "test")}


@pytest.fixture(scope="module")
def tables(splits):
    return {split: data.to_table() for split, data in splits.items()}


def counted_auc(labels, scores):
    """AUC by counting, for every positive, the negatives below and tied."""
    negatives = np.sort(scores[labels == 0])
    positives = scores[labels == 1]
    below = np.searchsorted(negatives, positives, side="left")
    not_above = np.searchsorted(negatives, positives, side="right")
    return (below + not_above).sum() / 2 / (len(positives) * len(negatives))


def test_listed_sizes_names_and_row_groups(splits):
    assert "aliccp_synth" in rk.datasets.list()
    for split, data in splits.items():
        assert data.num_rows == aliccp.DEFAULT_ROWS[split]
        assert data.name == f"aliccp_synth:{split}"
        # No `label` column: the two labels are named in fit(labels=...).
        assert data.label is None
    assert pq.ParquetFile(splits["train"].files[0]).num_row_groups == 5
    sizes = sum((DATA_DIR / f"aliccp_synth_{s}.parquet").stat().st_size
                for s in aliccp.SPLIT_SEEDS)
    assert sizes <= 6_000_000


def test_schema_ids_and_nulls(tables):
    for table in tables.values():
        assert table.schema.names == (["click", "conversion"] + IDS[:5]
                                      + ["user_clicks_30d"] + IDS[5:9]
                                      + ["item_price", "position", "hour",
                                         "teacher_click_prob", "teacher_conversion_prob"])
        for name in ["click", "conversion", "user_clicks_30d", *IDS]:
            assert str(table.schema.field(name).type) == "int64", name
        for name in ("item_price", "teacher_click_prob", "teacher_conversion_prob"):
            assert str(table.schema.field(name).type) == "float"
        for name in IDS:
            column = table[name]
            assert (column.null_count > 0) == (name in NULLABLE), name
            assert column.drop_null().to_numpy().min() >= 0, name
        # A tenth of the users lack an occupation and a quarter of the items a
        # brand (a share of the rows that depends on their traffic).
        for key, name, share in (("user_id", "user_occupation", 0.1),
                                 ("item_id", "item_brand", 0.25)):
            keys = table[key].to_numpy()
            missing = table[name].is_null().to_numpy(zero_copy_only=False)
            assert len(np.unique(keys[missing])) / len(np.unique(keys)) == \
                pytest.approx(share, abs=0.03)
            assert 0.02 < missing.mean() < 0.5
        assert table["item_price"].to_numpy().min() > 0
        positions = table["position"].to_numpy()
        assert set(np.unique(positions)) == set(range(aliccp.POSITIONS))
        # Higher slots get more impressions.
        assert np.bincount(positions)[0] > 2 * np.bincount(positions)[-1]


def test_conversion_only_after_a_click_and_label_rates(tables):
    for table in tables.values():
        click = table["click"].to_numpy()
        conversion = table["conversion"].to_numpy()
        assert set(np.unique(click)) == set(np.unique(conversion)) == {0, 1}
        assert (conversion <= click).all()
        assert 0.05 <= click.mean() <= 0.2
        assert 0.05 <= conversion[click == 1].mean() <= 0.15
        click_prob = table["teacher_click_prob"].to_numpy()
        conversion_prob = table["teacher_conversion_prob"].to_numpy()
        # p(click and conversion) = p(click) * p(cvr) <= p(click), up to the
        # rounding of the stored columns.
        assert (conversion_prob <= click_prob + 5e-5).all()
        # The labels follow the teacher: observed rates match its mean.
        assert click.mean() == pytest.approx(click_prob.mean(), abs=0.005)
        assert conversion.mean() == pytest.approx(conversion_prob.mean(), abs=0.002)


def test_profiles_are_attributes_of_their_user_and_item(tables):
    table = tables["test"]
    for key, attributes in (("user_id", IDS[1:5] + ["user_clicks_30d"]),
                            ("item_id", IDS[6:9] + ["item_price"])):
        keys = table[key].to_numpy()
        order = np.argsort(keys, kind="stable")
        starts = np.r_[True, keys[order][1:] != keys[order][:-1]]
        first = np.maximum.accumulate(np.where(starts, np.arange(len(keys)), 0))
        for name in attributes:
            column = table[name]
            values = column.fill_null(-1).to_numpy()[order]
            np.testing.assert_array_equal(values, values[first], err_msg=name)


def recomputed_probabilities(table):
    """p(click) and p(click and conversion) from the columns, by the formula
    of the module docstring, with the teacher's hidden parameters."""
    teacher = aliccp._teacher()

    def index(column, ids):
        # The teacher's index of each id: its ids are permutations.
        inverse = np.empty(len(ids), np.int64)
        inverse[ids] = np.arange(len(ids))
        values = table[column].fill_null(0).to_numpy()
        return inverse[values]

    user, item = index("user_id", teacher.user_ids), index("item_id", teacher.item_ids)
    category = index("item_category", teacher.category_ids)
    shop, brand = index("item_shop", teacher.shop_ids), index("item_brand", teacher.brand_ids)
    has_brand = table["item_brand"].is_valid().to_numpy(zero_copy_only=False)
    has_occupation = table["user_occupation"].is_valid().to_numpy(zero_copy_only=False)
    occupation = table["user_occupation"].fill_null(0).to_numpy()
    gender, age, city = (table[name].to_numpy() for name in
                         ("user_gender", "user_age", "user_city_level"))
    position, hour = table["position"].to_numpy(), table["hour"].to_numpy()
    z_price = (np.log(table["item_price"].to_numpy().astype(np.float64)) - 4.0) / 0.9
    activity = np.tanh(np.log1p(table["user_clicks_30d"].to_numpy()) - 2)
    taste = ((teacher.gender_vector[gender] + teacher.age_vector[age])
             * teacher.category_vector[category]).sum(axis=1)
    click = (-0.8 + teacher.user_click[user] + teacher.item_click[item]
             + teacher.category_click[category] + teacher.shop_click[shop]
             + np.where(has_brand, teacher.brand_click[brand], 0.0)
             + teacher.gender_click[gender] + teacher.age_click[age]
             + teacher.city_click[city]
             + np.where(has_occupation, teacher.occupation_click[occupation], 0.0)
             - 0.35 * np.log1p(position) + 0.25 * np.cos(2 * np.pi * (hour - 21) / 24)
             + 0.5 * activity - 0.15 * z_price + 0.8 * taste)
    cvr = (-2.4 + teacher.user_cvr[user]
           + np.where(has_brand, teacher.brand_cvr[brand], 0.0)
           + teacher.category_cvr[category]
           + np.where(has_occupation, teacher.occupation_cvr[occupation], 0.0)
           + teacher.city_cvr[city] - 0.6 * z_price + 0.3 * (age - 3) / 2 * z_price
           + 0.6 * taste + 0.3 * activity)
    p_click, p_cvr = 1 / (1 + np.exp(-click)), 1 / (1 + np.exp(-cvr))
    return p_click, p_click * p_cvr


def test_teacher_probabilities_are_a_function_of_the_columns(tables):
    table = tables["test"]
    p_click, p_conversion = recomputed_probabilities(table)
    # Stored rounded to 1e-4 and 1e-5 (then float32); the price is float32.
    np.testing.assert_allclose(table["teacher_click_prob"].to_numpy(), p_click,
                               rtol=0, atol=5.1e-5)
    np.testing.assert_allclose(table["teacher_conversion_prob"].to_numpy(), p_conversion,
                               rtol=0, atol=5.1e-6)


def test_recorded_bayes_aucs(splits, tables):
    for split, data in splits.items():
        table = tables[split]
        recorded = data.metadata["bayes_auc"]
        assert set(recorded) == {"click", "conversion"}
        for label, column in aliccp.LABELS.items():
            labels = table[label].to_numpy()
            expected = counted_auc(labels, table[column].to_numpy())
            assert recorded[label] == pytest.approx(expected, abs=1e-12)
    test = tables["test"]
    bayes = splits["test"].metadata["bayes_auc"]
    assert 0.70 <= bayes["click"] <= 0.80
    assert 0.75 <= bayes["conversion"] <= 0.88
    # The rounding of the stored probabilities moves the AUCs by < 1e-3.
    p_click, p_conversion = recomputed_probabilities(test)
    assert roc_auc(test["click"].to_numpy(), p_click) == pytest.approx(
        bayes["click"], abs=1e-3)
    assert roc_auc(test["conversion"].to_numpy(), p_conversion) == pytest.approx(
        bayes["conversion"], abs=1e-3)


@pytest.mark.parametrize("split", ["train", "test"])
def test_packaged_files_are_what_generate_writes(tmp_path, split):
    path = tmp_path / f"{split}.parquet"
    rk.datasets.generate("aliccp_synth", aliccp.DEFAULT_ROWS[split], path, split=split)
    assert path.read_bytes() == (DATA_DIR / f"aliccp_synth_{split}.parquet").read_bytes()


def test_generate_prefixes_seeds_and_metadata(tmp_path, tables):
    short = rk.datasets.generate("aliccp_synth", 1_000, tmp_path / "s.parquet",
                                 split="test")
    rows = short.to_table()
    assert rows.equals(tables["test"].slice(0, 1_000))
    assert short.metadata["rows"] == 1_000 and short.metadata["seed"] is None
    assert short.metadata["split"] == "test"
    for label, column in aliccp.LABELS.items():
        assert short.metadata["bayes_auc"][label] == pytest.approx(
            counted_auc(rows[label].to_numpy(), rows[column].to_numpy()), abs=1e-12)
    again = rk.datasets.generate("aliccp_synth", 1_000, tmp_path / "a.parquet",
                                 split="test")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "s.parquet").read_bytes()
    replica = rk.datasets.generate("aliccp_synth", 1_000, tmp_path / "r.parquet",
                                   split="test", seed=3).to_table()
    assert not replica.equals(rows) and replica.schema.equals(rows.schema)
    assert again.metadata == short.metadata
    assert not list(tmp_path.glob("*.partial"))


def test_auc_counter_matches_roc_auc_with_ties_and_chunks():
    rng = np.random.default_rng(0)
    labels = (rng.random(3_000) < 0.3).astype(np.int64)
    # Scores on the 1e-2 grid: many ties.
    scores = np.round(np.clip(0.3 * labels + 0.7 * rng.random(3_000), 0, 1), 2)
    counter = aliccp._AucCounter(decimals=2)
    for start in range(0, 3_000, 700):
        counter.add(labels[start:start + 700], scores[start:start + 700].astype(np.float32))
    assert counter.auc() == pytest.approx(roc_auc(labels, scores), abs=1e-12)
    constant = aliccp._AucCounter(decimals=2)
    constant.add(np.zeros(5, np.int64), scores[:5])
    assert constant.auc() is None


def test_an_interrupted_generate_leaves_no_file(tmp_path, monkeypatch):
    real_chunk = aliccp._chunk_table

    def failing(row_seed, chunk_index):
        if chunk_index == 1:
            raise KeyboardInterrupt
        return real_chunk(row_seed, chunk_index)

    monkeypatch.setattr(aliccp, "_chunk_table", failing)
    path = tmp_path / "cut.parquet"
    with pytest.raises(KeyboardInterrupt):
        rk.datasets.generate("aliccp_synth", 100_000, path)
    assert not path.exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"split": "valid"}, r"no split 'valid'; its splits are \['train', 'test'\]"),
    ({"rows": 0}, "rows must be a positive int"),
    ({"rows": 10.5}, "rows must be a positive int"),
    ({"rows": True}, "rows must be a positive int"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    arguments = {"rows": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        rk.datasets.generate("aliccp_synth", path=tmp_path / "x.parquet", **arguments)
    if "split" in kwargs:
        with pytest.raises(ValueError, match=message):
            rk.datasets.load("aliccp_synth", split=kwargs["split"])
