"""Scratch A/B (session 18): the middle kernel, committed (a program per item) vs session 17's dynamic persistent
patch vs the prefetching persistent kernel, pre + mid timed in one process, rounds interleaved."""
import math
import os
import sys

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(__file__))
import _dyn_bwd as dyn  # noqa: E402
import _old_bwd as old  # noqa: E402

from cs336_systems.attention import flash_hopper_bwd as hb  # noqa: E402
from cs336_systems.attention import flash_triton as ft  # noqa: E402

SHAPES = [  # b, hq, hkv, n, d, causal
    (4, 25, 25, 2048, 64, True), (1, 16, 16, 16384, 64, True), (4, 25, 25, 512, 64, True),
    (8, 12, 12, 512, 64, True), (1, 16, 16, 4096, 128, True), (8, 16, 16, 2048, 128, False),
    (2, 32, 8, 8192, 128, True), (2, 32, 32, 32768, 128, True),
]
VAR = {64: hb.Variant(64, 64, 64, 4, 2), 128: hb.Variant(128, 64, 32, 4, 3)}


def launches(kind, q, k, v, o, lse, do, causal, var):
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d)
    bh, bh_kv = b * hq, b * hkv
    delta = torch.empty(bh * n_q + 1, device="cuda", dtype=torch.float32)[:-1].view(bh, n_q)
    dq_acc = torch.empty((bh, n_q, d), device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sq, skv = (n_q * d, d, 1), (n_k * d, d, 1)
    row_grid = (triton.cdiv(n_q, 64), bh)
    mod = dict(old=old, dyn=dyn, new=hb)[kind]
    if kind == "old":
        grid, heads = (triton.cdiv(n_k, var.block_n), bh_kv), hkv
    else:
        grid, heads = (hb.persistent_programs(n_k, var.block_n, bh_kv, var.num_warps, q.device),), bh_kv

    def pre():
        ft._flash_bwd_preprocess[row_grid](o, do, delta, dq_acc, *sq, *sq, n_q, HEAD_DIM=d, D_PAD=d, BLOCK_M=64,
                                           ZERO_DQ=True)

    def mid():
        triton.set_allocator(ft._tma_workspace)
        mod._hopper_bwd_dkdv_kernel[grid](
            q, k, v, do, lse, delta, dk, dv, dq_acc, lse, lse, *sq, *skv, *skv, *sq, *skv, *skv, n_q, n_k, hq // hkv,
            heads, 0, 0, scale, scale * ft.LOG2E, **var.constexprs(causal), num_warps=var.num_warps, num_stages=1)

    def post():
        ft._flash_bwd_dq_postprocess[row_grid](dq_acc, dq, *sq, n_q, scale, HEAD_DIM=d, D_PAD=d, BLOCK_M=64)

    return pre, mid, post, (dq, dk, dv)


def main():
    torch.manual_seed(0)
    for b, hq, hkv, n, d, causal in SHAPES:
        q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn_like(q)
        o, lse = ft.flash_forward(q, k, v, causal)
        var = VAR[d]
        runs = {kind: launches(kind, q, k, v, o, lse, do, causal, var) for kind in ("old", "dyn", "new")}
        grads = {}
        for kind, (pre, mid, post, g) in runs.items():
            pre(); mid(); post()
            torch.cuda.synchronize()
            grads[kind] = [t.float().clone() for t in g]
        diff = {kind: max((a - r).abs().max().item() for a, r in zip(grads[kind], grads["old"]))
                for kind in ("dyn", "new")}
        times = {kind: [] for kind in runs}
        for _ in range(3):
            for kind, (pre, mid, _post, _g) in runs.items():
                times[kind].append(triton.testing.do_bench(lambda: (pre(), mid()), warmup=25, rep=150))
        best = {kind: min(t) for kind, t in times.items()}
        print(f"{b}x{hq}/{hkv}x{n}x{d}{' causal' if causal else ''}: old {best['old']:.4f} dyn {best['dyn']:.4f} "
              f"new {best['new']:.4f} ms; new/old {best['new'] / best['old']:.3f} dyn/old "
              f"{best['dyn'] / best['old']:.3f}; all rounds {times}; max|grad - old| dyn {diff['dyn']:.2e} "
              f"new {diff['new']:.2e}", flush=True)
        del runs, grads
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
