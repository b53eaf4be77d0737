"""Every Triton kernel is tested against its torch reference.

By default the kernels run in Triton's interpreter on CPU tensors: the root
``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before anything imports
torch or triton. With ``RECKERAS_TEST_DEVICE=cuda`` they run compiled on CUDA
tensors instead (``benchmarks/gpu_check.sh``). The references always run on
CPU tensors.
"""

import os

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # silences a 3.9 warning
