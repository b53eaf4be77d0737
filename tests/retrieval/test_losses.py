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


def hit_pairs(dense):
    """The `(rows, columns)` of a dense hit mask, as `accidental_hits` gives them."""
    rows, columns = np.nonzero(dense)
    return torch.tensor(rows), torch.tensor(columns)


def test_accidental_hits_pair_equal_ids_but_the_positive():
    _, ids, pos = case()
    rows, columns = R.accidental_hits(torch.tensor(ids[pos]), torch.tensor(ids),
                                      torch.tensor(pos))
    expected = hits_reference(ids, pos)
    np.testing.assert_array_equal(rows.numpy(), expected.nonzero()[0])
    np.testing.assert_array_equal(columns.numpy(), expected.nonzero()[1])
    # Row 0 (id 4): columns 2 and 7 are id 4 too; row 1 (id 7): column 5.
    assert expected[0].tolist() == [False, False, True, False, False, False, False, True]
    assert expected[1].nonzero()[0].tolist() == [5]


def test_accidental_hits_of_a_large_skewed_batch_match_the_dense_comparison():
    rng = np.random.default_rng(5)
    ids = rng.zipf(1.3, 700) % 50                       # many repeats
    pos = rng.permutation(700)[:300]                    # positives anywhere
    rows, columns = R.accidental_hits(torch.tensor(ids[pos]), torch.tensor(ids),
                                      torch.tensor(pos))
    dense = (ids[pos][:, None] == ids[None, :]) & (np.arange(700)[None, :] != pos[:, None])
    np.testing.assert_array_equal(rows.numpy(), dense.nonzero()[0])
    np.testing.assert_array_equal(columns.numpy(), dense.nonzero()[1])


def test_a_dense_hit_mask_is_refused():
    scores, ids, pos = case()
    dense = torch.tensor(hits_reference(ids, pos))
    for loss in (R.sampled_softmax_loss, R.bpr_loss, R.cosine_contrastive_loss):
        with pytest.raises(ValueError, match=r"hits must be the \(rows, columns\)"):
            loss(torch.tensor(scores), torch.tensor(pos), hits=dense)


def test_sampled_softmax_with_temperature_logq_and_hits():
    scores, ids, pos = case()
    log_q = np.log(np.array([0.5, 0.1, 0.5, 0.05, 0.2, 0.1, 0.01, 0.5], np.float32))
    hits = hits_reference(ids, pos)
    loss = R.sampled_softmax_loss(*[torch.tensor(a) for a in (scores, pos)],
                                  temperature=0.5, log_q=torch.tensor(log_q),
                                  hits=hit_pairs(hits))
    expected = []
    for i in range(len(pos)):
        logits = [scores[i, j] / 0.5 - log_q[j] for j in range(scores.shape[1])
                  if not hits[i, j]]
        positive = scores[i, pos[i]] / 0.5 - log_q[pos[i]]
        expected.append(np.log(np.sum(np.exp(logits))) - positive)
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_sampled_softmax_takes_a_log_q_per_cell():
    """`log_q` of shape `[B, N]` corrects each cell by its own value (a
    column whose candidate differs by row); its gradient is per cell."""
    scores, ids, pos = case()
    rng = np.random.default_rng(5)
    log_q = np.log(rng.uniform(0.01, 0.9, size=scores.shape)).astype(np.float32)
    hits = hits_reference(ids, pos)
    log_q_tensor = torch.tensor(log_q, requires_grad=True)
    loss = R.sampled_softmax_loss(*[torch.tensor(a) for a in (scores, pos)],
                                  temperature=0.5, log_q=log_q_tensor, hits=hit_pairs(hits))
    expected = []
    for i in range(len(pos)):
        logits = [scores[i, j] / 0.5 - log_q[i, j] for j in range(scores.shape[1])
                  if not hits[i, j]]
        expected.append(np.log(np.sum(np.exp(logits))) - (scores[i, pos[i]] / 0.5
                                                           - log_q[i, pos[i]]))
    np.testing.assert_allclose(loss.detach().numpy(), expected, rtol=1e-5)
    loss.sum().backward()
    plain = torch.tensor(scores) / 0.5 - torch.tensor(log_q)
    plain = plain.masked_fill(torch.tensor(hits), -torch.inf).requires_grad_()
    torch.nn.functional.cross_entropy(plain, torch.tensor(pos), reduction="sum").backward()
    np.testing.assert_allclose(log_q_tensor.grad.numpy(), -plain.grad.numpy(), atol=1e-6)


def test_sampled_softmax_without_corrections_is_plain_cross_entropy():
    scores, _, pos = case(1)
    loss = R.sampled_softmax_loss(torch.tensor(scores), torch.tensor(pos))
    shifted = scores - scores.max(axis=1, keepdims=True)
    expected = -(shifted[np.arange(5), pos] - np.log(np.exp(shifted).sum(axis=1)))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_bpr_averages_pairs_over_the_negatives_left():
    scores, ids, pos = case(2)
    hits = hits_reference(ids, pos)
    loss = R.bpr_loss(torch.tensor(scores), torch.tensor(pos), hits=hit_pairs(hits))
    expected = []
    for i in range(len(pos)):
        pairs = [np.log1p(np.exp(-(scores[i, pos[i]] - scores[i, j])))
                 for j in range(scores.shape[1]) if j != pos[i] and not hits[i, j]]
        expected.append(np.mean(pairs))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_cosine_contrastive_loss_by_hand():
    # One row: positive cosine 0.9; negatives 0.5, 0.2 and an accidental hit.
    scores = torch.tensor([[0.9, 0.5, 0.2, 0.95]])
    hits = (torch.tensor([0]), torch.tensor([3]))
    loss = R.cosine_contrastive_loss(scores, torch.tensor([0]), margin=0.3,
                                     negative_weight=2.0, hits=hits)
    # (1 - 0.9) + 2 * mean(relu(0.5 - 0.3), relu(0.2 - 0.3)) = 0.1 + 2 * 0.1
    np.testing.assert_allclose(loss.numpy(), [0.3], rtol=1e-6)


def test_cosine_contrastive_loss_against_a_loop():
    scores, ids, pos = case(3)
    scores = np.tanh(scores)
    hits = hits_reference(ids, pos)
    loss = R.cosine_contrastive_loss(torch.tensor(scores), torch.tensor(pos), margin=0.1,
                                     negative_weight=5.0, hits=hit_pairs(hits))
    expected = []
    for i in range(len(pos)):
        negatives = [max(scores[i, j] - 0.1, 0.0) for j in range(scores.shape[1])
                     if j != pos[i] and not hits[i, j]]
        expected.append(1 - scores[i, pos[i]] + 5.0 * np.mean(negatives))
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)


def test_sampled_softmax_gradients_equal_the_plain_cross_entropy():
    # The loss computes its own backward: against torch autograd through
    # scale, shift, mask and cross_entropy, for the scores and log q.
    scores, ids, pos = case(6)
    weights = torch.tensor([0.5, 2.0, 1.0, 0.0, 3.0])
    log_q = np.log(np.linspace(0.05, 0.9, 8)).astype(np.float32)
    dense = hits_reference(ids, pos)
    s1, q1 = (torch.tensor(a, requires_grad=True) for a in (scores, log_q))
    (R.sampled_softmax_loss(s1, torch.tensor(pos), 0.3, q1, hit_pairs(dense))
     * weights).sum().backward()
    s2, q2 = (torch.tensor(a, requires_grad=True) for a in (scores, log_q))
    logits = (s2 / 0.3 - q2[None, :]).masked_fill(torch.tensor(dense), -1e30)
    (torch.nn.functional.cross_entropy(logits, torch.tensor(pos), reduction="none")
     * weights).sum().backward()
    np.testing.assert_allclose(s1.grad.numpy(), s2.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(q1.grad.numpy(), q2.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert (s1.grad.numpy()[dense] == 0).all()


def test_sampled_softmax_is_exact_where_the_positive_probability_underflows():
    # exp(-20000) is 0 in float32: the loss is still the logit gap, finite.
    scores = torch.tensor([[100.0, -100.0, 50.0]], requires_grad=True)
    loss = R.sampled_softmax_loss(scores, torch.tensor([1]), temperature=0.01)
    np.testing.assert_allclose(loss.detach().numpy(), [20000.0], rtol=1e-6)
    loss.sum().backward()
    np.testing.assert_allclose(scores.grad.numpy(), [[100.0, -100.0, 0.0]], atol=1e-3)


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
