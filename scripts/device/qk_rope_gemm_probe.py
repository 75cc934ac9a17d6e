"""Probe (issue 19, the next epilogue candidate): RoPE in the epilogue of a dual GEMM that computes q and k.

In a warpgroup MMA's accumulator each thread holds pairs of adjacent columns, so rotating q's and k's (even, odd)
pairs by their position's angle is local to a thread: the dual GEMM of ``cs336_systems.fused.swiglu_gemm`` (one x
tile for both products) with a rotating epilogue would replace q = x Wq^T, k = x Wk^T by cuBLAS and RoPE's kernel
(``cs336_systems.fused.rope``), which reads and writes q and k once more. This times, at xl/2048's projections
(8,192 x 1,600 against 1,600 columns, head dim 64, positions 0..2047 per sequence):

- ``cublas+rope``: the two GEMMs and the Triton RoPE kernel on each (what the model runs with ``--rope triton``);
- ``cublas``: the two GEMMs alone;
- ``gluon-rope``: the warp-specialised dual GEMM with the rotation in its epilogue.

Timed as CUDA graphs (``triton.testing.do_bench_cudagraph``, medians), as the captured training step runs them:
with ``do_bench`` the RoPE kernels' host path dominates. Each output is checked against an fp32 reference with the
2x rule. Run on an H100:
``python scripts/device/qk_rope_gemm_probe.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from cs336_basics.model import RotaryEmbedding
from cs336_systems.fused import rope as fused_rope
from cs336_systems.fused.swiglu_gemm import (
    CONSUMER_REGS,
    FWD_CONFIG,
    _desc,
    _programs,
    _store_tile,
    _tile_coords,
    _ws_dual_producer,
    _ws_tiles,
)


@gluon.jit
def _rotate(v, om, on, COS, SIN, T, HALF: gl.constexpr):
    """``v`` (rows om.., columns on.. of q or k, fp32) with each (even, odd) column pair rotated by the angle of its
    row's position (row % T) and its pair's frequency ((column % (2 * HALF)) // 2)."""
    ROWS: gl.constexpr = v.shape[0]
    COLS: gl.constexpr = v.shape[1]
    even, odd = gl.split(gl.reshape(v, [ROWS, COLS // 2, 2]))
    layout: gl.constexpr = even.type.layout
    rows = om + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    pairs = on // 2 + gl.arange(0, COLS // 2, layout=gl.SliceLayout(0, layout))
    table = gl.expand_dims((rows % T) * HALF, 1) + gl.expand_dims(pairs % HALF, 0)
    c = gl.load(COS + table)
    s = gl.load(SIN + table)
    return gl.reshape(gl.join(even * c - odd * s, even * s + odd * c), [ROWS, COLS])


@gluon.jit
def _rope_consumer(q_desc, k_desc, COS, SIN, x_s, wq_s, wk_s, out_s, full, empty, M, N, K, T, HALF: gl.constexpr,
                   WG: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = x_s.type.shape[2]
    dtype: gl.constexpr = q_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    start, step, n_m, n_n, n_mine, k_tiles = _ws_tiles(M, N, K, 2 * ROWS, BLOCK_N, BLOCK_K)
    acc_q = gl.zeros([ROWS, BLOCK_N], gl.float32, acc_layout)
    acc_k = gl.zeros([ROWS, BLOCK_N], gl.float32, acc_layout)
    out = out_s.index(WG)
    it = 0
    for t in range(n_mine):
        for kk in range(k_tiles):
            stage = it % STAGES
            mbarrier.wait(full.index(stage), (it // STAGES) & 1)
            xs = x_s.index(2 * stage + WG)
            tok_q = warpgroup_mma(xs, wq_s.index(stage).permute((1, 0)), acc_q, use_acc=kk > 0, is_async=True)
            tok_k = warpgroup_mma(xs, wk_s.index(stage).permute((1, 0)), acc_k, use_acc=kk > 0, is_async=True)
            acc_q, acc_k = warpgroup_mma_wait(2, deps=(tok_q, tok_k))
            if kk > 0:
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
            it += 1
        acc_q, acc_k = warpgroup_mma_wait(0, deps=(acc_q, acc_k))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        om = pid_m * 2 * ROWS + WG * ROWS
        on = pid_n * BLOCK_N
        # q and k rounded as the unfused path stores them, rotated in fp32 and rounded once (as the RoPE kernel)
        q = _rotate(acc_q.to(dtype).to(gl.float32), om, on, COS, SIN, T, HALF)
        _store_tile(q_desc, out, q.to(dtype), om, on)
        k = _rotate(acc_k.to(dtype).to(gl.float32), om, on, COS, SIN, T, HALF)
        _store_tile(k_desc, out, k.to(dtype), om, on)
    tma.store_wait(pendings=0)


@gluon.jit
def _qk_rope_kernel(x_desc, wq_desc, wk_desc, q_desc, k_desc, COS, SIN, M, N, K, T, HALF: gl.constexpr,
                    GROUP_M: gl.constexpr, STAGES: gl.constexpr, REGS: gl.constexpr):
    ROWS: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = wq_desc.block_type.shape[0]
    dtype: gl.constexpr = x_desc.dtype
    x_s = gl.allocate_shared_memory(dtype, [2 * STAGES, ROWS, BLOCK_K], x_desc.layout)
    wq_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], wq_desc.layout)
    wk_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], wk_desc.layout)
    out_s = gl.allocate_shared_memory(dtype, [2, ROWS, BLOCK_N], q_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    gl.warp_specialize([
        (_rope_consumer, (q_desc, k_desc, COS, SIN, x_s, wq_s, wk_s, out_s, full, empty, M, N, K, T, HALF, 0,
                          GROUP_M, STAGES)),
        (_rope_consumer, (q_desc, k_desc, COS, SIN, x_s, wq_s, wk_s, out_s, full, empty, M, N, K, T, HALF, 1,
                          GROUP_M, STAGES)),
        (_ws_dual_producer, (x_desc, wq_desc, wk_desc, x_s, wq_s, wk_s, full, empty, M, N, K, GROUP_M, STAGES)),
    ], [4, 1], [REGS, 264 - REGS])


def qk_rope(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq: int,
            config: tuple = FWD_CONFIG) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated q = x Wq^T and k = x Wk^T for x (B * seq, d) whose row r is at position r % seq; cos, sin (>= seq,
    head_dim / 2) fp32 tables."""
    block_m, block_n, block_k, stages, group_m = config
    (m, k), n = x.shape, wq.shape[0]
    q, kk = x.new_empty(m, n), x.new_empty(m, n)
    rows = [block_m // 2, block_n]
    _qk_rope_kernel[(_programs(x.device, m, n, block_m, block_n),)](
        _desc(x, [block_m // 2, block_k]), _desc(wq, [block_n, block_k]), _desc(wk, [block_n, block_k]),
        _desc(q, rows), _desc(kk, rows), cos, sin, m, n, k, seq, HALF=cos.shape[1], GROUP_M=group_m, STAGES=stages,
        REGS=CONSUMER_REGS, num_warps=4)
    return q, kk


def _rotate_ref(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: int, seq: int, dim: int):
    v = v.double().view(batch, seq, -1, dim)
    c, s = cos[:seq, None].double(), sin[:seq, None].double()
    even, odd = v[..., 0::2], v[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), -1).flatten(-2).view(batch * seq, -1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    from triton.testing import do_bench_cudagraph  # the RoPE kernels are ~20 us: time them without the host

    batch, seq, d, dim = 4, 2048, 1600, 64
    torch.manual_seed(0)
    x = torch.randn(batch * seq, d, device="cuda", dtype=torch.bfloat16)
    wq, wk = (torch.randn(d, d, device="cuda", dtype=torch.bfloat16) / d**0.5 for _ in range(2))
    rope = RotaryEmbedding(seq, dim, device="cuda")
    cos, sin = rope.cos.contiguous(), rope.sin.contiguous()
    cos_t, sin_t = cos[:seq, None], sin[:seq, None]  # (T, 1, dim/2) against (B, T, H, dim)

    def unfused():
        q, k = x @ wq.T, x @ wk.T
        return (fused_rope.rotate(q.view(batch, seq, -1, dim), cos_t, sin_t).view(batch * seq, d),
                fused_rope.rotate(k.view(batch, seq, -1, dim), cos_t, sin_t).view(batch * seq, d))

    refs = [_rotate_ref(x.float() @ w.float().T, cos, sin, batch, seq, dim) for w in (wq, wk)]
    base = unfused()
    rows = []
    for label, fn, check in (("cublas+rope", unfused, True), ("cublas", lambda: (x @ wq.T, x @ wk.T), False),
                             ("gluon-rope", lambda: qk_rope(x, wq, wk, cos, sin, seq), True)):
        try:
            out = fn()
            errs = []
            if check:
                for got, b, ref in zip(out, base, refs, strict=True):
                    err, base_err = (got.double() - ref).abs().max().item(), (b.double() - ref).abs().max().item()
                    errs.append((err, base_err, err <= 2 * base_err + ref.abs().max().item() * 2**-8))
            ms = do_bench_cudagraph(fn, rep=300, return_mode="median")
        except Exception as e:  # a compile or resource failure of the Gluon kernel
            print(f"{label:<12} {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        ok = all(e[2] for e in errs)
        rows.append(dict(variant=label, ms=ms, errors=errs, ok=ok))
        print(f"{label:<12} {ms:.4f} ms  errors {[f'{e[0]:.2e}/{e[1]:.2e}' for e in errs]} {'ok' if ok else 'FAIL'}",
              flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "qk_rope_gemm.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
