"""Every Triton kernel is tested against its torch reference.

By default the kernels run in Triton's interpreter on CPU tensors: this file
sets ``TRITON_INTERPRET=1`` before any kernel is defined (reckeras defines its
Triton kernels at their first launch, never at import). With
``RECKERAS_TEST_DEVICE=cuda`` they run compiled on CUDA tensors instead
(``benchmarks/gpu_check.sh``). The references always run on CPU tensors.
"""

import os

if os.environ.get("RECKERAS_TEST_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # silences a 3.9 warning
