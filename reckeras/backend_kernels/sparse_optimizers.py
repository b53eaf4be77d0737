"""Sparse optimizer updates applied to the unique rows a batch touched.

Each update reads the aggregated gradient of every touched row once and
updates the row and its per-row state in place. Formulas (``g`` the row's
aggregated gradient, ``w`` its weights, ``s`` its state, ``lr`` learning rate):

* SGD: ``w -= lr * g``.
* Adagrad (torch.optim.Adagrad, no decay): ``s += g * g`` (one accumulator per
  element); ``w -= lr * g / (sqrt(s) + eps)``.
* RowWiseAdagrad (one accumulator per row, as in fbgemm/TorchRec):
  ``s += mean(g * g)`` over the row; ``w -= lr * g / (sqrt(s) + eps)``.

State and weights are kept in the table's dtype except the accumulators,
which are float32.
"""

import torch


def sgd_update(weights, rows, grads, lr):
    weights.index_add_(0, rows, (-lr * grads).to(weights.dtype))


def adagrad_update(weights, state, rows, grads, lr, eps):
    grads = grads.float()
    accumulator = state[rows] + grads * grads
    state[rows] = accumulator
    step = lr * grads / (accumulator.sqrt() + eps)
    weights[rows] = (weights[rows].float() - step).to(weights.dtype)


def rowwise_adagrad_update(weights, state, rows, grads, lr, eps):
    grads = grads.float()
    accumulator = state[rows, 0] + (grads * grads).mean(dim=1)
    state[rows, 0] = accumulator
    step = lr * grads / (accumulator.sqrt() + eps).unsqueeze(1)
    weights[rows] = (weights[rows].float() - step).to(weights.dtype)
