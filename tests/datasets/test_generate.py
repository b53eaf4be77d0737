import pyarrow.parquet as pq
import pytest

import reckeras.datasets as rkd


def test_same_arguments_write_identical_files(tmp_path):
    first = rkd.generate("criteo_synth", 3_000, tmp_path / "a.parquet", seed=5)
    second = rkd.generate("criteo_synth", 3_000, tmp_path / "b.parquet", seed=5)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert first.num_rows == second.num_rows == 3_000
    assert not list(tmp_path.glob("*.partial"))


def test_seed_and_split_change_the_rows(tmp_path):
    def rows(**kwargs):
        path = tmp_path / f"{sorted(kwargs.items())}.parquet"
        return rkd.generate("criteo_synth", 500, path, **kwargs).to_table()

    base = rows(seed=1)
    assert not base.equals(rows(seed=2))
    assert not base.equals(rows(seed=1, split="test"))
    assert not base.equals(rows())


def test_shorter_files_are_prefixes_of_longer_ones(tmp_path):
    short = rkd.generate("criteo_synth", 100, tmp_path / "s.parquet", seed=3)
    long = rkd.generate("criteo_synth", 70_000, tmp_path / "l.parquet", seed=3)
    assert short.to_table().equals(long.to_table().slice(0, 100))
    assert pq.ParquetFile(long.files[0]).num_row_groups == 2


def test_metadata_and_progress_bar(tmp_path, capsys):
    data = rkd.generate("criteo_synth", 200, tmp_path / "nested" / "m.parquet",
                        split="test", seed=9)
    assert "criteo_synth:test" in capsys.readouterr().err
    assert data.name == "criteo_synth:test"
    assert data.metadata["rows"] == 200
    assert data.metadata["seed"] == 9
    assert data.metadata["cardinalities"]["C3"] == 1_000_000


@pytest.mark.parametrize("args, message", [
    (("nope", 10), "criteo_synth"),
    (("criteo_synth", 0), "rows"),
    (("criteo_synth", 10.5), "rows"),
    (("criteo_synth", True), "rows must be a positive int"),
    (("taobao_synth", None), "rows must be a positive int"),
])
def test_bad_arguments(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        rkd.generate(*args, tmp_path / "x.parquet")


def test_unknown_split(tmp_path):
    with pytest.raises(ValueError, match="valid|splits"):
        rkd.generate("criteo_synth", 10, tmp_path / "x.parquet", split="dev")
