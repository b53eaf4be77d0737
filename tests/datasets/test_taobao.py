import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import reckeras as rk
from reckeras.datasets import taobao
from reckeras.datasets._registry import DATA_DIR

ROWS = 3000


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("taobao") / "small.parquet"
    return taobao.generate_taobao_synth(ROWS, path, split="test")


def test_columns_and_histories(small):
    table = small.to_table()
    assert table.num_rows == ROWS and small.name == "taobao_synth:test"
    assert table.schema.names == ["label", "user_gender", "user_age", "user_city",
                                  "hist_len", "item", "category", "hist_items",
                                  "hist_cats", "teacher_prob"]
    teacher = taobao._teacher()
    lengths = np.array([len(h) for h in table["hist_items"].to_pylist()])
    assert lengths.min() == 0 and lengths.max() <= taobao.MAX_HISTORY
    assert np.median(lengths) < lengths.mean() < 4 * np.median(lengths)   # long tail
    np.testing.assert_array_equal(lengths, table["hist_len"].to_numpy())
    items = pc.list_flatten(table["hist_items"]).to_numpy()
    np.testing.assert_array_equal(pc.list_flatten(table["hist_cats"]).to_numpy(),
                                  teacher.item_category[items])
    np.testing.assert_array_equal(table["category"].to_numpy(),
                                  teacher.item_category[table["item"].to_numpy()])
    assert 0.2 < table["label"].to_numpy().mean() < 0.5


def test_the_teacher_rewards_a_target_that_matches_the_history(small):
    table = small.to_table()
    prob = table["teacher_prob"].to_numpy()
    repeat = np.array([t in h for t, h in zip(table["item"].to_pylist(),
                                              table["hist_items"].to_pylist())])
    same_category = np.array([t in h for t, h in zip(table["category"].to_pylist(),
                                                     table["hist_cats"].to_pylist())])
    assert prob[repeat].mean() > prob[same_category & ~repeat].mean() + 0.1
    assert prob[same_category & ~repeat].mean() > prob[~same_category].mean() + 0.1
    assert 0.75 < small.bayes_auc() < 0.9


def test_deterministic_prefixes_and_argument_errors(tmp_path, small):
    shorter = taobao.generate_taobao_synth(100, tmp_path / "a.parquet", split="test")
    assert shorter.to_table().equals(small.to_table().slice(0, 100))
    other = taobao.generate_taobao_synth(100, tmp_path / "b.parquet", split="test",
                                         seed=5)
    assert not other.to_table().equals(shorter.to_table())
    with pytest.raises(ValueError, match="has no split 'valid'"):
        taobao.generate_taobao_synth(10, tmp_path / "c.parquet", split="valid")
    with pytest.raises(ValueError, match="rows must be a positive int"):
        taobao.generate_taobao_synth(0, tmp_path / "c.parquet")


@pytest.mark.parametrize("split", ["train", "test"])
def test_packaged_splits(split):
    path = DATA_DIR / f"taobao_synth_{split}.parquet"
    assert pq.read_metadata(path).num_rows == taobao.DEFAULT_ROWS[split]
    sizes = sum((DATA_DIR / f"taobao_synth_{s}.parquet").stat().st_size
                for s in taobao.SPLIT_SEEDS)
    assert sizes <= 8_000_000
    # The packaged rows are the generator's: its first rows regenerate exactly.
    packaged = rk.datasets.load("taobao_synth", split=split)
    first = next(packaged.batches(50))
    again = taobao._chunk_table([taobao.SPLIT_SEEDS[split]], 0).slice(0, 50)
    assert pa.Table.from_batches([first]).equals(again)


CSV = """\
1,10,100,pv,5
1,11,100,pv,3
1,12,101,buy,9
1,13,102,cart,7
2,20,200,fav,1
3,30,300,pv,4
3,31,301,pv,4
"""


@pytest.fixture
def behaviour_csv(tmp_path):
    path = tmp_path / "UserBehavior.csv"
    path.write_text(CSV)
    return path


def test_reader_next_item_targets(behaviour_csv):
    test = taobao.taobao_user_behavior(behaviour_csv, split="test", negatives=0)
    assert test.to_pydict() == {
        "label": [1, 1], "user": [1, 3], "item": [12, 31], "category": [101, 301],
        "hist_len": [3, 1], "hist_items": [[11, 10, 13], [30]],
        "hist_cats": [[100, 100, 102], [300]], "hist_types": [[0, 0, 2], [0]]}
    train = taobao.taobao_user_behavior(behaviour_csv, split="train", negatives=0)
    assert train["item"].to_pylist() == [10, 13]
    assert train["hist_items"].to_pylist() == [[11], [11, 10]]


def test_reader_negatives_history_cut_and_behaviour_filter(behaviour_csv):
    table = taobao.taobao_user_behavior(behaviour_csv, split="test", negatives=2,
                                        max_history=2, seed=1)
    assert table["label"].to_pylist() == [1, 0, 0, 1, 0, 0]
    assert table["user"].to_pylist() == [1, 1, 1, 3, 3, 3]
    assert table["hist_items"].to_pylist()[:3] == [[10, 13]] * 3
    items, categories = table["item"].to_pylist(), table["category"].to_pylist()
    assert items[1] != 12 and items[2] != 12
    # A negative is a real item, with its category.
    pairs = {(10, 100), (11, 100), (12, 101), (13, 102), (20, 200), (30, 300),
             (31, 301)}
    assert set(zip(items, categories)) <= pairs
    views = taobao.taobao_user_behavior(behaviour_csv, negatives=0, behaviors=["pv"])
    assert views["item"].to_pylist() == [10, 31]
    assert views["hist_items"].to_pylist() == [[11], [30]]


def test_reader_errors(behaviour_csv, tmp_path):
    with pytest.raises(ValueError, match="split must be"):
        taobao.taobao_user_behavior(behaviour_csv, split="valid")
    with pytest.raises(ValueError, match="negatives must be an int >= 0"):
        taobao.taobao_user_behavior(behaviour_csv, negatives=-1)
    with pytest.raises(ValueError, match="unknown behaviour types \\['like'\\]"):
        taobao.taobao_user_behavior(behaviour_csv, behaviors=["like"])
    bad = tmp_path / "bad.csv"
    bad.write_text("1,10,100,click,5\n")
    with pytest.raises(ValueError, match="unknown behaviour type 'click'"):
        taobao.taobao_user_behavior(bad)


def test_reader_output_trains_a_model(behaviour_csv):
    table = taobao.taobao_user_behavior(behaviour_csv, split="train", negatives=1)
    columns = rk.layers.FeatureColumns([
        rk.features.Numeric("hist_len", transform="log1p"),
        rk.features.Categorical("item", dim=4, table="item"),
        rk.features.Sequence("hist_items", dim=4, max_len=5, table="item",
                             combiner=None)])
    model = rk.models.din(columns, attention_units=(4,), top_units=(4, 1))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1))
    model.fit(table, batch_size=4, verbose=0)
    assert model.predict(table).shape == (table.num_rows, 1)
