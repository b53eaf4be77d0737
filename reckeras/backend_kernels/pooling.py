"""Pooled embedding lookup: gather rows of a packed table and reduce per bag.

Forward index (kept from the forward pass): for every id in the packed batch,
``unique_index`` (its position among the unique rows of the batch),
``destination`` (the flat ``[B * F]`` slot its bag writes to, so results land
directly in the ``[B, F, D]`` layout the dense network reads) and
``id_weight`` (the combiner's scale, 1, 1/len or 1/sqrt(len), times optional
per-id weights).

Backward: the gradient of every id is ``grad_out[destination] * id_weight``;
summed per unique row it is handed to ``apply_row_grads(rows, grads)``, which
runs the sparse optimizer on those rows. The table is not a leaf of the
autograd graph; the dense network's gradient still flows through ``anchor``, a
zero-size tensor that requires grad, so torch calls this backward.
"""

import torch

from reckeras.backend_kernels.aggregation import aggregate_row_grads


def pooled_lookup_reference(weights, unique_rows, unique_index, destination,
                            id_weight, num_slots):
    """``[num_slots, D]`` with ``out[destination[i]] += w[row_i] * id_weight[i]``."""
    gathered = weights[unique_rows].float()[unique_index]
    gathered = gathered * id_weight.unsqueeze(1)
    out = torch.zeros(num_slots, weights.shape[1], dtype=torch.float32,
                      device=weights.device)
    return out.index_add_(0, destination, gathered)


class PooledLookup(torch.autograd.Function):
    """Pooled lookup whose backward applies the sparse optimizer."""

    @staticmethod
    def forward(ctx, anchor, weights, unique_rows, unique_index, destination,
                id_weight, num_slots, apply_row_grads):
        ctx.save_for_backward(unique_rows, unique_index, destination, id_weight)
        ctx.apply_row_grads = apply_row_grads
        return pooled_lookup_reference(weights, unique_rows, unique_index,
                                       destination, id_weight, num_slots)

    @staticmethod
    def backward(ctx, grad_out):
        unique_rows, unique_index, destination, id_weight = ctx.saved_tensors
        row_grads = aggregate_row_grads(grad_out, unique_index, destination,
                                        id_weight, unique_rows.numel())
        ctx.apply_row_grads(unique_rows, row_grads)
        return (None,) * 8
