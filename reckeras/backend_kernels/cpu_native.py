"""Native CPU kernels: the C loops of ``cpu_native.c``, called through ctypes.

The torch references express each per-batch operation with whole-tensor ops,
which on a CPU means one pass over memory per op (a hash alone is a dozen).
These kernels do each operation in one pass, the way fbgemm's CPU kernels
serve TorchRec, split over torch's intra-op threads (``torch.get_num_threads``)
where the iterations write disjoint memory; the result does not depend on the
thread count. The threads are torch's own OpenMP pool (see cpu_native.c), so
what holds for torch's CPU ops holds here: a process forked after they ran
must not run them (GNU OpenMP's pool does not survive ``fork``; use the
``spawn`` start method, as torchrun and ``torch.multiprocessing.spawn`` do).

They are compiled on first use with the system C
compiler (``cc -O3 -fopenmp``, about a second) into a cache directory
(``RECKERAS_CACHE_DIR`` or ``~/.cache/reckeras``). Without a compiler, or with
``RECKERAS_NATIVE=0``, ``available()`` is False and the library keeps using
the torch references.
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


def _cache_dir():
    return Path(os.environ.get("RECKERAS_CACHE_DIR",
                               Path.home() / ".cache" / "reckeras"))


def _build(flags):
    """The compiled library for ``flags`` (built once into the cache dir)."""
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


def _compile():
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


def library():
    """The loaded kernels, or None when they cannot be built here."""
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


def available():
    return library() is not None


def usable(*tensors):
    """True when the native kernels apply: contiguous CPU tensors, and floating
    point tensors in float32 (other table dtypes use the references)."""
    return all(t.device.type == "cpu" and t.is_contiguous()
               and (not t.is_floating_point() or t.dtype == torch.float32)
               for t in tensors) and available()


def _p(tensor):
    return ctypes.c_void_p(tensor.data_ptr())


def _threads():
    return torch.get_num_threads()


def table_keys(ids, salt, slot_counts):
    keys = torch.empty_like(ids)
    library().rk_table_keys(_p(ids), _p(salt), _p(slot_counts), slot_counts.numel(),
                            _p(keys), _threads())
    return keys


def initial_rows(keys, dim, scale, seed):
    out = torch.empty(keys.numel(), dim, dtype=torch.float32)
    library().rk_initial_rows(_p(keys), keys.numel(), dim, seed, float(scale), _p(out),
                              _threads())
    return out


def find_or_insert(slot_keys, slot_rows, keys, num_rows, insert=True):
    rows = torch.empty_like(keys)
    count = library().rk_find_or_insert(_p(slot_keys), _p(slot_rows), slot_keys.numel(),
                                        _p(keys), keys.numel(), _p(rows), num_rows,
                                        int(insert), _threads())
    return rows, count


def pool_forward(weights, unique_rows, unique_index, destination, id_weight, num_slots):
    out = torch.zeros(num_slots, weights.shape[1], dtype=torch.float32)
    library().rk_pool_forward(_p(weights), weights.shape[1], _p(unique_rows),
                              _p(unique_index), _p(destination), _p(id_weight),
                              destination.numel(), _p(out), num_slots, _threads())
    return out


def aggregate(grad_out, unique_index, destination, id_weight, num_unique):
    grads = torch.zeros(num_unique, grad_out.shape[1], dtype=torch.float32)
    library().rk_aggregate(_p(grad_out), grad_out.shape[1], _p(unique_index),
                           _p(destination), _p(id_weight), destination.numel(),
                           _p(grads), num_unique, _threads())
    return grads


_positions = threading.local()


def unique_rows(rows, num_rows):
    """``(unique, unique_index)``; unique rows in order of first appearance."""
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


def apply_update(kind, weights, state, rows, grads, lr, eps):
    library().rk_apply_update(UPDATE_KINDS[kind], _p(weights), _p(state),
                              state.shape[1], weights.shape[1], _p(rows), _p(grads),
                              rows.numel(), lr, eps, _threads())
