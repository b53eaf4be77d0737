"""The kernels compile for a real GPU target, and importing them defines none."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
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
def test_importing_the_kernel_modules_defines_no_triton_kernel():
    result = run("import reckeras.backend_kernels.pooling\n"
                 "import reckeras.backend_kernels.aggregation as a\n"
                 "import reckeras.backend_kernels.sparse_optimizers as s\n"
                 "import reckeras.backend_kernels.transforms as t\n"
                 "import reckeras.backend_kernels.hash_table as h\n"
                 "print(type(t._pack_sequences_kernel).__name__,"
                 " type(s._update_kernel).__name__, type(h._insert_kernel).__name__,"
                 " type(a._segment_sum_kernel).__name__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["function"] * 4
