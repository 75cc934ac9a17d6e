"""Where the per-call time of a tiny FlashAttention call goes (issue 18, step 1), on the GPU.

Times forward and forward+backward of ours and the SDPA peers at 1 x 1 x 128 x 64 (bf16, causal) with
``triton.testing.do_bench``, then profiles ours: host wall time per call, ``cProfile`` (Python functions
by own time) and ``torch.profiler`` (CPU ops and CUDA kernels).

    python scripts/device/flash_floor.py [--shape B H N D] [--no-causal]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from cs336_systems.attention.flash_triton import FlashAttention2Triton


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", nargs=4, type=int, default=[1, 1, 128, 64])
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    causal = not args.no_causal
    q, k, v = (torch.randn(*args.shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)

    def sdpa(backend):
        def fn(q, k, v, c):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=c)
        return fn

    impls = {"ours": FlashAttention2Triton.apply, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
             "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    for name, fn in impls.items():
        def fwd_bwd(fn=fn):
            fn(q, k, v, causal).backward(do)
        fwd = do_bench(lambda fn=fn: fn(q, k, v, causal), warmup=50, rep=300, return_mode="median")
        fb = do_bench(fwd_bwd, warmup=50, rep=300, grad_to_none=[q, k, v], return_mode="median")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fwd_bwd()
        host = (time.perf_counter() - t0) / 200 * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 200 * 1e3
        print(f"{name:11s} fwd {fwd:.4f} ms  fwd+bwd {fb:.4f} ms  host/call {host:.4f} ms  wall/call {wall:.4f} ms")
    if not args.profile:
        return
    fn = impls["ours"]
    # the host time of each layer of a call: scripts/device/flash_host.py
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fn(q, k, v, causal).backward(do)
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    pstats.Stats(pr).sort_stats("cumulative").print_stats(40)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn(q, k, v, causal).backward(do)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
