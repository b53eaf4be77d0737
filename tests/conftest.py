import dataclasses
import os

import pytest

# The Triton kernels run in Triton's interpreter on CPU tensors unless the
# suite runs on a GPU (RECKERAS_TEST_DEVICE=cuda, benchmarks/gpu_check.sh).
# triton.language makes its functions (tl.sum, tl.max, ...) interpreted or
# compiled when it is first imported, and torch imports it: so this is set
# before anything imports torch.
if os.environ.get("RECKERAS_TEST_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

# reckeras selects Keras's torch backend; import it before any test module
# imports keras (Keras reads its backend once, at first import).
import reckeras  # noqa: E402, F401
from reckeras import config  # noqa: E402


@pytest.fixture(autouse=True)
def _options_restored():
    # A test that changes rk.config's options leaves them as it found them.
    saved = config.options()
    yield
    config.set(**dataclasses.asdict(saved))
