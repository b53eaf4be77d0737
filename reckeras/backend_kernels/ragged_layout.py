"""The layout of a packed batch (`reckeras.ragged`): which ids it keeps and
which bag each id belongs to.

* `compact_present`: the ids of single-valued features whose values are
  present (a null leaves its bag empty) and their bag offsets, in one pass
  where `masked_select` and a `cumsum` took two (`features.plan`).
* `bag_of_ids`: the bag of every id, from the offsets alone
  (`embedding.id_layout`: a batch with missing values reads its layout at
  its ids' bags).

* native CPU kernels (`cpu_native`), where they can be built: one C loop
  each (split over torch's threads), 4-8x faster than the references on
  a 2048-row `wide` batch (614k bags);
* torch reference (CPU without the native kernels, and CUDA): a few torch
  ops each. The family has no Triton kernel: on CUDA each of those ops is
  one device kernel already (`masked_select`, `cumsum`, `repeat_interleave`).

Both entry points are torch ops (`reckeras::compact_present`,
`reckeras::bag_of_ids`; `dispatch.register`).
"""

import torch

from reckeras import ragged
from reckeras.backend_kernels import cpu_native
from reckeras.backend_kernels.dispatch import register


def compact_present(values: torch.Tensor,
                    present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The present values, packed, and the offsets of their bags.

    Entry `i` is bag `i`, which holds `values[i]` when `present[i]` and
    nothing otherwise.

    Args:
        values: int64 `[n]`, one value per bag.
        present: bool `[n]`, whether each bag holds its value.

    Returns:
        `(ids, offsets)`: int64 `[N]`, the present values in order, and
        int64 `[n + 1]` offsets (bag `i` is `ids[offsets[i]:offsets[i + 1]]`).

    Example:

    ```python
    from reckeras.backend_kernels.ragged_layout import compact_present

    compact_present(torch.tensor([7, 8, 9]), torch.tensor([True, False, True]))
    # (tensor([7, 9]), tensor([0, 1, 1, 2]))
    ```
    """
    return _compact_present(values, present)


def compact_present_reference(values: torch.Tensor,
                              present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`compact_present` with torch ops.

    Args:
        values, present: as for `compact_present`.

    Returns:
        What `compact_present` returns.

    Example:

    ```python
    from reckeras.backend_kernels.ragged_layout import compact_present_reference

    compact_present_reference(torch.tensor([7, 8]), torch.tensor([False, True]))
    # (tensor([8]), tensor([0, 0, 1]))
    ```
    """
    # masked_select, not values[present]: boolean indexing is 2x slower on CPU.
    return torch.masked_select(values, present), ragged.lengths_to_offsets(present)


def bag_of_ids(offsets: torch.Tensor, num_ids: int) -> torch.Tensor:
    """The bag index of every id of a packed batch.

    Args:
        offsets: int64 `[M + 1]` bag offsets (from 0, never decreasing).
        num_ids: the number of ids, `offsets[-1]` (given, so that no device
            sync reads it).

    Returns:
        int64 `[num_ids]`: the bag that holds each id.

    Raises:
        ValueError: offsets that are not such offsets (the native kernels;
            the reference's result is then undefined).

    Example:

    ```python
    from reckeras.backend_kernels.ragged_layout import bag_of_ids

    bag_of_ids(torch.tensor([0, 2, 2, 5]), 5)   # tensor([0, 0, 2, 2, 2])
    ```
    """
    return _bag_of_ids(offsets, num_ids)


def bag_of_ids_reference(offsets: torch.Tensor, num_ids: int) -> torch.Tensor:
    """`bag_of_ids` with torch ops.

    Args:
        offsets, num_ids: as for `bag_of_ids`.

    Returns:
        What `bag_of_ids` returns.

    Example:

    ```python
    from reckeras.backend_kernels.ragged_layout import bag_of_ids_reference

    bag_of_ids_reference(torch.tensor([0, 1, 1, 3]), 3)   # tensor([0, 2, 2])
    ```
    """
    lengths = offsets[1:] - offsets[:-1]
    bags = torch.arange(lengths.numel(), device=offsets.device)
    return torch.repeat_interleave(bags, lengths, output_size=num_ids)


def _compact_usable(values, present):
    # `usable` takes no bool tensors: the mask is checked here.
    return values.dtype == torch.int64 and values.dim() == present.dim() == 1 \
        and present.is_cpu and present.dtype == torch.bool and present.is_contiguous() \
        and cpu_native.usable(values)


_compact_present = register(
    "compact_present(Tensor values, Tensor present) -> (Tensor, Tensor)",
    reference=compact_present_reference, native=cpu_native.compact_present,
    native_usable=_compact_usable,
    fake=lambda values, present: (
        values.new_empty(torch.library.get_ctx().new_dynamic_size()),
        values.new_empty(values.numel() + 1)))

_bag_of_ids = register(
    "bag_of_ids(Tensor offsets, int num_ids) -> Tensor",
    reference=bag_of_ids_reference, native=cpu_native.bag_of_ids,
    native_usable=lambda offsets, num_ids: offsets.dim() == 1 and cpu_native.usable(offsets),
    fake=lambda offsets, num_ids: offsets.new_empty(num_ids))
