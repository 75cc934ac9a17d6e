"""``torch.profiler`` results -> kernel summary tables (what Nsight Systems' "CUDA GPU Kernel
Summary" shows), the GEMM share of time, and the device time spent inside named ranges.

On a GPU the rows are device kernels (and memcpy / memset) with their device time; on a CPU, where
there are no kernels, the rows are the leaf operators with their self CPU time, so that the same
tables and tests work without a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch.autograd import DeviceType

# cuBLAS / cuBLASLt / CUTLASS matmul kernels (nvjet is cuBLASLt's Hopper family), Triton matmuls
# from torch.compile ("mm"/"bmm" templates), and the CPU matmul operators.
_GEMM_RE = re.compile(r"gemm|nvjet|xmma|cutlass|wgmma|_mm_|triton_tem_fused_(b)?mm|^aten::(mm|bmm|addmm|baddbmm)$",
                      re.IGNORECASE)


# record_function ranges that torch itself opens (not operators): never rows of a kernel table.
_RANGE_PREFIXES = ("ProfilerStep", "Optimizer.", "autograd::engine", "## ")


def is_gemm(kernel_name: str) -> bool:
    return bool(_GEMM_RE.search(kernel_name))


def _device_time_us(evt) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, attr):
            return float(getattr(evt, attr))
    return 0.0


def _total_device_time_us(evt) -> float:
    for attr in ("device_time_total", "cuda_time_total"):
        if hasattr(evt, attr):
            return float(getattr(evt, attr))
    return 0.0


def kernel_rows(prof: torch.profiler.profile, exclude_names: Iterable[str] = (), on_gpu: bool | None = None,
                ) -> list[dict]:
    """One row per kernel name: calls, total / average time, share of all kernel time (sorted, largest first).

    ``exclude_names``: range names (user annotations) that must not count as kernels.
    """
    exclude = set(exclude_names)
    averages = prof.key_averages()
    if on_gpu is None:
        on_gpu = any(e.device_type == DeviceType.CUDA for e in averages)
    rows = []
    for e in averages:
        if e.key in exclude or e.key.startswith(_RANGE_PREFIXES):
            continue
        if on_gpu:
            if e.device_type != DeviceType.CUDA:
                continue
            total_us = _device_time_us(e)
        else:
            if e.device_type != DeviceType.CPU:
                continue
            total_us = float(e.self_cpu_time_total)
        if total_us <= 0:
            continue
        rows.append({"kernel": e.key, "calls": int(e.count), "total_ms": total_us / 1e3,
                     "avg_us": total_us / max(e.count, 1), "gemm": is_gemm(e.key)})
    total = sum(r["total_ms"] for r in rows) or float("nan")
    for r in rows:
        r["pct"] = 100.0 * r["total_ms"] / total
    rows.sort(key=lambda r: r["total_ms"], reverse=True)
    return rows


def gemm_share(rows: list[dict]) -> float:
    """Fraction of kernel time spent in matmul kernels."""
    total = sum(r["total_ms"] for r in rows)
    return sum(r["total_ms"] for r in rows if r["gemm"]) / total if total else float("nan")


def range_times_ms(prof: torch.profiler.profile, names: Iterable[str], on_gpu: bool) -> dict[str, dict]:
    """Total time (device time of the kernels launched inside, on a GPU; CPU time otherwise) and call
    count of each named ``record_function`` range."""
    out = {n: {"total_ms": 0.0, "calls": 0} for n in names}
    for e in prof.events():
        if e.name in out and e.device_type == DeviceType.CPU:
            out[e.name]["total_ms"] += (_total_device_time_us(e) if on_gpu else float(e.cpu_time_total)) / 1e3
            out[e.name]["calls"] += 1
    return out


_GENERIC = {"elementwise_kernel", "vectorized_elementwise_kernel", "unrolled_elementwise_kernel", "reduce_kernel",
            "gpu_kernel_impl_nocast", "gpu_kernel_impl", "BinaryFunctor", "BUnaryFunctor", "UnaryFunctor",
            "AUnaryFunctor", "index_elementwise_kernel", "launch_kernel", "func_wrapper_t"}
_IDENT_RE = re.compile(r"\b(\w*(?:Functor|Ops|_kernel_cuda|_kernel|_impl)\w*)\b")


def short_kernel_name(name: str, width: int = 70) -> str:
    """A readable kernel name: GEMMs and copies as they are (cut to ``width``); PyTorch's templated
    elementwise / reduction kernels as ``<kind>: <the functor that says what they compute>``."""
    if is_gemm(name) or not name.startswith("void at::native::"):
        return name[:width]
    kind = name.removeprefix("void at::native::").split("<")[0]
    specific = [m for m in _IDENT_RE.findall(name) if m not in _GENERIC]
    return f"{kind}: {specific[0]}"[:width] if specific else name[:width]
