"""`retrieval_synth`: splits and schema, the packaged files against what
`generate` writes, the per-user time cut, popularity skew, and the teacher's
Recall@K recomputed user by user from the files and the teacher's logits."""

import numpy as np
import pytest

import reckeras as rk
from reckeras.datasets import retrieval
from reckeras.datasets._registry import DATA_DIR

COLUMNS = ["user_id", "item_id", "timestamp", "item_category", "user_segment"]
HELD_OUT = ("valid", "test")


@pytest.fixture(scope="module")
def tables():
    return {split: rk.datasets.load("retrieval_synth", split=split).to_table()
            for split in retrieval.SPLITS}


def test_splits_schema_and_size(tables):
    assert "retrieval_synth" in rk.datasets.list()
    for split in ("train", *HELD_OUT):
        table = tables[split]
        assert table.schema.names == COLUMNS
        assert all(str(t) == "int64" for t in table.schema.types)
        assert set(np.unique(table["user_id"].to_numpy())) == set(range(retrieval.USERS))
        items = table["item_id"].to_numpy()
        assert items.min() >= 0 and items.max() < retrieval.ITEMS
    assert tables["items"]["item_id"].to_pylist() == list(range(retrieval.ITEMS))
    categories = dict(zip(*(tables["items"][c].to_numpy()
                            for c in ("item_id", "item_category")), strict=True))
    train = tables["train"]
    assert all(categories[i] == c for i, c in zip(
        train["item_id"].to_numpy(), train["item_category"].to_numpy(), strict=True))
    sizes = sum((DATA_DIR / f"retrieval_synth_{s}.parquet").stat().st_size
                for s in retrieval.SPLITS)
    assert sizes <= 2_000_000
    assert rk.datasets.load("retrieval_synth", "train").label is None
    with pytest.raises(ValueError, match=r"'train', 'valid', 'test', 'items'"):
        rk.datasets.load("retrieval_synth", split="dev")


def per_user(table, column, reduce):
    """`reduce` (np.maximum or np.minimum) of a column over each user's rows."""
    out = np.full(retrieval.USERS, np.iinfo(np.int64).min if reduce is np.maximum
                  else np.iinfo(np.int64).max)
    reduce.at(out, table["user_id"].to_numpy(), table[column].to_numpy())
    return out


def test_each_user_is_cut_by_time(tables):
    sizes = {split: np.bincount(tables[split]["user_id"].to_numpy(),
                                minlength=retrieval.USERS)
             for split in ("train", *HELD_OUT)}
    counts = sum(sizes.values())
    assert counts.min() >= 10
    held = np.ceil(counts * 0.1 - 1e-9)
    for split in HELD_OUT:
        np.testing.assert_array_equal(sizes[split], held)
    assert (per_user(tables["train"], "timestamp", np.maximum)
            <= per_user(tables["valid"], "timestamp", np.minimum)).all()
    assert (per_user(tables["valid"], "timestamp", np.maximum)
            <= per_user(tables["test"], "timestamp", np.minimum)).all()
    # Items are distinct within a user, across the three splits.
    every = np.concatenate([np.stack([tables[split][c].to_numpy()
                                      for c in ("user_id", "item_id")], axis=1)
                            for split in sizes])
    assert len(np.unique(every, axis=0)) == len(every)


def test_popularity_is_skewed(tables):
    counts = np.sort(np.bincount(tables["train"]["item_id"].to_numpy(),
                                 minlength=retrieval.ITEMS))[::-1]
    # The top 1% of the items take far more than 1% of the interactions.
    assert counts[:20].sum() / counts.sum() > 0.08
    assert counts[-200:].sum() / counts.sum() < 0.05


@pytest.mark.parametrize("split", HELD_OUT)
def test_packaged_files_are_what_generate_writes(tmp_path, split):
    path = tmp_path / f"{split}.parquet"
    rk.datasets.generate("retrieval_synth", retrieval.USERS, path, split=split)
    assert path.read_bytes() == (DATA_DIR / f"retrieval_synth_{split}.parquet").read_bytes()


def test_users_are_prefixes_and_seeds_replicate(tmp_path, tables):
    few = rk.datasets.generate("retrieval_synth", 1_500, tmp_path / "a.parquet").to_table()
    expected = tables["train"].filter(tables["train"]["user_id"].to_numpy() < 1_500)
    assert few.equals(expected)
    replica = rk.datasets.generate("retrieval_synth", 1_500, tmp_path / "r.parquet",
                                   seed=7).to_table()
    assert not replica.equals(few)
    with pytest.raises(ValueError, match="positive int"):
        rk.datasets.generate("retrieval_synth", 0, tmp_path / "z.parquet")


def test_teacher_recall_recomputed_user_by_user(tables):
    """The stored Recall@K equals the teacher's top K, user by user, scored
    against the files' held-out items (train items left out)."""
    logits = np.concatenate([made["logits"] for made in
                             retrieval._user_chunks(retrieval.USERS, None)])
    train = tables["train"]
    for split in HELD_OUT:
        stored = rk.datasets.load("retrieval_synth", split)
        held = tables[split]
        recalls = {k: [] for k in retrieval.RECALL_KS}
        for user in range(0, retrieval.USERS, 7):      # every 7th user
            seen = train["item_id"].to_numpy()[train["user_id"].to_numpy() == user]
            relevant = set(held["item_id"].to_numpy()[held["user_id"].to_numpy() == user])
            scores = logits[user].copy()
            scores[seen] = -np.inf
            ranking = sorted(range(retrieval.ITEMS), key=lambda i: -scores[i])
            for k in recalls:
                recalls[k].append(len(relevant & set(ranking[:k])) / len(relevant))
        for k, values in recalls.items():
            # A seventh of the users: the mean is within a few standard errors.
            assert np.mean(values) == pytest.approx(stored.teacher_recall(k), abs=0.03)
        assert 0.25 < stored.teacher_recall(20) < 0.4
        assert stored.teacher_recall(10) < stored.teacher_recall(20) < stored.teacher_recall(100)


def test_teacher_recall_errors():
    with pytest.raises(ValueError, match="carries no teacher recall"):
        rk.datasets.load("retrieval_synth", "train").teacher_recall(20)
    with pytest.raises(ValueError, match=r"\[10, 20, 50, 100\], not 30"):
        rk.datasets.load("retrieval_synth", "test").teacher_recall(30)
