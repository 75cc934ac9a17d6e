"""A/B of the warp-specialised Gluon forward at head dim 128: ping-pong turns on/off, K and V stages released
together or apart (SPLIT), 64- and 128-key tiles; one process, same inputs; O checked against an fp64
reference by the 2x-SDPA rule. Session 19.

    PYTHONPATH=$PWD python3 experiments/flash_pingpong/ab_fwd_pingpong.py
"""
import math

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import flash_hopper as fh
from cs336_systems.attention import flash_triton as ft

VARIANTS = [(64, 3, False, False), (64, 3, False, True), (64, 3, True, True), (128, 2, False, True),
            (128, 2, True, True), (128, 3, True, True)]
SHAPES = [(1, 16, 4096, True), (8, 16, 2048, False), (2, 32, 32768, True), (2, 32, 8192, True), (1, 2, 333, True),
          (2, 3, 1000, False)]


def launch(q, k, v, causal, bn, stages, pp, split):
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(b * h, n, device=q.device, dtype=torch.float32)
    s3 = (n * d, d, 1)
    triton.set_allocator(ft._tma_workspace)
    fh._hopper_fwd_ws_kernel[(triton.cdiv(n, 128), b * h)](
        q, k, v, o, lse, lse, lse, *s3, *s3, *s3, *s3, n, n, 1, h, 0, 0, d ** -0.5 * 1.4426950408889634,
        HEAD_DIM=d, BLOCK_M=128, BLOCK_N=bn, CAUSAL=causal, STAGES=stages, PINGPONG=pp, SPLIT=split, num_warps=4)
    return o, lse


def label(bn, st, pp, split):
    return f"n{bn}/s{st}/{'pp' if pp else '--'}/{'split' if split else 'kv'}"


def time_variants(q, k, v, causal):
    times = {}
    for bn, st, pp, split in VARIANTS:
        times[label(bn, st, pp, split)] = triton.testing.do_bench(
            lambda bn=bn, st=st, pp=pp, split=split: launch(q, k, v, causal, bn, st, pp, split), warmup=25, rep=200)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        times["cudnn"] = triton.testing.do_bench(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=200)
    return times


def main():
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for b, h, n, causal in SHAPES:
        d = 128
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        name = f"{b}x{h}x{n}x{d}{' causal' if causal else ''}"
        if n <= 4096:
            s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(d)
            if causal:
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
            ref = torch.softmax(s, -1) @ v.double()
            peer = (F.scaled_dot_product_attention(q, k, v, is_causal=causal).double() - ref).abs().max().item()
            for bn, st, pp, split in VARIANTS:
                o, _ = launch(q, k, v, causal, bn, st, pp, split)
                err = (o.double() - ref).abs().max().item()
                print(f"{name:<28} {label(bn, st, pp, split)} err {err:.2e} sdpa {peer:.2e} "
                      f"{'ok' if err <= 2 * peer + 1e-2 else 'FAIL'}", flush=True)
        if n < 2048:
            continue
        times = time_variants(q, k, v, causal)
        base = times[label(*VARIANTS[0])]
        print(f"{name:<28} " + "  ".join(f"{k_} {t:.4f} ({t / base:.3f})" for k_, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
