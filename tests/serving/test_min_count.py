"""`export_serving(..., min_count=k)`: only rows seen in at least k training
steps are exported (hand-counted case of tests/embedding/test_seen_steps.py),
the manifest records it, a dropped id predicts as an unseen one, and a bad
min_count (or one above the 2047 a count saturates at) is refused."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import reckeras.serving
from reckeras.serving import artifact

sys.path.insert(0, str(Path(__file__).parents[1] / "embedding"))
from test_seen_steps import HAND_COUNTS, build, key, train  # noqa: E402


@pytest.fixture(scope="module")
def model():
    trained = build()
    train(trained, range(3))
    return trained


def one_example(a):
    return {"n": [0.5], "a": [a], "b": [999]}


@pytest.mark.parametrize("min_count", [None, 1, 2, 3, 4])
@pytest.mark.slow
def test_only_rows_seen_often_enough_are_exported(model, tmp_path, min_count):
    path = model.export_serving(tmp_path / "m", min_count=min_count)
    expected = {key(raw) for raw, count in HAND_COUNTS.items()
                if min_count is None or count >= min_count}
    stored = load_file(str(Path(path) / artifact.table_file(0, 0, 0)))
    assert set(stored["keys"].tolist()) == expected
    assert len(stored["rows"]) == len(expected)
    manifest = json.loads((Path(path) / artifact.MANIFEST).read_text())
    assert manifest["min_count"] == min_count
    assert manifest["embedding_layers"][0]["tables"][0]["num_rows"] == len(expected)


def test_a_dropped_id_predicts_as_an_unseen_id(model, tmp_path):
    kept = reckeras.serving.load(model.export_serving(tmp_path / "k", min_count=2))
    every = reckeras.serving.load(model.export_serving(tmp_path / "e"))
    unseen = kept.predict(one_example(12345))
    # Id 1 was seen in one step: dropped, it reads zeros like id 12345.
    np.testing.assert_array_equal(kept.predict(one_example(1)), unseen)
    assert not np.array_equal(every.predict(one_example(1)), unseen)
    # Ids 2 and 3 are kept with their trained rows.
    for raw in (2, 3):
        np.testing.assert_array_equal(kept.predict(one_example(raw)),
                                      every.predict(one_example(raw)))
        np.testing.assert_allclose(kept.predict(one_example(raw)),
                                   model.predict(one_example(raw), verbose=0), atol=1e-5)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_min_count_is_refused(model, tmp_path, bad):
    with pytest.raises(ValueError, match="min_count must be an int >= 1"):
        model.export_serving(tmp_path / "m", min_count=bad)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("above", [2048, 10**6])
def test_a_min_count_above_the_saturated_count_is_refused(model, tmp_path, above):
    # A row's count saturates at 2047: no row could reach a larger min_count.
    with pytest.raises(ValueError, match=f"min_count must be at most 2047.*{above}"):
        model.export_serving(tmp_path / "m", min_count=above)
    assert not (tmp_path / "m").exists()
