"""Native CPU kernels: the C loops of `cpu_native.c`, called through ctypes.

The torch references express each per-batch operation with whole-tensor ops, which on a CPU
means one pass over memory per op (a hash alone is a dozen). These kernels do each operation in
one pass, the way fbgemm's CPU kernels serve TorchRec, split over torch's intra-op threads
(`torch.get_num_threads`) where the iterations write disjoint memory; the result does not depend
on the thread count. The threads are torch's own OpenMP pool (see cpu_native.c), so what holds
for torch's CPU ops holds here: a process forked after they ran must not run them (GNU OpenMP's
pool does not survive `fork`; use the `spawn` start method, as torchrun and
`torch.multiprocessing.spawn` do).

They are compiled on first use (`native_build`: the system C compiler, `$CC` or `cc`, into
`rk.config`'s `cache_dir`) and loaded here by `library()`. Without a compiler (a warning names
what to install), or with `RECKERAS_NATIVE=0`, `available()` is False and the library keeps
using the torch references. `RECKERAS_NATIVE_SANITIZE=1` loads the sanitized build instead, and
a failed build then raises instead of falling back: the process must have the ASan runtime
loaded first (`LD_PRELOAD` of `gcc -print-file-name=libasan.so`), which
`scripts/test_sanitized.sh` arranges.

The wrappers are the boundary between Python and C, and a bad argument is an exception, never a
wild read or write. Before the call each refuses (`native_checks`), with a `TypeError` or
`ValueError` naming the kernel and the argument, a non-tensor, a wrong dtype, a tensor that is
not a dense contiguous CPU tensor, wrong dims or sizes, and scalars out of range: the C code
trusts the sizes it is passed. The index *values* (rows, positions, destinations) are checked by
the C kernels themselves before they touch memory through them, which costs 0-2% of a kernel
where a torch `aminmax` per index tensor before the call cost 8-15% (cpu_native.c); the wrapper
raises a `ValueError` naming the argument, and nothing the caller can see was written. The CPU
implementations of the `reckeras` torch ops (`dispatch.register`) call a kernel where `usable`
holds for its tensors, and the torch reference otherwise.
"""

import ctypes
import threading
import warnings
from pathlib import Path

import torch

from reckeras import config
from reckeras.backend_kernels import native_build
from reckeras.backend_kernels.native_checks import (
    INT32_MAX,
    INT64_MAX,
    check_bucket_index,
    check_forward_index,
    check_hash_map,
    check_integer,
    check_real,
    check_tensor,
    out_of_range,
)

_lock = threading.Lock()
_library = None
_failed = False

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_INT = ctypes.c_int
_SIGNATURES = {      # the last int of the parallel kernels is the thread count
    "rk_table_keys": (_INT, [_PTR, _I64, _PTR, _PTR, _I64, _PTR, _INT]),
    "rk_initial_rows": (None, [_PTR, _I64, _I64, _I64, ctypes.c_double, _PTR, _INT]),
    "rk_find_or_insert": (_I64, [_PTR, _PTR, _I64, _PTR, _I64, _PTR, _I64, _INT, _INT]),
    "rk_rehash": (_I64, [_PTR, _PTR, _I64, _I64, _PTR, _PTR, _I64]),
    "rk_bucket_find_or_insert": (_I64, [_PTR, _PTR, _PTR, _I64, _I64, _PTR, _I64, _I64, _PTR,
                                        _I64, _PTR, _INT, _INT]),
    "rk_pool_forward": (_INT, [_PTR, _INT, _I64, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64,
                               _PTR, _I64, _INT]),
    "rk_aggregate": (_INT, [_PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _INT]),
    "rk_unique_rows": (_I64, [_PTR, _I64, _I64, _PTR, _PTR, _PTR]),
    "rk_compact_present": (_I64, [_PTR, _PTR, _I64, _PTR, _PTR, _INT]),
    "rk_bag_of_ids": (_INT, [_PTR, _I64, _I64, _PTR, _INT]),
    "rk_arrow_block": (_I64, [_PTR, _PTR, _PTR, _I64, _INT, _PTR, _PTR, _PTR, _PTR, _INT]),
    "rk_apply_update": (_INT, [_INT, _PTR, _INT, _PTR, _I64, _I64, _I64, _PTR, _PTR, _I64,
                               ctypes.c_float, ctypes.c_float, ctypes.c_uint32, _INT]),
}
# The bits the pool and aggregate kernels return (BAD_TARGET, BAD_SOURCE,
# BAD_THROUGH in cpu_native.c).
_BAD_TARGET, _BAD_SOURCE, _BAD_THROUGH = 1, 2, 4
# The dtypes of table rows the kernels read and update (ROWS_* in cpu_native.c).
ROW_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# The key of a free hash-map slot (EMPTY in cpu_native.c): `hash_table`'s maps
# are the ones these kernels read and write.
EMPTY = -(2**63)


def sanitizing() -> bool:
    """Whether this process builds the kernels with the sanitizers.

    Returns:
        Whether `RECKERAS_NATIVE_SANITIZE` is `1`.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    cpu_native.sanitizing()   # True under scripts/test_sanitized.sh
    ```
    """
    return config.options().native_sanitize


def _load(target: Path) -> ctypes.CDLL:
    library = ctypes.CDLL(str(target))
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    return library


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or `None` when they cannot be built here.

    The first call compiles (or finds in the cache) and loads the library;
    a failed build warns once and is not retried. A failed build raises
    instead when the kernels were required (`rk.config`'s
    `native_kernels=True`, `RECKERAS_NATIVE=1`) or the sanitized library was
    asked for (`RECKERAS_NATIVE_SANITIZE=1`).

    Returns:
        The `ctypes.CDLL`, its functions' signatures set, or `None`.

    Raises:
        RuntimeError: when the kernels were required, or the sanitized
            library was asked for, and cannot be built or loaded; the message
            says why.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.library() is None:
        print("using the torch reference kernels")
    ```
    """
    global _library, _failed
    if _library is not None or _failed:
        return _library
    with _lock:
        if _library is None and not _failed:
            wanted = config.options().native_kernels
            if wanted is False:
                _failed = True
                return None
            try:
                _library = _load(native_build.build(sanitizing()))
            except (native_build.BuildError, OSError) as error:
                if sanitizing():
                    raise RuntimeError(
                        f"reckeras: RECKERAS_NATIVE_SANITIZE=1 but the sanitized native "
                        f"kernels could not be built or loaded: {error}") from error
                if wanted:
                    raise RuntimeError(
                        f"reckeras: native_kernels=True (RECKERAS_NATIVE=1) but the native "
                        f"CPU kernels could not be built or loaded: {error}") from error
                _failed = True
                warnings.warn(f"reckeras: native CPU kernels unavailable ({error}); "
                              f"using the torch reference kernels (rk.config.set("
                              f"native_kernels=False) silences this)",
                              RuntimeWarning, stacklevel=2)
    return _library


def available() -> bool:
    """Whether the native kernels can run in this process.

    Returns:
        Whether `library()` loaded (it builds the library on first call).

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    cpu_native.available()   # False with RECKERAS_NATIVE=0 or no C compiler
    ```
    """
    return library() is not None


def usable(*tensors: torch.Tensor, table: torch.Tensor | None = None) -> bool:
    """Whether the native kernels apply to these tensors.

    They do for contiguous CPU tensors that are float32 or int64 (indices of
    other dtypes use the references), and a `table` of rows that is float32,
    float16 or bfloat16, when `available()`.

    Args:
        *tensors: the operands of one kernel call.
        table: the table rows it reads or updates, if any.

    Returns:
        Whether the native kernel may be called on them.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    cpu_native.usable(torch.zeros(4, 8), torch.arange(4))   # True where built
    cpu_native.usable(torch.zeros(4, 8).t())                # False: not contiguous
    cpu_native.usable(torch.arange(4, dtype=torch.int32))   # False: int32
    ```
    """
    operands = all(t.is_cpu and t.is_contiguous() and t.dtype in (torch.float32, torch.int64)
                   for t in tensors)
    rows = table is None or (table.is_cpu and table.is_contiguous()
                             and table.dtype in ROW_DTYPES)
    return operands and rows and available()


def _loaded() -> ctypes.CDLL:
    """The library, for a wrapper about to call it."""
    loaded = library()
    if loaded is None:
        raise RuntimeError("cpu_native: the native kernels are not available in this "
                           "process (see cpu_native.available())")
    return loaded


def _p(tensor: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(tensor.data_ptr())


def _threads() -> int:
    return torch.get_num_threads()


def table_keys(ids: torch.Tensor, salt: torch.Tensor,
               slot_counts: torch.Tensor) -> torch.Tensor:
    """`hashing.table_keys` in one C loop.

    Args:
        ids: int64 `[N]`.
        salt: int64 `[S]`, one salt per slot.
        slot_counts: int64 `[S]`, ids per slot (non-negative, summing to `N`).

    Returns:
        int64 `[N]` table keys.

    Raises:
        TypeError: for an argument that is not an int64 tensor.
        ValueError: for one that is not 1-D, contiguous and on the CPU, for
            `salt` and `slot_counts` of different lengths, or counts that
            are negative or do not sum to `N`.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        keys = cpu_native.table_keys(torch.tensor([5, 6, 5]), torch.tensor([0, 99]),
                                     torch.tensor([2, 1]))
    ```
    """
    kernel = "table_keys"
    check_tensor(kernel, "ids", ids, torch.int64, 1)
    check_tensor(kernel, "salt", salt, torch.int64, 1)
    check_tensor(kernel, "slot_counts", slot_counts, torch.int64, 1)
    if salt.shape[0] != slot_counts.shape[0]:
        raise ValueError(f"cpu_native.table_keys: salt has {salt.shape[0]} entries and "
                         f"slot_counts {slot_counts.shape[0]}: one of each per slot")
    keys = torch.empty_like(ids)
    status = _loaded().rk_table_keys(_p(ids), ids.shape[0], _p(salt), _p(slot_counts),
                                     slot_counts.shape[0], _p(keys), _threads())
    if status:
        raise ValueError(f"cpu_native.table_keys: slot_counts must be non-negative and "
                         f"sum to the {ids.shape[0]} ids, got {slot_counts.tolist()[:20]}")
    return keys


def initial_rows(keys: torch.Tensor, dim: int, scale: float, seed: int) -> torch.Tensor:
    """`hashing.initial_rows` in one C loop.

    Args:
        keys: int64 `[n]` row keys.
        dim: the row width, `>= 0`.
        scale: the rows are uniform in `[-scale, scale]`.
        seed: the seed of the table's initial values, an int64.

    Returns:
        float32 `[n, dim]`.

    Raises:
        TypeError: for `keys` not an int64 tensor, or non-numeric scalars.
        ValueError: for `keys` not 1-D, contiguous and on the CPU, a
            negative `dim`, or a `seed` outside int64.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        rows = cpu_native.initial_rows(torch.tensor([7, 8]), 16, 0.25, 0)   # [2, 16]
    ```
    """
    kernel = "initial_rows"
    check_tensor(kernel, "keys", keys, torch.int64, 1)
    dim = check_integer(kernel, "dim", dim)
    seed = check_integer(kernel, "seed", seed, -INT64_MAX - 1)
    scale = check_real(kernel, "scale", scale)
    out = torch.empty(keys.shape[0], dim, dtype=torch.float32)
    _loaded().rk_initial_rows(_p(keys), keys.shape[0], dim, seed, scale, _p(out),
                              _threads())
    return out


def find_or_insert(slot_keys: torch.Tensor, slot_rows: torch.Tensor,
                   keys: torch.Tensor, num_rows: int,
                   insert: bool = True) -> tuple[torch.Tensor, int]:
    """`hash_table.find_or_insert` (or `find`) in one C loop.

    New keys are numbered in the order of their first position in `keys`.

    Args:
        slot_keys: int64 `[capacity]`, the map's keys, updated in place;
            `capacity` is a power of two.
        slot_rows: int64 `[capacity]`, the map's rows, updated in place.
        keys: int64 `[n]`, duplicates allowed.
        num_rows: the number of rows before the call.
        insert: whether absent keys are inserted; otherwise they get -1 and
            the map is not changed.

    Returns:
        `(rows, num_rows)`: int64 rows aligned with `keys` and the new count.

    Raises:
        TypeError: for a tensor that is not int64, or a non-integer `num_rows`.
        ValueError: for a tensor not 1-D, contiguous and on the CPU, maps
            of different sizes or not a power of two, `num_rows` negative
            or so large that new rows would overflow int64, or an insert
            into a map with no free slot left (the caller sizes the map,
            `hash_table.capacity_for`; keys before the one that found no
            slot are inserted).

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native
    from reckeras.backend_kernels.hash_table import new_slots

    slot_keys, slot_rows = new_slots(16)
    if cpu_native.available():
        rows, count = cpu_native.find_or_insert(slot_keys, slot_rows,
                                                torch.tensor([9, 4, 9]), 0)
        rows, count   # (tensor([0, 1, 0]), 2)
    ```
    """
    kernel = "find_or_insert"
    capacity = check_hash_map(kernel, slot_keys, slot_rows)
    check_tensor(kernel, "keys", keys, torch.int64, 1)
    if capacity & (capacity - 1) or capacity == 0:
        raise ValueError(f"cpu_native.find_or_insert: the map's capacity must be a power "
                         f"of two, got {capacity} slots")
    num_rows = check_integer(kernel, "num_rows", num_rows, 0, INT64_MAX - keys.shape[0])
    rows = torch.empty_like(keys)
    count = _loaded().rk_find_or_insert(_p(slot_keys), _p(slot_rows), capacity, _p(keys),
                                        keys.shape[0], _p(rows), num_rows, int(bool(insert)),
                                        _threads())
    if count < 0:
        raise ValueError(f"cpu_native.find_or_insert: the map of {capacity} slots is full: "
                         f"no free slot for a new key (size it with "
                         f"hash_table.capacity_for)")
    return rows, count


def rehash(slot_keys: torch.Tensor, slot_rows: torch.Tensor, capacity: int,
           rows_below: int = INT64_MAX) -> tuple[torch.Tensor, torch.Tensor]:
    """`hash_table.rehash` in one sequential C pass over the old map.

    The old map may grow on another thread during the pass (see
    `hash_table.rehash`'s `rows_below`).

    Args:
        slot_keys: int64 `[old capacity]`, the map's keys (not changed).
        slot_rows: int64 `[old capacity]`, the map's rows (not changed).
        capacity: the new map's number of slots, a power of two.
        rows_below: only the keys whose row lies in `[0, rows_below)` move.

    Returns:
        `(slot_keys, slot_rows)` of the new map: the same key -> row pairs.

    Raises:
        TypeError: for a tensor that is not int64, or a non-integer
            `capacity`.
        ValueError: for a tensor not 1-D, contiguous and on the CPU, maps of
            different sizes, a capacity that is not a power of two, or a new
            map too small for the keys.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native
    from reckeras.backend_kernels.hash_table import new_slots

    slot_keys, slot_rows = new_slots(16)
    if cpu_native.available():
        cpu_native.find_or_insert(slot_keys, slot_rows, torch.tensor([9, 4]), 0)
        slot_keys, slot_rows = cpu_native.rehash(slot_keys, slot_rows, 64)
    ```
    """
    kernel = "rehash"
    old_capacity = check_hash_map(kernel, slot_keys, slot_rows)
    capacity = check_integer(kernel, "capacity", capacity, 1, 2**62)
    rows_below = check_integer(kernel, "rows_below", rows_below)
    if capacity & (capacity - 1):
        raise ValueError(f"cpu_native.rehash: the new map's capacity must be a power of "
                         f"two, got {capacity} slots")
    new_keys = torch.full((capacity,), EMPTY, dtype=torch.int64)
    new_rows = torch.full((capacity,), -1, dtype=torch.int64)
    moved = _loaded().rk_rehash(_p(slot_keys), _p(slot_rows), old_capacity, rows_below,
                                _p(new_keys), _p(new_rows), capacity)
    if moved < 0:
        raise ValueError(f"cpu_native.rehash: a map of {capacity} slots cannot hold the "
                         f"keys of this one (size it with hash_table.capacity_for)")
    return new_keys, new_rows

def bucket_find_or_insert(buckets: torch.Tensor, directory: torch.Tensor, shape: torch.Tensor,
                          arena: torch.Tensor, keys: torch.Tensor, num_rows: int,
                          insert: bool = True) -> tuple[torch.Tensor, int]:
    """`bucket_index.find_or_insert` (or `find`) in C: the lookups on torch's
    threads, the inserts in one loop on the calling thread.

    New keys are numbered in the order of their first position in `keys`.

    Args:
        buckets: int32 `[capacity, 32]` (the layout of `bucket_index`),
            updated in place.
        directory: int32 `[directory capacity]`, updated in place.
        shape: int64 `[2]`, the buckets in use and the global depth, updated.
        arena: int64 `[row capacity]`, each row's key; new rows' keys are
            written.
        keys: int64 `[n]`, duplicates allowed.
        num_rows: the rows the arena holds before the call.
        insert: whether absent keys are inserted; otherwise they get -1 and
            nothing changes.

    Returns:
        `(rows, num_rows)`: int64 rows aligned with `keys` (-1: absent, or
        no room left in the arrays for it: grow them and call again) and
        the new row count.

    Raises:
        TypeError, ValueError: for arguments of the wrong dtype, layout or
            sizes, and for an index whose directory or slots point outside
            its arrays (a corrupt index).
        MemoryError: no memory for the absent keys' positions.

    Example:

    ```python
    from reckeras.backend_kernels import bucket_index, cpu_native

    index = bucket_index.new_index(64)
    arena = torch.empty(16, dtype=torch.int64)
    if cpu_native.available():
        rows, count = cpu_native.bucket_find_or_insert(*index, arena,
                                                       torch.tensor([9, 4, 9]), 0)
        rows, count   # (tensor([0, 1, 0]), 2)
    ```
    """
    kernel = "bucket_find_or_insert"
    capacity, directory_capacity = check_bucket_index(kernel, buckets, directory, shape)
    check_tensor(kernel, "arena", arena, torch.int64, 1)
    check_tensor(kernel, "keys", keys, torch.int64, 1)
    num_rows = check_integer(kernel, "num_rows", num_rows, 0, min(arena.shape[0], INT32_MAX))
    rows = torch.empty_like(keys)
    count = _loaded().rk_bucket_find_or_insert(
        _p(buckets), _p(directory), _p(shape), capacity, directory_capacity, _p(arena),
        arena.shape[0], num_rows, _p(keys), keys.shape[0], _p(rows), int(bool(insert)),
        _threads())
    if count == -2:
        raise MemoryError(f"cpu_native.{kernel}: no memory for the positions of "
                          f"{keys.shape[0]} keys")
    if count < 0:
        raise ValueError(f"cpu_native.{kernel}: the index is corrupt: a directory entry "
                         f"or a slot points outside its {int(shape[0])} buckets or "
                         f"{num_rows} rows")
    return rows, count


def pool_forward(weights: torch.Tensor, unique_rows: torch.Tensor,
                 unique_index: torch.Tensor, destination: torch.Tensor,
                 id_weight: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The pooled forward in one C loop.

    `out[destination[i]] += id_weight[i] * weights[unique_rows[unique_index[i]]]`.

    Args:
        weights: float32, float16 or bfloat16 `[num_rows, D]`, the table
            (half rows are summed in float32).
        unique_rows: int64 `[U]`, the batch's unique rows.
        unique_index: int64 `[n]`, each id's position in `unique_rows`.
        destination: int64 `[n]`, each id's output slot.
        id_weight: float32 `[n]`, each id's pooling scale.
        num_slots: the number of output slots.

    Returns:
        float32 `[num_slots, D]`, zeros for slots no id writes.

    Raises:
        TypeError: for a tensor of the wrong dtype (or not a tensor), or a
            non-integer `num_slots`.
        ValueError: for a tensor of the wrong dims, not contiguous or not
            on the CPU, per-id tensors of different lengths, a negative
            `num_slots`, or an index out of range: `unique_index` outside
            `[0, U)`, `unique_rows` outside `[0, num_rows)`, `destination`
            outside `[0, num_slots)`.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        out = cpu_native.pool_forward(
            torch.eye(3), torch.tensor([2, 0]), torch.tensor([0, 1, 0]),
            torch.tensor([0, 0, 1]), torch.ones(3), 2)   # [[1, 0, 1], [0, 0, 1]]
    ```
    """
    kernel = "pool_forward"
    check_tensor(kernel, "weights", weights, tuple(ROW_DTYPES), 2)
    check_tensor(kernel, "unique_rows", unique_rows, torch.int64, 1)
    n = check_forward_index(kernel, unique_index, destination, id_weight)
    num_slots = check_integer(kernel, "num_slots", num_slots)
    num_rows, dim = weights.shape
    out = torch.empty(num_slots, dim, dtype=torch.float32)     # the C loop zeroes it
    bad = _loaded().rk_pool_forward(_p(weights), ROW_DTYPES[weights.dtype], num_rows, dim,
                                    _p(unique_rows),
                                    unique_rows.shape[0], _p(unique_index),
                                    _p(destination), _p(id_weight), n, _p(out),
                                    num_slots, _threads())
    if bad & _BAD_TARGET:
        raise out_of_range(kernel, "destination", destination, num_slots, "num_slots")
    if bad & _BAD_THROUGH:
        raise out_of_range(kernel, "unique_index", unique_index, unique_rows.shape[0],
                       "len(unique_rows)")
    if bad & _BAD_SOURCE:
        raise out_of_range(kernel, "unique_rows", unique_rows, num_rows, "rows of weights")
    return out


def aggregate(grad_out: torch.Tensor, unique_index: torch.Tensor,
              destination: torch.Tensor, id_weight: torch.Tensor,
              num_unique: int) -> torch.Tensor:
    """`aggregation.aggregate_row_grads` in one C loop.

    Args:
        grad_out: float32 `[num_slots, D]` gradient of the pooled output.
        unique_index: int64 `[n]`, each id's position among the unique rows.
        destination: int64 `[n]`, each id's output slot.
        id_weight: float32 `[n]`, each id's pooling scale.
        num_unique: number of unique rows.

    Returns:
        float32 `[num_unique, D]`.

    Raises:
        TypeError: for a tensor of the wrong dtype (or not a tensor), or a
            non-integer `num_unique`.
        ValueError: for a tensor of the wrong dims, not contiguous or not
            on the CPU, per-id tensors of different lengths, a negative
            `num_unique`, `unique_index` outside `[0, num_unique)` or
            `destination` outside `[0, num_slots)`.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        grads = cpu_native.aggregate(torch.ones(2, 4), torch.tensor([0, 1, 0]),
                                     torch.tensor([0, 0, 1]), torch.ones(3), 2)
    ```
    """
    kernel = "aggregate"
    check_tensor(kernel, "grad_out", grad_out, torch.float32, 2)
    n = check_forward_index(kernel, unique_index, destination, id_weight)
    num_unique = check_integer(kernel, "num_unique", num_unique)
    num_slots, dim = grad_out.shape
    grads = torch.empty(num_unique, dim, dtype=torch.float32)  # the C loop zeroes it
    bad = _loaded().rk_aggregate(_p(grad_out), num_slots, dim, _p(unique_index),
                                 _p(destination), _p(id_weight), n, _p(grads), num_unique,
                                 _threads())
    if bad & _BAD_TARGET:
        raise out_of_range(kernel, "unique_index", unique_index, num_unique, "num_unique")
    if bad & _BAD_SOURCE:
        raise out_of_range(kernel, "destination", destination, num_slots, "rows of grad_out")
    return grads


_positions = threading.local()


def unique_rows(rows: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`aggregation.unique_rows` in one C loop, rows in order of first appearance.

    A per-thread int32 position buffer of at least `num_rows` entries is
    kept between calls (all -1 between calls).

    Args:
        rows: int64 `[n]` row indices, in `[0, num_rows)`.
        num_rows: an upper bound of the rows.

    Returns:
        `(unique, unique_index)`: the distinct rows and, for each input,
        its position in `unique`.

    Raises:
        TypeError: for `rows` not an int64 tensor, or a non-integer `num_rows`.
        ValueError: for `rows` not 1-D, contiguous and on the CPU or of
            2^31 entries or more, a negative `num_rows`, or a row outside
            `[0, num_rows)`.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        unique, index = cpu_native.unique_rows(torch.tensor([5, 2, 5, 7]), 8)
        unique, index   # (tensor([5, 2, 7]), tensor([0, 1, 0, 2]))
    ```
    """
    kernel = "unique_rows"
    check_tensor(kernel, "rows", rows, torch.int64, 1)
    num_rows = check_integer(kernel, "num_rows", num_rows)
    if rows.shape[0] > INT32_MAX:
        raise ValueError(f"cpu_native.{kernel}: rows has {rows.shape[0]} entries, more "
                         f"than the int32 positions hold (2^31 - 1)")
    position = getattr(_positions, "buffer", None)
    if position is None or position.numel() < num_rows:
        position = torch.full((max(num_rows, 1024) * 2,), -1, dtype=torch.int32)
        _positions.buffer = position
    unique = torch.empty_like(rows)
    unique_index = torch.empty_like(rows)
    count = _loaded().rk_unique_rows(_p(rows), rows.shape[0], num_rows, _p(position),
                                     _p(unique), _p(unique_index))
    if count < 0:
        raise out_of_range(kernel, "rows", rows, num_rows, "num_rows")
    return unique[:count], unique_index


def compact_present(values: torch.Tensor,
                    present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`ragged_layout.compact_present` in one C pass (two on several threads).

    Args:
        values: int64 `[n]`.
        present: bool `[n]`, which values to keep.

    Returns:
        `(ids, offsets)`: int64 `[N]` the kept values (a view), `[n + 1]` their offsets.

    Example:

    ```python
    cpu_native.compact_present(torch.tensor([4, 5]), torch.tensor([False, True]))  # [5], [0, 0, 1]
    ```
    """
    check_tensor("compact_present", "values", values, torch.int64, 1)
    check_tensor("compact_present", "present", present, torch.bool, 1)
    if present.shape != values.shape:
        raise ValueError("cpu_native.compact_present: present and values differ in length")
    ids, offsets = torch.empty_like(values), values.new_empty(values.shape[0] + 1)
    count = _loaded().rk_compact_present(_p(values), _p(present), values.shape[0], _p(ids),
                                         _p(offsets), _threads())
    return ids[:count], offsets


def bag_of_ids(offsets: torch.Tensor, num_ids: int) -> torch.Tensor:
    """`ragged_layout.bag_of_ids` in one C loop (bad offsets: a `ValueError`).

    Args:
        offsets: int64 `[M + 1]`: from 0, never decreasing, to `num_ids`.
        num_ids: the number of ids.

    Returns:
        int64 `[num_ids]`: the bag of every id.

    Example:

    ```python
    cpu_native.bag_of_ids(torch.tensor([0, 2, 2, 3]), 3)   # tensor([0, 0, 2])
    ```
    """
    check_tensor("bag_of_ids", "offsets", offsets, torch.int64, 1)
    num_ids = check_integer("bag_of_ids", "num_ids", num_ids)
    # The last offset first, so that a wrong num_ids allocates nothing.
    ends = offsets.shape[0] > 0 and int(offsets[-1]) == num_ids
    bags = torch.empty(num_ids if ends else 0, dtype=torch.int64)
    if not ends or _loaded().rk_bag_of_ids(_p(offsets), offsets.shape[0] - 1, num_ids,
                                           _p(bags), _threads()):
        raise ValueError(f"cpu_native.bag_of_ids: offsets must start at 0, never decrease "
                         f"and end at num_ids={num_ids}")
    return bags


UPDATE_KINDS = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 2}


def apply_update(kind: str, weights: torch.Tensor, state: torch.Tensor,
                 rows: torch.Tensor, grads: torch.Tensor, lr: float, eps: float,
                 round_seed: int = 0) -> None:
    """A sparse optimizer update of distinct rows, in place, in one C loop.

    Args:
        kind: a key of `UPDATE_KINDS` ("sgd", "adagrad", "rowwise_adagrad").
        weights: float32, float16 or bfloat16 `[num_rows, D]`, the table;
            half rows are updated in float32 and stored by stochastic
            rounding (`sparse_optimizers.stochastic_round_reference`).
        state: float32 `[num_rows, width]`, the optimizer state: width `D`
            for Adagrad, 1 for row-wise Adagrad; SGD does not read it.
        rows: int64 `[U]`, distinct rows in `[0, num_rows)`.
        grads: float32 `[U, D]`, the gradient of every row.
        lr: the learning rate.
        eps: Adagrad's epsilon (unused by SGD).
        round_seed: the seed of the stochastic rounding, in `[0, 2^32)`
            (unused for float32 rows).

    Raises:
        TypeError: for a tensor of the wrong dtype (or not a tensor), or
            non-numeric `lr`, `eps`, or a non-integer `round_seed`.
        ValueError: for an unknown `kind`, a tensor of the wrong dims, not
            contiguous or not on the CPU, `grads` not `[U, D]`, `state` not
            of the shape `kind` needs, a `round_seed` out of range, or a row
            outside `[0, num_rows)`. Nothing is updated then.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    weights, state = torch.ones(4, 2), torch.zeros(4, 0)
    if cpu_native.available():
        cpu_native.apply_update("sgd", weights, state, torch.tensor([3]),
                                torch.ones(1, 2), 0.1, 0.0)   # weights[3] = 0.9
    ```
    """
    kernel = "apply_update"
    if kind not in UPDATE_KINDS:
        raise ValueError(f"cpu_native.apply_update: kind must be one of "
                         f"{sorted(UPDATE_KINDS)}, got {kind!r}")
    check_tensor(kernel, "weights", weights, tuple(ROW_DTYPES), 2)
    check_tensor(kernel, "state", state, torch.float32, 2)
    check_tensor(kernel, "rows", rows, torch.int64, 1)
    check_tensor(kernel, "grads", grads, torch.float32, 2)
    lr, eps = check_real(kernel, "lr", lr), check_real(kernel, "eps", eps)
    round_seed = check_integer(kernel, "round_seed", round_seed, 0, 2**32 - 1)
    num_rows, dim = weights.shape
    if grads.shape != (rows.shape[0], dim):
        raise ValueError(f"cpu_native.apply_update: grads must be [{rows.shape[0]}, {dim}] "
                         f"(one row of width D per row updated), got {tuple(grads.shape)}")
    width = {"sgd": state.shape[1], "adagrad": dim, "rowwise_adagrad": 1}[kind]
    if kind != "sgd" and state.shape != (num_rows, width):
        raise ValueError(f"cpu_native.apply_update: {kind} needs state of shape "
                         f"[{num_rows}, {width}], got {tuple(state.shape)}")
    status = _loaded().rk_apply_update(UPDATE_KINDS[kind], _p(weights),
                                       ROW_DTYPES[weights.dtype], _p(state),
                                       state.shape[1], dim, num_rows, _p(rows), _p(grads),
                                       rows.shape[0], lr, eps, round_seed, _threads())
    if status:
        raise out_of_range(kernel, "rows", rows, num_rows, "rows of weights")
