"""Backward aggregation: pooled gradients -> one gradient per unique row."""

import torch


def aggregate_row_grads(grad_out, unique_index, destination, id_weight,
                        num_unique):
    """Sums ``grad_out[destination[i]] * id_weight[i]`` per ``unique_index[i]``.

    Args:
        grad_out: ``[num_slots, D]`` gradient of the pooled output.
        unique_index: int64 ``[n]``, each id's position among the unique rows.
        destination: int64 ``[n]``, each id's output slot.
        id_weight: float ``[n]``, each id's pooling scale.
        num_unique: number of unique rows.

    Returns:
        float32 ``[num_unique, D]``.
    """
    per_id = grad_out.float()[destination] * id_weight.unsqueeze(1)
    out = torch.zeros(num_unique, grad_out.shape[1], dtype=torch.float32,
                      device=grad_out.device)
    return out.index_add_(0, unique_index, per_id)


def unique_rows(rows, num_rows):
    """Dedup of row indices by marking, ``O(n + num_rows)`` with no sort.

    Rows are small dense integers (``0 <= row < num_rows``), so a mark array
    replaces ``torch.unique``'s sort, which dominates the CPU step.

    Returns:
        ``(unique, unique_index)``: the sorted distinct rows and, for each
        input, its position in ``unique``.
    """
    size = max(num_rows, 1)
    mark = torch.zeros(size, dtype=torch.bool, device=rows.device)
    mark[rows] = True
    unique = mark.nonzero().squeeze(1)
    position = torch.empty(size, dtype=torch.int64, device=rows.device)
    position[unique] = torch.arange(unique.numel(), device=rows.device)
    return unique, position[rows]
