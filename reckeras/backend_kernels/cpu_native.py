"""Native CPU kernels: the C loops of `cpu_native.c`, called through ctypes.

The torch references express each per-batch operation with whole-tensor ops,
which on a CPU means one pass over memory per op (a hash alone is a dozen).
These kernels do each operation in one pass, the way fbgemm's CPU kernels
serve TorchRec, split over torch's intra-op threads (`torch.get_num_threads`)
where the iterations write disjoint memory; the result does not depend on the
thread count. The threads are torch's own OpenMP pool (see cpu_native.c), so
what holds for torch's CPU ops holds here: a process forked after they ran
must not run them (GNU OpenMP's pool does not survive `fork`; use the
`spawn` start method, as torchrun and `torch.multiprocessing.spawn` do).

They are compiled on first use with the system C
compiler (`cc -O3 -fopenmp`, about a second; without OpenMP when the
compiler lacks it) into a cache directory (`RECKERAS_CACHE_DIR` or
`~/.cache/reckeras`). Without a compiler, or with `RECKERAS_NATIVE=0`,
`available()` is False and the library keeps using the torch references.

The kernels take contiguous CPU tensors (`usable` tells); the callers in
`hashing`, `hash_table`, `aggregation`, `pooling` and `sparse_optimizers`
check that before they call.
"""

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("cpu_native.c")
_FLAGS = ["-O3", "-fPIC", "-shared", "-std=gnu99"]
_lock = threading.Lock()
_library = None
_failed = False

_I64 = ctypes.c_int64
_PTR = ctypes.c_void_p
_INT = ctypes.c_int
_SIGNATURES = {      # the last int of the parallel kernels is the thread count
    "rk_table_keys": (None, [_PTR, _PTR, _PTR, _I64, _PTR, _INT]),
    "rk_initial_rows": (None, [_PTR, _I64, _I64, _I64, ctypes.c_double, _PTR, _INT]),
    "rk_find_or_insert": (_I64, [_PTR, _PTR, _I64, _PTR, _I64, _PTR, _I64, _INT, _INT]),
    "rk_pool_forward": (None, [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _I64,
                               _INT]),
    "rk_aggregate": (None, [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _I64, _INT]),
    "rk_unique_rows": (_I64, [_PTR, _I64, _PTR, _PTR, _PTR]),
    "rk_apply_update": (None, [_INT, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _I64,
                               ctypes.c_float, ctypes.c_float, _INT]),
}


def _cache_dir() -> Path:
    return Path(os.environ.get("RECKERAS_CACHE_DIR",
                               Path.home() / ".cache" / "reckeras"))


def _build(flags: list[str]) -> Path:
    """The compiled library for `flags` (built once into the cache dir)."""
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    target = _cache_dir() / f"cpu_native-{digest}-{sys.platform}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        compiler = os.environ.get("CC", "cc")
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            subprocess.run([compiler, *flags, str(_SOURCE), "-o", str(built), "-lm"],
                           check=True, capture_output=True, timeout=120)
            os.replace(built, target)      # atomic: concurrent builders agree
    return target


def _compile() -> ctypes.CDLL:
    try:
        # OpenMP puts the parallel loops on torch's own threads (cpu_native.c).
        target = _build(_FLAGS + ["-fopenmp"])
    except (OSError, subprocess.SubprocessError):
        target = _build(_FLAGS)      # no OpenMP here: the same loops, one thread
    library = ctypes.CDLL(str(target))
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    return library


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or `None` when they cannot be built here.

    The first call compiles (or finds in the cache) and loads the library;
    a failed build warns once and is not retried.

    Returns:
        The `ctypes.CDLL`, its functions' signatures set, or `None`.

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
            if os.environ.get("RECKERAS_NATIVE", "1") == "0":
                _failed = True
                return None
            try:
                _library = _compile()
            except (OSError, subprocess.SubprocessError) as error:
                _failed = True
                detail = getattr(error, "stderr", b"") or b""
                warnings.warn(f"reckeras: native CPU kernels unavailable ({error}; "
                              f"{detail.decode(errors='replace')[:300]}); using the "
                              f"torch reference kernels", RuntimeWarning, stacklevel=2)
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


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the native kernels apply to these tensors.

    They do for contiguous CPU tensors whose floating point ones are
    float32 (other table dtypes use the references), when `available()`.

    Args:
        *tensors: the operands of one kernel call.

    Returns:
        Whether the native kernel may be called on them.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    cpu_native.usable(torch.zeros(4, 8), torch.arange(4))   # True where built
    cpu_native.usable(torch.zeros(4, 8).t())                # False: not contiguous
    ```
    """
    return all(t.device.type == "cpu" and t.is_contiguous()
               and (not t.is_floating_point() or t.dtype == torch.float32)
               for t in tensors) and available()


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
        slot_counts: int64 `[S]`, ids per slot (summing to `N`).

    Returns:
        int64 `[N]` table keys.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        keys = cpu_native.table_keys(torch.tensor([5, 6, 5]), torch.tensor([0, 99]),
                                     torch.tensor([2, 1]))
    ```
    """
    keys = torch.empty_like(ids)
    library().rk_table_keys(_p(ids), _p(salt), _p(slot_counts), slot_counts.numel(),
                            _p(keys), _threads())
    return keys


def initial_rows(keys: torch.Tensor, dim: int, scale: float, seed: int) -> torch.Tensor:
    """`hashing.initial_rows` in one C loop.

    Args:
        keys: int64 `[n]` row keys.
        dim: the row width.
        scale: the rows are uniform in `[-scale, scale]`.
        seed: the seed of the table's initial values.

    Returns:
        float32 `[n, dim]`.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        rows = cpu_native.initial_rows(torch.tensor([7, 8]), 16, 0.25, 0)   # [2, 16]
    ```
    """
    out = torch.empty(keys.numel(), dim, dtype=torch.float32)
    library().rk_initial_rows(_p(keys), keys.numel(), dim, seed, float(scale), _p(out),
                              _threads())
    return out


def find_or_insert(slot_keys: torch.Tensor, slot_rows: torch.Tensor,
                   keys: torch.Tensor, num_rows: int,
                   insert: bool = True) -> tuple[torch.Tensor, int]:
    """`hash_table.find_or_insert` (or `find`) in one C loop.

    New keys are numbered in the order of their first position in `keys`.

    Args:
        slot_keys: int64 `[capacity]`, the map's keys, updated in place.
        slot_rows: int64 `[capacity]`, the map's rows, updated in place.
        keys: int64 `[n]`, duplicates allowed.
        num_rows: the number of rows before the call.
        insert: whether absent keys are inserted; otherwise they get -1 and
            the map is not changed.

    Returns:
        `(rows, num_rows)`: int64 rows aligned with `keys` and the new count.

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
    rows = torch.empty_like(keys)
    count = library().rk_find_or_insert(_p(slot_keys), _p(slot_rows), slot_keys.numel(),
                                        _p(keys), keys.numel(), _p(rows), num_rows,
                                        int(insert), _threads())
    return rows, count


def pool_forward(weights: torch.Tensor, unique_rows: torch.Tensor,
                 unique_index: torch.Tensor, destination: torch.Tensor,
                 id_weight: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The pooled forward in one C loop.

    `out[destination[i]] += id_weight[i] * weights[unique_rows[unique_index[i]]]`.

    Args:
        weights: float32 `[num_rows, D]`, the table.
        unique_rows: int64 `[U]`, the batch's unique rows.
        unique_index: int64 `[n]`, each id's position in `unique_rows`.
        destination: int64 `[n]`, each id's output slot.
        id_weight: float32 `[n]`, each id's pooling scale.
        num_slots: the number of output slots.

    Returns:
        float32 `[num_slots, D]`, zeros for slots no id writes.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        out = cpu_native.pool_forward(
            torch.eye(3), torch.tensor([2, 0]), torch.tensor([0, 1, 0]),
            torch.tensor([0, 0, 1]), torch.ones(3), 2)   # [[1, 0, 1], [0, 0, 1]]
    ```
    """
    out = torch.zeros(num_slots, weights.shape[1], dtype=torch.float32)
    library().rk_pool_forward(_p(weights), weights.shape[1], _p(unique_rows),
                              _p(unique_index), _p(destination), _p(id_weight),
                              destination.numel(), _p(out), num_slots, _threads())
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

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        grads = cpu_native.aggregate(torch.ones(2, 4), torch.tensor([0, 1, 0]),
                                     torch.tensor([0, 0, 1]), torch.ones(3), 2)
    ```
    """
    grads = torch.zeros(num_unique, grad_out.shape[1], dtype=torch.float32)
    library().rk_aggregate(_p(grad_out), grad_out.shape[1], _p(unique_index),
                           _p(destination), _p(id_weight), destination.numel(),
                           _p(grads), num_unique, _threads())
    return grads


_positions = threading.local()


def unique_rows(rows: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`aggregation.unique_rows` in one C loop, rows in order of first appearance.

    A per-thread position buffer of at least `num_rows` entries is kept
    between calls (all -1 between calls).

    Args:
        rows: int64 `[n]` row indices, in `[0, num_rows)`.
        num_rows: an upper bound of the rows.

    Returns:
        `(unique, unique_index)`: the distinct rows and, for each input,
        its position in `unique`.

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    if cpu_native.available():
        unique, index = cpu_native.unique_rows(torch.tensor([5, 2, 5, 7]), 8)
        unique, index   # (tensor([5, 2, 7]), tensor([0, 1, 0, 2]))
    ```
    """
    position = getattr(_positions, "buffer", None)
    if position is None or position.numel() < num_rows:
        position = torch.full((max(num_rows, 1024) * 2,), -1, dtype=torch.int64)
        _positions.buffer = position
    unique = torch.empty_like(rows)
    unique_index = torch.empty_like(rows)
    count = library().rk_unique_rows(_p(rows), rows.numel(), _p(position), _p(unique),
                                     _p(unique_index))
    return unique[:count], unique_index


UPDATE_KINDS = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 2}


def apply_update(kind: str, weights: torch.Tensor, state: torch.Tensor,
                 rows: torch.Tensor, grads: torch.Tensor, lr: float, eps: float) -> None:
    """A sparse optimizer update of distinct rows, in place, in one C loop.

    Args:
        kind: a key of `UPDATE_KINDS` ("sgd", "adagrad", "rowwise_adagrad").
        weights: float32 `[num_rows, D]`, the table.
        state: float32 `[num_rows, width]`, the optimizer state.
        rows: int64 `[U]`, distinct rows.
        grads: float32 `[U, D]`, the gradient of every row.
        lr: the learning rate.
        eps: Adagrad's epsilon (unused by SGD).

    Example:

    ```python
    from reckeras.backend_kernels import cpu_native

    weights, state = torch.ones(4, 2), torch.zeros(4, 0)
    if cpu_native.available():
        cpu_native.apply_update("sgd", weights, state, torch.tensor([3]),
                                torch.ones(1, 2), 0.1, 0.0)   # weights[3] = 0.9
    ```
    """
    library().rk_apply_update(UPDATE_KINDS[kind], _p(weights), _p(state),
                              state.shape[1], weights.shape[1], _p(rows), _p(grads),
                              rows.numel(), lr, eps, _threads())
