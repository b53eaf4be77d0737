import numpy as np
import pyarrow.parquet as pq
import pytest

import reckeras.datasets as rkd

NUMERIC = [f"I{i}" for i in range(1, 14)]
CATEGORICAL = [f"C{i}" for i in range(1, 27)]


@pytest.fixture(scope="module")
def train():
    return rkd.load("criteo_synth", split="train")


@pytest.fixture(scope="module")
def test():
    return rkd.load("criteo_synth", split="test")


@pytest.fixture(scope="module")
def test_table(test):
    return test.to_table()


def test_list():
    assert rkd.list() == ["aliccp_synth", "criteo_synth", "longtail_synth",
                          "retrieval_synth", "taobao_synth"]


def test_unknown_name_and_split_list_the_valid_ones():
    with pytest.raises(ValueError, match="criteo_synth"):
        rkd.load("criteo")
    with pytest.raises(ValueError, match=r"\['train', 'test'\]"):
        rkd.load("criteo_synth", split="validation")


def test_sizes_names_and_row_groups(train, test):
    assert train.num_rows >= 200_000
    assert test.num_rows >= 50_000
    assert (train.name, test.name) == ("criteo_synth:train", "criteo_synth:test")
    assert pq.ParquetFile(train.files[0]).num_row_groups >= 3
    assert train.label == "label"


def test_schema(train, test):
    for data in (train, test):
        schema = data.schema
        assert schema.names == ["label"] + NUMERIC + CATEGORICAL + ["teacher_prob"]
        for name in ["label"] + NUMERIC + CATEGORICAL:
            assert str(schema.field(name).type) == "int64"
        assert str(schema.field("teacher_prob").type) == "float"


def test_base_ctr(train, test_table):
    train_labels = train.to_table().column("label").to_numpy()
    for labels in (train_labels, test_table["label"].to_numpy()):
        assert set(np.unique(labels)) == {0, 1}
        assert 0.2 <= labels.mean() <= 0.3


def test_missing_values(test_table):
    null_share = {name: test_table[name].null_count / test_table.num_rows
                  for name in NUMERIC + CATEGORICAL}
    assert 0.3 < null_share["I1"] < 0.5
    assert null_share["I2"] == 0
    assert 0.3 < null_share["C19"] < 0.6
    assert sum(share > 0.05 for share in null_share.values()) >= 10


def test_ids_are_scattered_and_zipf_skewed(test_table):
    ids = test_table["C3"].drop_null().to_numpy()
    assert ids.min() >= 0 and ids.max() > 2**32
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    top_one_percent = max(1, len(counts) // 100)
    assert counts[:top_one_percent].sum() > 0.5 * len(ids)
    assert (counts == 1).sum() > 50  # and a long tail of ids seen once


def test_cardinalities_are_a_few_huge_and_many_small(test):
    cardinalities = test.metadata["cardinalities"]
    assert sorted(cardinalities) == sorted(CATEGORICAL)
    assert sum(n >= 100_000 for n in cardinalities.values()) >= 3
    assert sum(n <= 1_000 for n in cardinalities.values()) >= 13
    assert test.metadata["description"]


def test_bayes_auc_matches_an_independent_count(test, test_table):
    labels = test_table["label"].to_numpy()
    prob = test_table["teacher_prob"].to_numpy()
    negatives = np.sort(prob[labels == 0])
    positives = prob[labels == 1]
    below = np.searchsorted(negatives, positives, side="left")
    not_above = np.searchsorted(negatives, positives, side="right")
    expected = (below + not_above).sum() / 2 / (len(positives) * len(negatives))
    assert test.bayes_auc() == pytest.approx(expected, abs=1e-12)
    assert 0.75 <= test.bayes_auc() <= 0.85


def test_packaged_split_is_what_generate_writes(tmp_path, test_table):
    prefix = rkd.generate("criteo_synth", 1_000, tmp_path / "t.parquet",
                          split="test").to_table()
    assert prefix.equals(test_table.slice(0, 1_000))
