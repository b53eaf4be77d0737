"""Dense layers' products: torch's matmul (MKL on CPU) against oneDNN.

`rk.Model`'s steps run its own Keras `Dense` matmuls through
`reckeras.backend_kernels.dense_matmul` (oneDNN; `rk.config`'s `onednn_dense`
turns it off); torch's own
`torch.matmul` goes to MKL's sgemm. For the layer shapes of the benchmark
workloads (batch 2048) this times, side by side and alternating call by
call, the three products of a training step of one layer: the forward
`x @ kernel`, the input gradient `grad @ kernel.T` and the kernel gradient
`x.T @ grad`, each as torch computes it and as `OneDNNMatmul` does. It
prints the median milliseconds and the ratio per product, and checks that
both give the same values (float32 rounding apart).

    python benchmarks/dense_matmul.py [--threads 2] [--calls 30]
"""

import argparse
import time

import numpy as np
import torch

from reckeras._allocator import tune_malloc
from reckeras.backend_kernels import dense_matmul

# (name, inputs, outputs) of the workloads' Dense layers.
LAYERS = (("wide top", 2408, 64), ("huge top", 8008, 64), ("dlrm top 1", 367, 512),
          ("dlrm top 2", 512, 256), ("dlrm bottom 1", 13, 512))


def products(batch, inputs, outputs, generator):
    """`{product: (torch's fn, oneDNN's fn)}` for one layer."""
    x = torch.randn(batch, inputs, generator=generator)
    kernel = torch.randn(inputs, outputs, generator=generator)
    grad = torch.randn(batch, outputs, generator=generator)
    onednn = dense_matmul.OneDNNMatmul

    def onednn_backward(needs_x):
        x_ = x.detach().requires_grad_(needs_x)
        kernel_ = kernel.detach().requires_grad_(not needs_x)
        out = onednn.apply(x_, kernel_)
        return lambda: torch.autograd.grad(out, x_ if needs_x else kernel_, grad,
                                           retain_graph=True)[0]

    return {"forward": (lambda: torch.matmul(x, kernel), lambda: onednn.apply(x, kernel)),
            "input gradient": (lambda: grad @ kernel.t(), onednn_backward(True)),
            "kernel gradient": (lambda: x.t() @ grad, onednn_backward(False))}


def median_ms(fns, calls):
    """Median ms of each fn, the fns called in turn (after 3 warm-up rounds)."""
    seconds = [[] for _ in fns]
    for round_ in range(calls + 3):
        for fn, measured in zip(fns, seconds):
            start = time.perf_counter()
            fn()
            if round_ >= 3:
                measured.append(time.perf_counter() - start)
    return [1e3 * float(np.median(s)) for s in seconds]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--batch", type=int, default=2048)
    args = parser.parse_args()
    if not dense_matmul.available():
        print("torch has no oneDNN here: nothing to compare")
        return
    torch.set_num_threads(args.threads)
    tune_malloc()               # glibc's malloc as a training process has it (fit tunes it)
    generator = torch.Generator().manual_seed(0)
    print(f"batch {args.batch}, {args.threads} torch threads, median of {args.calls} calls\n")
    print("| layer | product | torch.matmul ms | oneDNN ms | speed-up |")
    print("|---|---|---|---|---|")
    for name, inputs, outputs in LAYERS:
        for product, (reference, onednn) in products(args.batch, inputs, outputs,
                                                     generator).items():
            np.testing.assert_allclose(onednn().numpy(), reference().numpy(),
                                       rtol=1e-3, atol=1e-2)
            torch_ms, onednn_ms = median_ms([reference, onednn], args.calls)
            print(f"| {name} ({inputs}->{outputs}) | {product} | {torch_ms:.2f} | "
                  f"{onednn_ms:.2f} | {torch_ms / onednn_ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
