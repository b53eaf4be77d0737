"""Retrieval losses against per-row numpy loops."""

import numpy as np
import pytest
import torch

import reckeras as rk
from reckeras.retrieval.losses import check_loss_options

R = rk.retrieval


def case(seed=0, rows=5, extra=3):
    """Scores of 5 rows against their 5 in-batch positives and 3 more
    candidates; the ids repeat, so that some candidates are accidental hits."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(rows, rows + extra)).astype(np.float32)
    candidate_ids = np.array([4, 7, 4, 9, 1, 7, 2, 4])
    positive_index = np.arange(rows)
    return scores, candidate_ids, positive_index


def hits_reference(candidate_ids, positive_index):
    rows = len(positive_index)
    return np.array([[candidate_ids[j] == candidate_ids[positive_index[i]]
                      and j != positive_index[i] for j in range(len(candidate_ids))]
                     for i in range(rows)])


def tensors(scores, candidate_ids, positive_index):
    return torch.tensor(scores), torch.tensor(candidate_ids), torch.tensor(positive_index)


def test_accidental_hits_mask_equal_ids_but_the_positive():
    scores, ids, pos = case()
    hits = R.accidental_hits(torch.tensor(ids[pos]), torch.tensor(ids), torch.tensor(pos))
    expected = hits_reference(ids, pos)
    np.testing.assert_array_equal(hits.numpy(), expected)
    # Row 0 (id 4): columns 2 and 7 are id 4 too; row 1 (id 7): column 5.
    assert expected[0].tolist() == [False, False, True, False, False, False, False, True]
    assert expected[1].nonzero()[0].tolist() == [5]


def test_sampled_softmax_with_temperature_logq_and_hits():
    scores, ids, pos = case()
    log_q = np.log(np.array([0.5, 0.1, 0.5, 0.05, 0.2, 0.1, 0.01, 0.5], np.float32))
    hits = hits_reference(ids, pos)
    loss = R.sampled_softmax_loss(*[torch.tensor(a) for a in (scores, pos)],
                                  temperature=0.5, log_q=torch.tensor(log_q),
                                  hits=torch.tensor(hits))
    expected = []
    for i in range(len(pos)):
        logits = [scores[i, j] / 0.5 - log_q[j] for j in range(scores.shape[1])
                  if not hits[i, j]]
        positive = scores[i, pos[i]] / 0.5 - log_q[pos[i]]
        expected.append(np.log(np.sum(np.exp(logits))) - positive)
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_sampled_softmax_without_corrections_is_plain_cross_entropy():
    scores, _, pos = case(1)
    loss = R.sampled_softmax_loss(torch.tensor(scores), torch.tensor(pos))
    shifted = scores - scores.max(axis=1, keepdims=True)
    expected = -(shifted[np.arange(5), pos] - np.log(np.exp(shifted).sum(axis=1)))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_bpr_averages_pairs_over_the_negatives_left():
    scores, ids, pos = case(2)
    hits = hits_reference(ids, pos)
    loss = R.bpr_loss(torch.tensor(scores), torch.tensor(pos), hits=torch.tensor(hits))
    expected = []
    for i in range(len(pos)):
        pairs = [np.log1p(np.exp(-(scores[i, pos[i]] - scores[i, j])))
                 for j in range(scores.shape[1]) if j != pos[i] and not hits[i, j]]
        expected.append(np.mean(pairs))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_cosine_contrastive_loss_by_hand():
    # One row: positive cosine 0.9; negatives 0.5, 0.2 and an accidental hit.
    scores = torch.tensor([[0.9, 0.5, 0.2, 0.95]])
    hits = torch.tensor([[False, False, False, True]])
    loss = R.cosine_contrastive_loss(scores, torch.tensor([0]), margin=0.3,
                                     negative_weight=2.0, hits=hits)
    # (1 - 0.9) + 2 * mean(relu(0.5 - 0.3), relu(0.2 - 0.3)) = 0.1 + 2 * 0.1
    np.testing.assert_allclose(loss.numpy(), [0.3], rtol=1e-6)


def test_cosine_contrastive_loss_against_a_loop():
    scores, ids, pos = case(3)
    scores = np.tanh(scores)
    hits = hits_reference(ids, pos)
    loss = R.cosine_contrastive_loss(torch.tensor(scores), torch.tensor(pos), margin=0.1,
                                     negative_weight=5.0, hits=torch.tensor(hits))
    expected = []
    for i in range(len(pos)):
        negatives = [max(scores[i, j] - 0.1, 0.0) for j in range(scores.shape[1])
                     if j != pos[i] and not hits[i, j]]
        expected.append(1 - scores[i, pos[i]] + 5.0 * np.mean(negatives))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_gradients_flow_to_the_scores():
    scores, _, pos = case(4)
    for loss in (R.sampled_softmax_loss, R.bpr_loss, R.cosine_contrastive_loss):
        s = torch.tensor(scores, requires_grad=True)
        loss(s, torch.tensor(pos)).mean().backward()
        assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


@pytest.mark.parametrize("options, message", [
    (("ranknet", 1.0, 0.0, 1.0), "loss must be one of"),
    (("softmax", 0.0, 0.0, 1.0), "temperature must be"),
    (("softmax", 1.0, 1.0, 1.0), "margin must be"),
    (("softmax", 1.0, 0.0, -1.0), "negative_weight must be"),
])
def test_loss_options_are_checked_naming_the_owner(options, message):
    with pytest.raises(ValueError, match=f"two_tower: {message}"):
        check_loss_options("two_tower", *options)
