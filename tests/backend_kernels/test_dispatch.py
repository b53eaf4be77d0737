"""dispatch: where a kernel runs, and the interpreter's precondition."""

import os
import subprocess
import sys

import pytest
import torch
from kernel_cases import requires_triton

from reckeras.backend_kernels import dispatch

PROBE = """
import torch
from reckeras.backend_kernels import dispatch
print(dispatch.interpreted())
try:
    with dispatch.triton_on_cpu():
        print(dispatch.use_triton(torch.zeros(1)), dispatch.use_native(torch.zeros(1)))
except RuntimeError as error:
    print("refused:", error)
"""


def probe(interpret):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@requires_triton
@pytest.mark.slow
def test_triton_on_cpu_needs_the_interpreter_from_the_first_import():
    assert probe(interpret=True) == ["True", "True False"]
    compiled = probe(interpret=False)
    assert compiled[0] == "False"
    assert compiled[1].startswith("refused:") and "TRITON_INTERPRET=1" in compiled[1] \
        and "import torch" in compiled[1]


def test_cpu_tensors_take_the_triton_route_only_inside_triton_on_cpu():
    assert not dispatch.use_triton(torch.zeros(1))


def test_blocks_and_powers_of_two():
    assert [dispatch.next_power_of_2(n) for n in (0, 1, 2, 3, 100, 128)] == \
        [1, 1, 2, 4, 128, 128]
    assert [dispatch.blocks(n, 1024) for n in (0, 1, 1024, 1025, 2049)] == [1, 1, 1, 2, 3]


@pytest.mark.parametrize("module", ["aggregation", "bucket_index", "hash_table", "hashing",
                                    "jagged_attention", "sparse_optimizers", "transforms",
                                    "pooling"])
def test_no_kernel_uses_a_private_triton_member(module):
    # Triton's private members (tl.standard._sum_combine, ...) change between
    # releases; the kernels use its public language only.
    import inspect
    import re

    source = inspect.getsource(__import__(f"reckeras.backend_kernels.{module}",
                                          fromlist=["_"]))
    assert not re.search(r"\btl(\.\w+)*\._\w+", source), module
