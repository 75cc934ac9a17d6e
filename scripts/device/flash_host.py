"""Where a small FlashAttention call's time goes (issue 18, item 1), on the GPU.

Host microseconds per call (no synchronisation inside the loop) at 1 x 1 x 128 x 64, bf16, causal: SDPA flash
forward+backward; ours through ``apply`` and ``.backward``; a trivial Python ``autograd.Function`` on CUDA (the
engine's cost of any Python backward); our launchers alone with the single-kernel backward and with the three-
kernel one; then the time inside each layer of ours (autograd.Function, each kernel's launch).

``--single``: forward+backward milliseconds (``triton.testing.do_bench``, what a caller sees, host-bound or not)
with the single-kernel backward against the three-kernel one over sequence lengths, batch-heads and head dims:
the measurement behind ``_tuning.SINGLE_MAX_N``.

    python scripts/device/flash_host.py [--single]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import torch.nn.functional as F
import triton
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


def launchers(q, k, v, do, causal: bool, config):
    left, right = normalize_window(None, causal, q.shape[-2], k.shape[-2])
    scale = q.shape[-1] ** -0.5

    def call():
        o, lse = ft._forward(q, k, v, config, left, right, None, None, scale)
        return ft._backward(q, k, v, o, lse, do, config, False, left, right, None, None, scale)
    return call


def host_layers() -> None:
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    apply = ft.FlashAttention2Triton.apply

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    base = _tuning.config_for(q.device, 128, 64, torch.bfloat16)
    single, three = (dataclasses.replace(base, single_max_programs=s) for s in (1 << 20, 0))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    rows = {
        "sdpa flash fwd+bwd": sdpa,
        "ours apply + backward": lambda: apply(q, k, v, True).backward(do),
        "python Function (clone) + backward": lambda: _Clone.apply(q, k, v).backward(do),
        "ours launchers, single-kernel bwd": launchers(qd, kd, vd, do, True, single),
        "ours launchers, three-kernel bwd": launchers(qd, kd, vd, do, True, three),
        "torch.empty x5": lambda: [torch.empty(128, 64, device="cuda") for _ in range(5)],
    }
    for name, call in rows.items():
        print(f"{name:38s} {host_us(call):8.1f} us/call")

    spent = {"Function.forward": 0.0, "Function.backward": 0.0}
    originals = (ft.FlashAttention2Triton.forward, ft.FlashAttention2Triton.backward, ft._Launch.__call__)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    def timed_launch(self, grid, pointers, scalars):
        return timed(f"launch {self.kernel.__name__}", originals[2])(self, grid, pointers, scalars)

    ft.FlashAttention2Triton.forward = staticmethod(timed("Function.forward", originals[0]))
    ft.FlashAttention2Triton.backward = staticmethod(timed("Function.backward", originals[1]))
    ft._Launch.__call__ = timed_launch
    plans = len(ft._PLANS)
    n = 1000
    try:
        total = host_us(lambda: apply(q, k, v, True).backward(do), n)
    finally:
        ft.FlashAttention2Triton.forward, ft.FlashAttention2Triton.backward = map(staticmethod, originals[:2])
        ft._Launch.__call__ = originals[2]
    print(f"apply + backward, instrumented: {total:.1f} us/call; launch plans {plans} -> {len(ft._PLANS)}")
    for name, seconds in spent.items():
        print(f"  in {name:36s} {seconds / (n + 20) * 1e6:8.1f} us/call")


def single_sweep() -> None:
    """Single-kernel against three-kernel backward (with our forward) over small and mid-sized calls; programs is
    the single kernel's grid, which ``FlashConfig.single_max_programs`` bounds."""
    print(f"{'bh':>5s} {'N':>6s} {'d':>4s} {'programs':>8s} {'single ms':>10s} {'three ms':>10s} {'ratio':>6s} default")
    for d in (64, 128):
        for bh in (16, 100, 400):
            for n in (128, 256, 512, 1024, 2048):
                q, k, v, do = (torch.randn(bh, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                base = _tuning.config_for(q.device, n, d, torch.bfloat16)
                programs = bh * max(-(-n // base.dkdv.block_n), -(-n // base.dkdv.block_m))
                ms = [triton.testing.do_bench(launchers(q, k, v, do, True,
                                                        dataclasses.replace(base, single_max_programs=s)),
                                              warmup=50, rep=200) for s in (1 << 30, 0)]
                default = "single" if programs <= base.single_max_programs else "three"
                print(f"{bh:5d} {n:6d} {d:4d} {programs:8d} {ms[0]:10.4f} {ms[1]:10.4f} {ms[0] / ms[1]:6.2f} {default}",
                      flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--single", action="store_true", help="also sweep the single-kernel backward's limit")
    args = p.parse_args()
    host_layers()
    if args.single:
        single_sweep()


if __name__ == "__main__":
    main()
