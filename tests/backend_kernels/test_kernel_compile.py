"""The kernels compile for a real GPU target, and importing them defines none."""

import os
import subprocess
import sys
from pathlib import Path

import kernel_cases
import pytest
import torch
from kernel_cases import DEVICE, requires_triton

HERE = Path(__file__).parent


def run(code_or_script, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, *(["-c", code_or_script] if "\n" in code_or_script
                                 or " " in code_or_script else [code_or_script]), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@requires_triton
@pytest.mark.skipif(DEVICE.type == "cuda", reason="the CUDA run compiles them for real")
@pytest.mark.slow
def test_every_kernel_compiles_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    result = run(str(HERE / "compile_kernels.py"), "90")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_importing_reckeras_defines_no_triton_kernel_and_imports_no_triton():
    result = run("import sys\n"
                 "import reckeras\n"
                 "from reckeras.backend_kernels import (aggregation, bucket_index, dispatch,\n"
                 "    hash_table, hashing, jagged_attention, pooling, sparse_optimizers,\n"
                 "    transforms)\n"
                 "print(type(transforms._pack_sequences_kernel).__name__,"
                 " type(sparse_optimizers._update_kernel).__name__,"
                 " type(hash_table._insert_kernel).__name__,"
                 " type(bucket_index._place_kernel).__name__,"
                 " type(aggregation._segment_sum_kernel).__name__)\n"
                 "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["Kernel Kernel Kernel Kernel Kernel", "[]"]


@requires_triton
def test_a_launch_jits_the_kernel_and_leaves_the_module_as_it_was():
    # The module keeps its Kernel handle and gains no names: the jitted
    # function lives in the handle, over a namespace of its own.
    from reckeras.backend_kernels import dispatch, hashing, transforms

    before = dict(vars(transforms)), dict(vars(hashing))
    with kernel_cases.triton_route():
        ids = torch.tensor([[1, -5], [7, 2**62]], device=DEVICE)
        out = transforms.hash_into_buckets(ids, torch.tensor([0, 10], device=DEVICE))
    assert torch.equal(out.cpu(), transforms.hash_into_buckets_reference(
        ids.cpu(), torch.tensor([0, 10])))
    assert (dict(vars(transforms)), dict(vars(hashing))) == before
    assert isinstance(transforms._hash_into_buckets_kernel, dispatch.Kernel)
    jitted = transforms._hash_into_buckets_kernel.jit()
    assert jitted is transforms._hash_into_buckets_kernel.jit()      # jitted once
    assert "tl" not in vars(transforms) and "tl" not in vars(hashing)
