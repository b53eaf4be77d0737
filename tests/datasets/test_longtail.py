"""`longtail_synth`: splits and schema, the packaged files against what
`generate` writes, the Bayes AUC against an independent count, the teacher
recomputed from the columns, and the rarity of its ids."""

import numpy as np
import pytest

import reckeras as rk
from reckeras.datasets import longtail
from reckeras.datasets._registry import DATA_DIR

FIELDS = list(longtail.CARDINALITIES)


@pytest.fixture(scope="module")
def splits():
    return {split: rk.datasets.load("longtail_synth", split=split)
            for split in ("train", "valid", "test")}


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


def test_splits_sizes_and_schema(splits, tables):
    assert "longtail_synth" in rk.datasets.list()
    for split, data in splits.items():
        assert data.num_rows == longtail.DEFAULT_ROWS[split]
        assert data.name == f"longtail_synth:{split}" and data.label == "label"
        table = tables[split]
        assert table.schema.names == ["label", *FIELDS, "teacher_prob"]
        for name in ["label", *FIELDS]:
            assert str(table.schema.field(name).type) == "int64", name
            assert table[name].null_count == 0
        for name, size in longtail.CARDINALITIES.items():
            ids = table[name].to_numpy()
            assert ids.min() >= 0 and ids.max() < size, name
        assert 0.25 < table["label"].to_numpy().mean() < 0.35
    sizes = sum((DATA_DIR / f"longtail_synth_{s}.parquet").stat().st_size
                for s in longtail.SPLIT_SEEDS)
    assert sizes <= 7_000_000


@pytest.mark.parametrize("split", ["valid", "test"])
def test_packaged_files_are_what_generate_writes(tmp_path, split):
    path = tmp_path / f"{split}.parquet"
    rk.datasets.generate("longtail_synth", longtail.DEFAULT_ROWS[split], path, split=split)
    assert path.read_bytes() == (DATA_DIR / f"longtail_synth_{split}.parquet").read_bytes()


def test_generate_is_deterministic_with_prefixes_and_seeds(tmp_path, tables):
    first = rk.datasets.generate("longtail_synth", 70_000, tmp_path / "a.parquet")
    rk.datasets.generate("longtail_synth", 70_000, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert first.to_table().equals(tables["train"].slice(0, 70_000))
    replica = rk.datasets.generate("longtail_synth", 1_000, tmp_path / "r.parquet",
                                   seed=3).to_table()
    assert not replica.equals(tables["train"].slice(0, 1_000))
    assert first.metadata["cardinalities"] == longtail.CARDINALITIES


def test_bayes_auc_is_the_teachers_auc(splits, tables):
    for split in ("valid", "test"):
        table = tables[split]
        expected = counted_auc(table["label"].to_numpy(),
                               table["teacher_prob"].to_numpy())
        assert splits[split].bayes_auc() == pytest.approx(expected, abs=1e-12)
        # The teacher separates the labels far better than chance, less than perfectly.
        assert 0.8 < expected < 0.9


def test_labels_follow_the_teachers_probability(tables):
    table = tables["train"]
    labels, probability = table["label"].to_numpy(), table["teacher_prob"].to_numpy()
    for low, high in [(0.0, 0.1), (0.1, 0.3), (0.3, 0.6), (0.6, 1.0)]:
        bin_ = (probability >= low) & (probability < high)
        assert bin_.sum() > 1_000
        assert labels[bin_].mean() == pytest.approx(probability[bin_].mean(), abs=0.01)


def test_profiles_are_attributes_of_their_user_and_item(tables):
    table = tables["train"]
    for owner, attributes in (("user_id", ("user_gender", "user_age", "user_city")),
                              ("item_id", ("item_category", "item_brand"))):
        owners = table[owner].to_numpy()
        for name in attributes:
            values = table[name].to_numpy()
            pairs = np.unique(np.stack([owners, values]), axis=1)
            assert pairs.shape[1] == len(np.unique(owners)), (owner, name)


def test_most_ids_are_rare(tables):
    table = tables["train"]
    for name, median_at_most, rare_share in (("user_id", 2, 0.9), ("item_id", 3, 0.7)):
        _, counts = np.unique(table[name].to_numpy(), return_counts=True)
        assert np.median(counts) <= median_at_most, name
        # Most ids are seen at most five times, a few thousands of times.
        assert (counts <= 5).mean() > rare_share, name
        assert counts.max() > 1_000, name
    _, user_counts = np.unique(table["user_id"].to_numpy(), return_counts=True)
    # Rare users hold most of the rows: the long tail is where the traffic is.
    assert user_counts[user_counts <= 5].sum() > 0.5 * table.num_rows
    # About one valid row in seven has a user never seen in training.
    seen = np.isin(tables["valid"]["user_id"].to_numpy(), table["user_id"].to_numpy())
    assert 0.1 < 1 - seen.mean() < 0.25


@pytest.mark.parametrize("kwargs, message", [
    ({"split": "validation"},
     r"no split 'validation'; its splits are \['train', 'valid', 'test'\]"),
    ({"rows": 0}, "rows must be a positive int"),
    ({"rows": True}, "rows must be a positive int"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    arguments = {"rows": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        rk.datasets.generate("longtail_synth", path=tmp_path / "x.parquet", **arguments)
