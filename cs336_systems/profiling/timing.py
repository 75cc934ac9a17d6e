"""Timing helpers: host timer with device synchronisation (the handout's method), CUDA events as a
cross-check, summary statistics, and the measured matmul peak used as the MFU denominator."""

from __future__ import annotations

import functools
import statistics
import timeit
from collections.abc import Callable
from contextlib import contextmanager

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(samples: list[float]) -> dict[str, float]:
    """mean / std (sample) / median / min of ``samples`` (seconds), as milliseconds."""
    if not samples:
        return {"mean_ms": float("nan"), "std_ms": float("nan"), "median_ms": float("nan"), "min_ms": float("nan")}
    ms = [s * 1e3 for s in samples]
    return {
        "mean_ms": statistics.fmean(ms),
        "std_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
    }


class PhaseTimer:
    """Times named phases of a step: host clock (``timeit.default_timer``) after a device
    synchronize, plus CUDA events recorded around the same region on GPUs."""

    def __init__(self, device: torch.device):
        self.device = device
        self.host: dict[str, list[float]] = {}
        self._events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {}

    @contextmanager
    def phase(self, name: str, record: bool = True):
        synchronize(self.device)
        start_ev = end_ev = None
        if record and self.device.type == "cuda":
            start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_ev.record()
        t0 = timeit.default_timer()
        yield
        if end_ev is not None:
            end_ev.record()
        synchronize(self.device)
        if record:
            self.host.setdefault(name, []).append(timeit.default_timer() - t0)
            if start_ev is not None:
                self._events.setdefault(name, []).append((start_ev, end_ev))

    def event_seconds(self, name: str) -> list[float]:
        return [s.elapsed_time(e) / 1e3 for s, e in self._events.get(name, [])]


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
