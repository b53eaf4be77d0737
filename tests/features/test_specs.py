import json

import pytest

import reckeras as rk
from reckeras.features import specs as spec_module
from reckeras.features.plan import TablePlanError, TransformPlan


@pytest.mark.parametrize("make, message", [
    (lambda: rk.features.Categorical("c", dim=0), "dim"),
    (lambda: rk.features.Categorical("c", dim=4, hash_buckets=0), "hash_buckets"),
    (lambda: rk.features.Categorical("c", dim=4, boundaries=[1.0, 1.0]), "increasing"),
    (lambda: rk.features.Categorical("c", dim=4, boundaries=[]), "non-empty"),
    (lambda: rk.features.Categorical("c", dim=4, dtype="float"), "dtype"),
    (lambda: rk.features.Numeric("n", transform="sqrt"), "unknown transform"),
    (lambda: rk.features.Numeric("n", default=float("nan")), "finite"),
    (lambda: rk.features.Numeric("n", shape=3), "shape must be \\(\\) or a 1-tuple"),
    (lambda: rk.features.Numeric("n", shape=None), "shape must be"),
    (lambda: rk.features.Numeric("n", shape=(2, 3)), "shape must be"),
    (lambda: rk.features.Numeric("n", shape=(0,)), "shape\\[0\\] must be an int >= 1"),
    (lambda: rk.features.Numeric("n", shape=(-4,)), "shape\\[0\\]"),
    (lambda: rk.features.Numeric("n", shape=(2.0,)), "shape\\[0\\]"),
    (lambda: rk.features.Numeric("n", shape=(True,)), "shape\\[0\\]"),
    (lambda: rk.features.Sequence("s", dim=4, max_len=0), "max_len"),
    (lambda: rk.features.Sequence("s", dim=4, max_len=3, combiner="max"), "combiner"),
    (lambda: rk.features.Cross(["a"], dim=4, hash_buckets=10), "2 or 3"),
    (lambda: rk.features.Cross(["a", "a"], dim=4, hash_buckets=10), "2 or 3"),
    (lambda: rk.features.Categorical("", dim=4), "non-empty string"),
])
def test_specs_validate_eagerly(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_error_names_the_feature():
    with pytest.raises(ValueError, match="'clicks'"):
        rk.features.Categorical("clicks", dim=-1)


@pytest.mark.parametrize("spec", [
    rk.features.Numeric("n", transform="log1p", default=-1.0),
    rk.features.Numeric("v", transform="standardize", default=2.5, shape=(64,)),
    rk.features.Numeric("w", shape=(1,)),
    rk.features.Categorical("c", dim=8, table="t", hash_buckets=100),
    rk.features.Categorical("b", dim=8, boundaries=[0, 1.5, 10]),
    rk.features.Categorical("s", dim=8, dtype="string"),
    rk.features.Sequence("h", dim=4, max_len=7, combiner="sqrtn", table="items"),
    rk.features.Cross(["a", "b", "c"], dim=4, hash_buckets=1000),
])
def test_config_round_trip(spec):
    again = spec_module.deserialize(spec_module.serialize(spec))
    assert again == spec and again.get_config() == spec.get_config()


def test_numeric_shape_and_size():
    assert rk.features.Numeric("n").shape == () and rk.features.Numeric("n").size == 1
    vector = rk.features.Numeric("v", shape=[3])        # a list, as JSON gives it back
    assert vector.shape == (3,) and vector.size == 3
    assert vector == rk.features.Numeric("v", shape=(3,))
    assert vector != rk.features.Numeric("v", shape=(4,))
    assert vector.get_config() == {"name": "v", "transform": None, "default": 0.0,
                                   "shape": (3,)}


@pytest.mark.parametrize("spec", [rk.features.Numeric("n"),
                                  rk.features.Numeric("v", shape=(5,), transform="log1p")])
def test_numeric_config_survives_json(spec):
    # Keras writes layer configs as JSON: the shape tuple comes back a list.
    again = spec_module.deserialize(json.loads(json.dumps(spec_module.serialize(spec))))
    assert again == spec and again.shape == spec.shape


def test_shared_table_needs_equal_dims():
    with pytest.raises(TablePlanError, match="table 'items'.*'a'.*'b'"):
        TransformPlan([rk.features.Categorical("a", dim=8, table="items"),
                       rk.features.Sequence("b", dim=4, max_len=3, table="items")])


def test_cross_must_name_declared_categoricals():
    with pytest.raises(ValueError, match="unknown feature 'zz'"):
        TransformPlan([rk.features.Categorical("a", dim=4),
                       rk.features.Cross(["a", "zz"], dim=4, hash_buckets=10)])
    with pytest.raises(ValueError, match="not a Categorical"):
        TransformPlan([rk.features.Categorical("a", dim=4), rk.features.Numeric("n"),
                       rk.features.Cross(["a", "n"], dim=4, hash_buckets=10)])


def test_duplicate_names_rejected():
    with pytest.raises(ValueError, match="duplicate feature names: \\['a'\\]"):
        TransformPlan([rk.features.Categorical("a", dim=4), rk.features.Numeric("a")])
