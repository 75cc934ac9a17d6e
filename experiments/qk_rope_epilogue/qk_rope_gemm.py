# Snapshot of cs336_systems/fused/qk_rope_gemm.py at e30b10e (session 30): see README.md here.
"""RoPE inside the q/k projections' GEMM on Hopper (Gluon): q = R(x Wq^T) and k = R(x Wk^T) from one kernel.

Unfused, cuBLAS writes q and k and RoPE's kernel (``cs336_systems.fused.rope``) reads and writes both again: at
xl/2048 on an H100, 0.180 ms a block for the two GEMMs and the rotations against 0.147 for the GEMMs alone
(``scripts/device/qk_rope_gemm_probe.py``, CUDA graphs; docs/training_step.md, session 29). Here the dual GEMM of
``swiglu_gemm`` (one x tile for both products, the same producer warp and consumer mainloop) rotates in its
epilogue: in a warpgroup MMA's accumulator each thread holds pairs of adjacent columns, so rotating each (even,
odd) pair by its row's angle is local to a thread (the cos / sin table values are gathered by row position and
column pair from the small fp32 tables). 0.156 ms in the same probe.

Rounding follows the unfused path: q and k are rounded to the input dtype as cuBLAS stores them, rotated in fp32
and rounded once (as the RoPE kernel). Scope as ``swiglu_gemm.supported``; row r of x takes table row r % P.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from cs336_systems.fused.swiglu_gemm import (
    CONSUMER_REGS,
    FWD_CONFIG,
    _desc,
    _dual_mainloop,
    _programs,
    _store_tile,
    _tile_coords,
    _ws_dual_producer,
    _ws_tiles,
    supported,  # noqa: F401  (re-exported: the scope is swiglu_gemm's)
)


@gluon.jit
def _rotate(v, om, on, COS, SIN, P, HALF: gl.constexpr):
    """``v`` (rows om.., columns on.. of q or k, fp32) with each (even, odd) column pair rotated by the angle of its
    row's table row (row % P) and its pair's frequency ((column // 2) % HALF)."""
    ROWS: gl.constexpr = v.shape[0]
    COLS: gl.constexpr = v.shape[1]
    even, odd = gl.split(gl.reshape(v, [ROWS, COLS // 2, 2]))
    layout: gl.constexpr = even.type.layout
    rows = om + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    pairs = on // 2 + gl.arange(0, COLS // 2, layout=gl.SliceLayout(0, layout))
    table = gl.expand_dims((rows % P) * HALF, 1) + gl.expand_dims(pairs % HALF, 0)
    c = gl.load(COS + table)
    s = gl.load(SIN + table)
    return gl.reshape(gl.join(even * c - odd * s, even * s + odd * c), [ROWS, COLS])


@gluon.jit
def _rope_consumer(q_desc, k_desc, COS, SIN, x_s, wq_s, wk_s, out_s, full, empty, M, N, K, P, HALF: gl.constexpr,
                   WG: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """Rows WG * 64 .. WG * 64 + 63 of every tile: both products, then rotated q and k through this warpgroup's
    output buffer."""
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
        acc_q, acc_k, it = _dual_mainloop(x_s, wq_s, wk_s, full, empty, acc_q, acc_k, it, k_tiles, WG, STAGES)
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        om = pid_m * 2 * ROWS + WG * ROWS
        on = pid_n * BLOCK_N
        q = _rotate(acc_q.to(dtype).to(gl.float32), om, on, COS, SIN, P, HALF)
        _store_tile(q_desc, out, q.to(dtype), om, on)
        k = _rotate(acc_k.to(dtype).to(gl.float32), om, on, COS, SIN, P, HALF)
        _store_tile(k_desc, out, k.to(dtype), om, on)
    tma.store_wait(pendings=0)


@gluon.jit
def _qk_rope_kernel(x_desc, wq_desc, wk_desc, q_desc, k_desc, COS, SIN, M, N, K, P, HALF: gl.constexpr,
                    GROUP_M: gl.constexpr, STAGES: gl.constexpr, REGS: gl.constexpr):
    """Rotated q = x Wq^T and k = x Wk^T for x (M, K), Wq and Wk (N, K); COS and SIN (P, HALF) fp32; x's and the
    outputs' descriptors have blocks of half a tile's rows (launch with 4 warps: the first consumer)."""
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
        (_rope_consumer, (q_desc, k_desc, COS, SIN, x_s, wq_s, wk_s, out_s, full, empty, M, N, K, P, HALF, 0,
                          GROUP_M, STAGES)),
        (_rope_consumer, (q_desc, k_desc, COS, SIN, x_s, wq_s, wk_s, out_s, full, empty, M, N, K, P, HALF, 1,
                          GROUP_M, STAGES)),
        (_ws_dual_producer, (x_desc, wq_desc, wk_desc, x_s, wq_s, wk_s, full, empty, M, N, K, GROUP_M, STAGES)),
    ], [4, 1], [REGS, 264 - REGS])


def qk_rope(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            config: tuple = FWD_CONFIG) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated q = x Wq^T and k = x Wk^T for x (M, K) and Wq, Wk (N, K), N a multiple of 2 * HALF; row r of x takes
    the angles of row r % P of ``cos`` / ``sin`` (P, HALF), contiguous fp32. ``config`` as
    ``swiglu_gemm.dual_swiglu``'s."""
    block_m, block_n, block_k, stages, group_m = config
    (m, k), n = x.shape, wq.shape[0]
    q, kk = x.new_empty(m, n), x.new_empty(m, n)
    rows = [block_m // 2, block_n]
    _qk_rope_kernel[(_programs(x.device, m, n, block_m, block_n),)](
        _desc(x, [block_m // 2, block_k]), _desc(wq, [block_n, block_k]), _desc(wk, [block_n, block_k]),
        _desc(q, rows), _desc(kk, rows), cos, sin, m, n, k, cos.shape[0], HALF=cos.shape[1], GROUP_M=group_m,
        STAGES=stages, REGS=CONSUMER_REGS, num_warps=4)
    return q, kk
