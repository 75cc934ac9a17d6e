"""The Python work of one small FlashAttention forward+backward, on the CPU (issue 18: the 512-token rows are bound by
the host's time to issue a call).

Runs the adapters' ``FlashAttention2Triton`` eagerly on CPU tensors with the kernel launches stubbed out (no GPU, no
interpreter), so what is timed is the call's Python and the autograd engine: microseconds per forward+backward, beside
an empty ``autograd.Function`` of the same inputs and a C++ op's forward+backward; ``--profile`` adds ``cProfile`` of
ours by own time. Gradients are reset each call, as ``do_bench``'s ``grad_to_none`` does.

    python scripts/flash_host_python.py [--shape 1 1 128 64] [--calls 3000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

import cs336_systems.attention.flash_triton as ft


class _Empty(torch.autograd.Function):
    """Three inputs, one output; a gradient for Q only (no allocation of its own)."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


def per_call_us(fn, calls: int) -> float:
    """Median of seven rounds of ``calls`` calls, microseconds a call."""
    fn()
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return sorted(rounds)[3]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs=4, default=[1, 1, 128, 64], metavar=("B", "H", "N", "D"))
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    if ft._INTERPRETED:
        raise SystemExit("unset TRITON_INTERPRET: this times the compiled-kernel path's Python, with launches stubbed")
    ft._check_runnable = lambda t: None  # CPU tensors through the CUDA path's Python
    ft._Launch.__call__ = lambda self, grid, pointers, scalars: None
    q, k, v = (torch.randn(*args.shape, requires_grad=True) for _ in range(3))
    do = torch.randn(*args.shape)

    def reset():
        q.grad = k.grad = v.grad = None

    def ours():
        reset()
        ft.FlashAttention2Triton.apply(q, k, v, True).backward(do)

    def empty():
        reset()
        _Empty.apply(q, k, v).backward(do)

    def cpp_op():
        reset()
        (q + k).backward(do)

    print(f"shape {' x '.join(map(str, args.shape))}, us per forward+backward (median of 7 rounds of {args.calls})")
    rows = (("ours (launches stubbed)", ours), ("empty autograd.Function", empty), ("C++ op (q + k)", cpp_op))
    for label, fn in rows:
        print(f"  {label:26s} {per_call_us(fn, args.calls):8.1f}")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            ours()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())


if __name__ == "__main__":
    main()
