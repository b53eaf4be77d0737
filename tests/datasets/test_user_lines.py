"""`from_user_lines`: the rows of a `user item item ...` file against the
lines, batching, and errors naming the file and line."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reckeras as rk


def write(tmp_path, text, name="train.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_reads_rows_in_file_order(tmp_path):
    path = write(tmp_path, "0 12 7 301\n1\t5\n\n2\n3 7 7\n")
    data = rk.datasets.from_user_lines(path)
    table = data.to_table()
    assert table.schema.names == ["user_id", "item_id"]
    assert table["user_id"].to_pylist() == [0, 0, 0, 1, 3, 3]
    assert table["item_id"].to_pylist() == [12, 7, 301, 5, 7, 7]
    assert data.label is None and data.name == "train.txt" and data.files == [str(path)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**12),
                          st.lists(st.integers(0, 10**12), max_size=8)),
                min_size=1, max_size=40))
def test_matches_the_lines(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("lines") / "f.txt"
    path.write_text("".join(f"{u} {' '.join(map(str, items))}\n" for u, items in lines))
    table = rk.datasets.from_user_lines(path).to_table()
    assert table["user_id"].to_pylist() == [u for u, items in lines for _ in items]
    assert table["item_id"].to_pylist() == [i for _, items in lines for i in items]


def test_batches_and_shards_cover_every_row(tmp_path):
    rng = np.random.default_rng(0)
    lines = [f"{u} " + " ".join(map(str, rng.integers(0, 1000, 300))) for u in range(500)]
    data = rk.datasets.from_user_lines(write(tmp_path, "\n".join(lines)))
    assert data.num_rows == 150_000
    shards = [np.concatenate([b.column("item_id").to_numpy() for b in data.batches(
        4096, shuffle=True, seed=1, shard_index=i, num_shards=2)]) for i in range(2)]
    everything = data.to_table()["item_id"].to_numpy()
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.sort(everything))


@pytest.mark.parametrize("text, message", [
    ("0 1 2\n1 x 3\n", r"train.txt, line 2: 'x' is not an integer id"),
    ("0 1 2.5\n", r"line 1: '2.5' is not an integer id"),
    ("0 1\n\n2 -4\n", r"line 3: negative id -4"),
    ("0 99999999999999999999\n", r"line 1: '99999999999999999999' is not an integer"),
    ("", r"train.txt: the file has no lines"),
    ("\n  \n", r"train.txt: the file has no lines"),
])
def test_bad_files_name_the_file_and_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        rk.datasets.from_user_lines(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        rk.datasets.from_user_lines(tmp_path / "none.txt")
