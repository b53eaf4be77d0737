import itertools

import numpy as np
import pytest

from reckeras.datasets._stats import roc_auc


def mann_whitney(labels, scores):
    """Pair-counting AUC: the definition, with ties worth one half."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0
               for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_hand_case_with_ties():
    assert roc_auc([0, 1, 1, 0], [0.1, 0.8, 0.4, 0.4]) == 0.875


def test_matches_pair_counting_on_tied_random_scores():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = rng.integers(0, 12, 300).astype(float)  # many ties
    assert roc_auc(labels, scores) == pytest.approx(mann_whitney(labels, scores),
                                                    abs=1e-12)


def test_perfect_and_reversed_scores():
    assert roc_auc([0, 0, 1, 1], [1, 2, 3, 4]) == 1.0
    assert roc_auc([0, 0, 1, 1], [4, 3, 2, 1]) == 0.0
    assert roc_auc([0, 1], [5, 5]) == 0.5


@pytest.mark.parametrize("labels, scores, message", [
    ([1, 1], [0.1, 0.2], "both classes"),
    ([0, 2], [0.1, 0.2], "0 or 1"),
    ([0, 1], [0.1, float("nan")], "NaN"),
    ([0, 1, 0], [0.1, 0.2], "1-D"),
])
def test_rejects_bad_input(labels, scores, message):
    with pytest.raises(ValueError, match=message):
        roc_auc(labels, scores)
