"""The measured matmul peak used as the MFU denominator. The timing harness itself (synchronised host
timer, CUDA-event cross-check, summaries) lives in ``cs336_systems.bench.harness``."""

from __future__ import annotations

import functools
import statistics
import timeit
from collections.abc import Callable

import torch


@functools.cache
def matmul_peak_tflops(device_type: str, dtype: torch.dtype) -> float:
    """Measured dense matmul throughput (TFLOP/s) of this device in ``dtype``: the MFU denominator.

    GPU: 8192^3 product on random data, median of CUDA-event timings (fp32 uses TF32 only if the
    user enabled it). CPU: a 1024^3 product, so the CPU default stays quick.
    """
    device = torch.device(device_type)
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    fn: Callable[[], torch.Tensor] = lambda: a @ b
    if device.type == "cuda":
        from triton.testing import do_bench

        ms = do_bench(fn, warmup=100, rep=500, return_mode="median")
    else:
        fn()
        times = []
        for _ in range(5):
            t0 = timeit.default_timer()
            fn()
            times.append(timeit.default_timer() - t0)
        ms = statistics.median(times) * 1e3
    return 2 * n**3 / (ms * 1e-3) / 1e12
