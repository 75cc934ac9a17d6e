"""Where the host time of one small FlashAttention forward+backward goes (issue 18: the 512-token rows are host-bound).

At each shape: microseconds per call, to the end of the GPU's work, of ours (the adapters' ``FlashAttention2Triton``)
forward alone and forward+backward, of SDPA (flash, cuDNN; the backend chosen once, outside the loop, and inside
each call as ``flash-bench`` does), and of the primitives a call is made of on this host (``torch.empty``, a
``data_ptr``, an empty ``autograd.Function`` and the same graph of C++ nodes, which the engine's device thread runs
without the GIL); then ``cProfile`` of ours, the functions by own time.

    python scripts/device/flash_host_profile.py [--shapes small_512 xl_512] [--calls 300] > $OUT/host.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention.flash_triton import FlashAttention2Triton
from cs336_systems.bench.flash import MODEL_SHAPES


def per_call_us(fn, calls: int) -> float:
    """Median over 5 rounds of ``calls`` calls, microseconds per call including the GPU's work."""
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return sorted(rounds)[2]


class _Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def profile_shape(name: str, calls: int) -> None:
    dev = torch.device("cuda")
    s = MODEL_SHAPES[name]
    q, k, v = (torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, device=dev, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)

    def ours_fwd():
        with torch.no_grad():
            FlashAttention2Triton.apply(q, k, v, True)

    def ours():
        FlashAttention2Triton.apply(q, k, v, True).backward(do)

    def sdpa_once():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    def sdpa_per_call(backend):
        def run():
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(do)
        return run

    for _ in range(3):
        ours()
    print(f"== {name}: {s.batch} x {s.heads} x {s.seq_len} x {s.head_dim}, bf16, causal; us per call")
    print(f"  ours forward (no grad)          {per_call_us(ours_fwd, calls):8.1f}")
    print(f"  ours forward+backward           {per_call_us(ours, calls):8.1f}")
    for label, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        with sdpa_kernel(backend):
            sdpa_once()
            print(f"  sdpa {label} fwd+bwd (backend set once) {per_call_us(sdpa_once, calls):8.1f}")
        run = sdpa_per_call(backend)
        run()
        print(f"  sdpa {label} fwd+bwd (set per call)  {per_call_us(run, calls):8.1f}")
    x = torch.randn(4, device=dev, requires_grad=True)
    primitives = {"torch.empty like q": lambda: torch.empty(q.shape, device=dev, dtype=q.dtype),
                  "q.data_ptr()": q.data_ptr,
                  "empty autograd.Function f+b": lambda: _Empty.apply(x).sum().backward(),
                  "C++ view f+b (no Python node)": lambda: x.view_as(x).sum().backward()}
    for label, fn in primitives.items():
        print(f"  {label:31s} {per_call_us(fn, calls):8.1f}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        ours()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
    print(out.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["small_512", "xl_512"])
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    for name in args.shapes:
        profile_shape(name, args.calls)


if __name__ == "__main__":
    main()
