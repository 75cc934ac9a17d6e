"""Where a tiny FlashAttention call's host time goes, layer by layer (issue 18, item 1), on the GPU.

Host microseconds per call (no synchronisation inside the loop) at 1 x 1 x 128 x 64, bf16, causal:
SDPA flash forward+backward; ours through ``apply`` and ``.backward``; the same through ``autograd.grad``;
a trivial Python ``autograd.Function`` on CUDA (the engine's cost of any Python backward); ours with tensor
descriptors off (block pointers: no global scratch per launch); and ours' launchers alone.

    python scripts/device/flash_host.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import _tuning
from cs336_systems.attention import flash_triton as ft
from cs336_systems.attention._common import normalize_window


class _Clone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return q.clone()

    @staticmethod
    def backward(ctx, g):
        _ = ctx.saved_tensors  # unpacked as ours are (the engine checks their versions)
        return g, None, None


def host_us(call, n: int = 1000) -> float:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    apply = ft.FlashAttention2Triton.apply

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    qd, kd, vd = (t.detach() for t in (q, k, v))
    left, right = normalize_window(None, True, 128, 128)
    scale = 64 ** -0.5
    o, lse = ft._forward(qd, kd, vd, None, left, right, None, None, scale)
    ptr = _tuning.config_for(q.device, 128, 64, torch.bfloat16)
    no_tma = _tuning.FlashConfig(*(_tuning.KernelConfig(c.block_m, c.block_n, c.num_warps, c.num_stages, False)
                                   for c in (ptr.fwd, ptr.bwd, ptr.dkdv, ptr.dq)))
    rows = {
        "sdpa flash fwd+bwd": sdpa,
        "ours apply + backward": lambda: apply(q, k, v, True).backward(do),
        "ours apply + autograd.grad": lambda: torch.autograd.grad(apply(q, k, v, True), (q, k, v), do),
        "python Function (clone) + backward": lambda: _Clone.apply(q, k, v).backward(do),
        "ours launchers, TMA": lambda: (ft._forward(qd, kd, vd, None, left, right, None, None, scale),
                                        ft._backward(qd, kd, vd, o, lse, do, None, False, left, right, None, None,
                                                     scale)),
        "ours launchers, block pointers": lambda: (
            ft._forward(qd, kd, vd, no_tma, left, right, None, None, scale),
            ft._backward(qd, kd, vd, o, lse, do, no_tma, False, left, right, None, None, scale)),
        "ours forward launcher, TMA": lambda: ft._forward(qd, kd, vd, None, left, right, None, None, scale),
        "torch.empty x7": lambda: [torch.empty(128, 64, device="cuda") for _ in range(7)],
    }
    for name, call in rows.items():
        print(f"{name:38s} {host_us(call):8.1f} us/call")
    # Inside apply + backward: the time spent in each layer, and whether any launch missed the cache.
    spent = {"forward (autograd.Function)": 0.0, "backward (autograd.Function)": 0.0, "_backward": 0.0}
    originals = (ft.FlashAttention2Triton.forward, ft.FlashAttention2Triton.backward, ft._backward)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        return wrapper

    stream = torch.cuda.current_stream().cuda_stream
    micro = {
        "triton.set_allocator": lambda: ft.triton.set_allocator(ft._tma_workspace),
        "_tma_ready(q, k, v, o)": lambda: ft._tma_ready(qd, kd, vd, o),
        "_tma_workspace": lambda: ft._tma_workspace(4096, 128, stream),
        "forward launcher, block pointers": lambda: ft._forward(qd, kd, vd, no_tma, left, right, None, None, scale),
        "forward launcher, TMA (again)": lambda: ft._forward(qd, kd, vd, None, left, right, None, None, scale),
        "forward launcher, TMA, q requiring grad": lambda: ft._forward(q, k, v, None, left, right, None, None, scale),
        "apply, forward only": lambda: apply(q, k, v, True),
    }
    for name, call in micro.items():
        print(f"{name:38s} {host_us(call):8.1f} us/call")
    for kernel_key in ("fwd", "pre", "dkdv", "post"):
        spent[f"_launch {kernel_key}"] = 0.0
    original_launch = ft._launch

    def timed_launch(kernel, key, *args):
        t0 = time.perf_counter()
        try:
            return original_launch(kernel, key, *args)
        finally:
            spent[f"_launch {key[0]}"] += time.perf_counter() - t0

    ft._launch = timed_launch
    ft.FlashAttention2Triton.forward = staticmethod(timed("forward (autograd.Function)", originals[0]))
    ft.FlashAttention2Triton.backward = staticmethod(timed("backward (autograd.Function)", originals[1]))
    ft._backward = timed("_backward", originals[2])
    launches = len(ft._LAUNCHES)
    n = 1000
    total = host_us(lambda: apply(q, k, v, True).backward(do), n)
    print(f"apply + backward, instrumented: {total:.1f} us/call; cached launches {launches} -> {len(ft._LAUNCHES)}")
    for name, seconds in spent.items():
        print(f"  in {name:30s} {seconds / (n + 20) * 1e6:8.1f} us/call")


if __name__ == "__main__":
    main()
