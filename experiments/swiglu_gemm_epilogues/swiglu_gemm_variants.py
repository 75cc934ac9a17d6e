# Snapshot of cs336_systems/fused/swiglu_gemm.py at 152f6b9 (session 29): see README.md here.
"""SwiGLU inside its matmuls on Hopper (Gluon): the feed-forward's elementwise passes as GEMM epilogues.

The compiled feed-forward ``w2(silu(w1 x) * w3 x)`` writes a = x W1^T and b = x W3^T, reads both to write h, and in
the backward writes dh = dy W2, then reads dh, a and b to write da and db: at xl/2048 those elementwise passes are
0.25 ms of each block's 1.2 ms of feed-forward work (docs/training_step.md). Here:

- ``dual_swiglu(x, w1, w3)``: one persistent kernel computes a tile of a and the same tile of b from one load of
  x's tile (CUTLASS calls this a dual GEMM) and writes h = silu(a) * b, a and b from its registers;
- ``swiglu_backward(dy, w2, a, b)``: dh = dy W2 whose epilogue reads a and b (loaded by TMA while the tile's
  products run) and writes da = dh * b * silu'(a) and db = dh * silu(a); dh itself never reaches memory.

Both are software-pipelined warpgroup-MMA kernels (TMA ring of ``STAGES`` buffers, one MMA group in flight, the
next tile's loads in flight under the epilogue), one program per SM taking tiles in groups of ``GROUP_M`` row
tiles (the Triton matmul tutorial's order). Rounding follows the unfused path: a, b and dh are rounded to the input
dtype before the elementwise arithmetic, which runs in fp32.

Scope: sm_90, bf16 or fp16, 2-D row-major operands with 16-byte aligned rows (``supported``).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps, GROUP_M): the software-pipelined kernels, and the warp-specialised
# ones (num_warps unused: 4 a consumer warpgroup) that ``cs336_systems.fused.swiglu`` runs; measured at the xl
# shapes on an H100 (scripts/device/swiglu_dual_gemm_probe.py, docs/training_step.md, session 29)
FWD_CONFIG = (128, 128, 64, 4, 8, 8)
BWD_CONFIG = (128, 128, 64, 4, 8, 8)
FWD_WS_CONFIG = (128, 128, 64, 4, 4, 8)
BWD_WS_CONFIG = (128, 128, 64, 5, 4, 8)


@gluon.jit
def _tile_coords(tile, n_m, n_n, GROUP_M: gl.constexpr):
    """(row tile, column tile) of ``tile`` in groups of GROUP_M row tiles."""
    per_group = GROUP_M * n_n
    first_m = (tile // per_group) * GROUP_M
    rows = gl.minimum(n_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


@gluon.jit
def _sigmoid(x):
    return 1.0 / (1.0 + gl.exp(-x))


@gluon.jit
def _load_dual(it, total, k_tiles, start, step, n_m, n_n, x_desc, w1_desc, w3_desc, x_s, w1_s, w3_s, bars,
               GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """TMA loads of the program's flattened iteration ``it`` (tile it // k_tiles, K slice it % k_tiles)."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w1_desc.block_type.shape[0]
    stage = it % STAGES
    pred = it < total
    pid_m, pid_n = _tile_coords(start + (it // k_tiles) * step, n_m, n_n, GROUP_M)
    k = (it % k_tiles) * BLOCK_K
    bar = bars.index(stage)
    mbarrier.expect(bar, x_desc.block_type.nbytes + 2 * w1_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(x_desc, [pid_m * BLOCK_M, k], bar, x_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(w1_desc, [pid_n * BLOCK_N, k], bar, w1_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(w3_desc, [pid_n * BLOCK_N, k], bar, w3_s.index(stage), pred=pred)


@gluon.jit
def _store_tile(desc, out_s, value, om, on):
    """``value`` to ``desc`` at (om, on) through ``out_s`` once the previous store has left it."""
    tma.store_wait(pendings=0)
    out_s.store(value)
    fence_async_shared()
    tma.async_copy_shared_to_global(desc, [om, on], out_s)


@gluon.jit
def _dual_swiglu_kernel(x_desc, w1_desc, w3_desc, h_desc, a_desc, b_desc, M, N, K, GROUP_M: gl.constexpr,
                        STAGES: gl.constexpr, SAVE_AB: gl.constexpr, MMA_LAG: gl.constexpr = 1):
    """h = silu(x W1^T) * (x W3^T) (and a, b with SAVE_AB) for x (M, K), W1 and W3 (N, K)."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w1_desc.block_type.shape[0]
    dtype: gl.constexpr = x_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    x_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    w1_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], w1_desc.layout)
    w3_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], w3_desc.layout)
    out_s = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], h_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    start = gl.program_id(0)
    step = gl.num_programs(0)
    n_m = gl.cdiv(M, BLOCK_M)
    n_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    total = gl.cdiv(n_m * n_n - start, step) * k_tiles
    for i in gl.static_range(STAGES - 1):
        _load_dual(i, total, k_tiles, start, step, n_m, n_n, x_desc, w1_desc, w3_desc, x_s, w1_s, w3_s, bars,
                   GROUP_M, STAGES)
    acc_a = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    acc_b = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    for it in range(total):
        stage = it % STAGES
        kk = it % k_tiles
        mbarrier.wait(bars.index(stage), (it // STAGES) & 1)
        tok_a = warpgroup_mma(x_s.index(stage), w1_s.index(stage).permute((1, 0)), acc_a, use_acc=kk > 0,
                              is_async=True)
        tok_b = warpgroup_mma(x_s.index(stage), w3_s.index(stage).permute((1, 0)), acc_b, use_acc=kk > 0,
                              is_async=True)
        # the previous iteration's MMAs are done (MMA_LAG 0: these too): its stage takes the load STAGES - 1
        # iterations ahead
        acc_a, acc_b = warpgroup_mma_wait(2 * MMA_LAG, deps=(tok_a, tok_b))
        _load_dual(it + STAGES - 1, total, k_tiles, start, step, n_m, n_n, x_desc, w1_desc, w3_desc, x_s, w1_s,
                   w3_s, bars, GROUP_M, STAGES)
        if kk == k_tiles - 1:
            acc_a, acc_b = warpgroup_mma_wait(0, deps=(acc_a, acc_b))
            pid_m, pid_n = _tile_coords(start + (it // k_tiles) * step, n_m, n_n, GROUP_M)
            a = acc_a.to(dtype)
            b = acc_b.to(dtype)
            af = a.to(gl.float32)
            h = (af * _sigmoid(af) * b.to(gl.float32)).to(dtype)
            _store_tile(h_desc, out_s, h, pid_m * BLOCK_M, pid_n * BLOCK_N)
            if SAVE_AB:
                _store_tile(a_desc, out_s, a, pid_m * BLOCK_M, pid_n * BLOCK_N)
                _store_tile(b_desc, out_s, b, pid_m * BLOCK_M, pid_n * BLOCK_N)
    tma.store_wait(pendings=0)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))


@gluon.jit
def _load_bwd(it, total, k_tiles, start, step, n_m, n_n, dy_desc, w2_desc, dy_s, w2_s, bars, GROUP_M: gl.constexpr,
              STAGES: gl.constexpr):
    BLOCK_M: gl.constexpr = dy_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = dy_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w2_desc.block_type.shape[1]
    stage = it % STAGES
    pred = it < total
    pid_m, pid_n = _tile_coords(start + (it // k_tiles) * step, n_m, n_n, GROUP_M)
    k = (it % k_tiles) * BLOCK_K
    bar = bars.index(stage)
    mbarrier.expect(bar, dy_desc.block_type.nbytes + w2_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(dy_desc, [pid_m * BLOCK_M, k], bar, dy_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(w2_desc, [k, pid_n * BLOCK_N], bar, w2_s.index(stage), pred=pred)


@gluon.jit
def _swiglu_bwd_kernel(dy_desc, w2_desc, a_desc, b_desc, da_desc, db_desc, M, N, K, GROUP_M: gl.constexpr,
                       STAGES: gl.constexpr):
    """da, db of h = silu(a) * b for dh = dy W2; dy (M, K), W2 (K, N) (the Linear's (d_model, d_ff) weight), a and b
    (M, N). Each tile's a and b arrive by TMA halfway through its K slices, into the buffers da and db leave from."""
    BLOCK_M: gl.constexpr = dy_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = dy_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w2_desc.block_type.shape[1]
    dtype: gl.constexpr = dy_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    dy_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], dy_desc.layout)
    w2_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, BLOCK_N], w2_desc.layout)
    a_s = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], a_desc.layout)
    b_s = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ab_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(ab_bar, count=1)

    start = gl.program_id(0)
    step = gl.num_programs(0)
    n_m = gl.cdiv(M, BLOCK_M)
    n_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    total = gl.cdiv(n_m * n_n - start, step) * k_tiles
    for i in gl.static_range(STAGES - 1):
        _load_bwd(i, total, k_tiles, start, step, n_m, n_n, dy_desc, w2_desc, dy_s, w2_s, bars, GROUP_M, STAGES)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    for it in range(total):
        stage = it % STAGES
        kk = it % k_tiles
        tile_index = it // k_tiles
        pid_m, pid_n = _tile_coords(start + tile_index * step, n_m, n_n, GROUP_M)
        if kk == k_tiles // 2:  # this tile's a and b, once the previous tile's da and db have left their buffers
            tma.store_wait(pendings=0)
            mbarrier.expect(ab_bar, 2 * a_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], ab_bar, a_s)
            tma.async_copy_global_to_shared(b_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], ab_bar, b_s)
        mbarrier.wait(bars.index(stage), (it // STAGES) & 1)
        tok = warpgroup_mma(dy_s.index(stage), w2_s.index(stage), acc, use_acc=kk > 0, is_async=True)
        acc = warpgroup_mma_wait(1, deps=(tok,))
        _load_bwd(it + STAGES - 1, total, k_tiles, start, step, n_m, n_n, dy_desc, w2_desc, dy_s, w2_s, bars,
                  GROUP_M, STAGES)
        if kk == k_tiles - 1:
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.wait(ab_bar, tile_index & 1)
            a = a_s.load(acc_layout).to(gl.float32)
            b = b_s.load(acc_layout).to(gl.float32)
            gl.thread_barrier()  # every warp has read a and b before da and db overwrite them
            dh = acc.to(dtype).to(gl.float32)
            sig = _sigmoid(a)
            a_s.store((dh * b * sig * (1.0 + a * (1.0 - sig))).to(dtype))
            b_s.store((dh * a * sig).to(dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(da_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], a_s)
            tma.async_copy_shared_to_global(db_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], b_s)
    tma.store_wait(pendings=0)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    mbarrier.invalidate(ab_bar)


# Warp-specialised forms (what cuBLAS's Hopper kernels do: ``nvjet_sm90_*_coopB``, one producer and two consumer
# warpgroups): a producer warp fills the ring, two consumer warpgroups (64 rows of the 128-row tile each) run the
# MMAs and the epilogue with 240 registers a thread, so the two fp32 accumulators and the epilogue's temporaries fit
# without spilling (the software-pipelined kernels above use 255 and spill in the forward).
@gluon.jit
def _store_direct(ptr, value, om, on, M, N, stride):
    """``value`` (in its MMA layout) to rows om.., columns on.. of the row-major (M, N) tensor at ``ptr`` straight
    from registers: no shared memory and no wait for a TMA store to drain."""
    layout: gl.constexpr = value.type.layout
    rows = om + gl.arange(0, value.shape[0], layout=gl.SliceLayout(1, layout))
    cols = on + gl.arange(0, value.shape[1], layout=gl.SliceLayout(0, layout))
    offs = gl.expand_dims(rows.to(gl.int64) * stride, 1) + gl.expand_dims(cols, 0)
    mask = gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N, 0)
    gl.store(ptr + offs, value, mask=mask)


@gluon.jit
def _ws_tiles(M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """This program's first tile, its stride, the tile grid and the K slices: the persistent programs' schedule."""
    start = gl.program_id(0)
    step = gl.num_programs(0)
    n_m = gl.cdiv(M, BLOCK_M)
    n_n = gl.cdiv(N, BLOCK_N)
    return start, step, n_m, n_n, gl.cdiv(n_m * n_n - start, step), gl.cdiv(K, BLOCK_K)


@gluon.jit
def _ws_dual_producer(x_desc, w1_desc, w3_desc, x_s, w1_s, w3_s, full, empty, M, N, K, GROUP_M: gl.constexpr,
                      STAGES: gl.constexpr):
    ROWS: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w1_desc.block_type.shape[0]
    start, step, n_m, n_n, n_mine, k_tiles = _ws_tiles(M, N, K, 2 * ROWS, BLOCK_N, BLOCK_K)
    it = 0
    for t in range(n_mine):
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        for kk in range(k_tiles):
            stage = it % STAGES
            mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
            bar = full.index(stage)
            mbarrier.expect(bar, 2 * x_desc.block_type.nbytes + 2 * w1_desc.block_type.nbytes)
            k = kk * BLOCK_K
            tma.async_copy_global_to_shared(x_desc, [pid_m * 2 * ROWS, k], bar, x_s.index(2 * stage))
            tma.async_copy_global_to_shared(x_desc, [pid_m * 2 * ROWS + ROWS, k], bar, x_s.index(2 * stage + 1))
            tma.async_copy_global_to_shared(w1_desc, [pid_n * BLOCK_N, k], bar, w1_s.index(stage))
            tma.async_copy_global_to_shared(w3_desc, [pid_n * BLOCK_N, k], bar, w3_s.index(stage))
            it += 1


@gluon.jit
def _ws_dual_consumer(h_desc, a_desc, b_desc, A, B, x_s, w1_s, w3_s, out_s, full, empty, M, N, K, WG: gl.constexpr,
                      GROUP_M: gl.constexpr, STAGES: gl.constexpr, SAVE_AB: gl.constexpr, DIRECT: gl.constexpr):
    """Rows WG * 64 .. WG * 64 + 63 of every tile: both products, then h (and a, b) through this warpgroup's
    output buffer."""
    ROWS: gl.constexpr = h_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = h_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = x_s.type.shape[2]
    dtype: gl.constexpr = h_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    start, step, n_m, n_n, n_mine, k_tiles = _ws_tiles(M, N, K, 2 * ROWS, BLOCK_N, BLOCK_K)
    acc_a = gl.zeros([ROWS, BLOCK_N], gl.float32, acc_layout)
    acc_b = gl.zeros([ROWS, BLOCK_N], gl.float32, acc_layout)
    out = out_s.index(WG)
    it = 0
    for t in range(n_mine):
        for kk in range(k_tiles):
            stage = it % STAGES
            mbarrier.wait(full.index(stage), (it // STAGES) & 1)
            xs = x_s.index(2 * stage + WG)
            tok_a = warpgroup_mma(xs, w1_s.index(stage).permute((1, 0)), acc_a, use_acc=kk > 0, is_async=True)
            tok_b = warpgroup_mma(xs, w3_s.index(stage).permute((1, 0)), acc_b, use_acc=kk > 0, is_async=True)
            acc_a, acc_b = warpgroup_mma_wait(2, deps=(tok_a, tok_b))
            if kk > 0:  # the previous slice's MMAs are done: its stage goes back to the producer
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
            it += 1
        acc_a, acc_b = warpgroup_mma_wait(0, deps=(acc_a, acc_b))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        om = pid_m * 2 * ROWS + WG * ROWS
        a = acc_a.to(dtype)
        b = acc_b.to(dtype)
        af = a.to(gl.float32)
        _store_tile(h_desc, out, (af * _sigmoid(af) * b.to(gl.float32)).to(dtype), om, pid_n * BLOCK_N)
        if SAVE_AB:
            if DIRECT:  # from registers: the epilogue waits for no store but the previous tile's h
                _store_direct(A, a, om, pid_n * BLOCK_N, M, N, N)
                _store_direct(B, b, om, pid_n * BLOCK_N, M, N, N)
            else:
                _store_tile(a_desc, out, a, om, pid_n * BLOCK_N)
                _store_tile(b_desc, out, b, om, pid_n * BLOCK_N)
    tma.store_wait(pendings=0)


@gluon.jit
def _dual_swiglu_ws_kernel(x_desc, w1_desc, w3_desc, h_desc, a_desc, b_desc, A, B, M, N, K, GROUP_M: gl.constexpr,
                           STAGES: gl.constexpr, SAVE_AB: gl.constexpr, DIRECT: gl.constexpr,
                           REGS: gl.constexpr = 240):
    """``_dual_swiglu_kernel``'s work, warp-specialised; x_desc's block is half a tile's rows (launch 4 warps)."""
    ROWS: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w1_desc.block_type.shape[0]
    dtype: gl.constexpr = x_desc.dtype
    x_s = gl.allocate_shared_memory(dtype, [2 * STAGES, ROWS, BLOCK_K], x_desc.layout)
    w1_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], w1_desc.layout)
    w3_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], w3_desc.layout)
    out_s = gl.allocate_shared_memory(dtype, [2, ROWS, BLOCK_N], h_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    gl.warp_specialize([
        (_ws_dual_consumer, (h_desc, a_desc, b_desc, A, B, x_s, w1_s, w3_s, out_s, full, empty, M, N, K, 0, GROUP_M,
                             STAGES, SAVE_AB, DIRECT)),
        (_ws_dual_consumer, (h_desc, a_desc, b_desc, A, B, x_s, w1_s, w3_s, out_s, full, empty, M, N, K, 1, GROUP_M,
                             STAGES, SAVE_AB, DIRECT)),
        (_ws_dual_producer, (x_desc, w1_desc, w3_desc, x_s, w1_s, w3_s, full, empty, M, N, K, GROUP_M, STAGES)),
    ], [4, 1], [REGS, 264 - REGS])


@gluon.jit
def _ws_bwd_producer(dy_desc, w2_desc, a_desc, b_desc, dy_s, w2_s, ab_s, full, empty, ab_full, ab_empty, M, N, K,
                     GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    ROWS: gl.constexpr = dy_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = dy_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w2_desc.block_type.shape[1]
    start, step, n_m, n_n, n_mine, k_tiles = _ws_tiles(M, N, K, 2 * ROWS, BLOCK_N, BLOCK_K)
    it = 0
    for t in range(n_mine):
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        for kk in range(k_tiles):
            stage = it % STAGES
            mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
            bar = full.index(stage)
            mbarrier.expect(bar, 2 * dy_desc.block_type.nbytes + w2_desc.block_type.nbytes)
            k = kk * BLOCK_K
            tma.async_copy_global_to_shared(dy_desc, [pid_m * 2 * ROWS, k], bar, dy_s.index(2 * stage))
            tma.async_copy_global_to_shared(dy_desc, [pid_m * 2 * ROWS + ROWS, k], bar, dy_s.index(2 * stage + 1))
            tma.async_copy_global_to_shared(w2_desc, [k, pid_n * BLOCK_N], bar, w2_s.index(stage))
            it += 1
        # the tile's a and b, once the previous tile's da and db have left the buffers they share
        mbarrier.wait(ab_empty, (t & 1) ^ 1, pred=t > 0)
        mbarrier.expect(ab_full, 4 * a_desc.block_type.nbytes)
        for wg in gl.static_range(2):
            om = pid_m * 2 * ROWS + wg * ROWS
            tma.async_copy_global_to_shared(a_desc, [om, pid_n * BLOCK_N], ab_full, ab_s.index(wg))
            tma.async_copy_global_to_shared(b_desc, [om, pid_n * BLOCK_N], ab_full, ab_s.index(2 + wg))


@gluon.jit
def _ws_bwd_consumer(da_desc, db_desc, DA, DB, dy_s, w2_s, ab_s, full, empty, ab_full, ab_empty, M, N, K,
                     WG: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, DIRECT: gl.constexpr):
    """Rows WG * 64 .. WG * 64 + 63 of every tile: dh, then da and db written over the a and b they came from (each
    thread writes exactly the elements it read)."""
    ROWS: gl.constexpr = da_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = da_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = dy_s.type.shape[2]
    dtype: gl.constexpr = da_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    start, step, n_m, n_n, n_mine, k_tiles = _ws_tiles(M, N, K, 2 * ROWS, BLOCK_N, BLOCK_K)
    acc = gl.zeros([ROWS, BLOCK_N], gl.float32, acc_layout)
    a_s = ab_s.index(WG)
    b_s = ab_s.index(2 + WG)
    it = 0
    for t in range(n_mine):
        for kk in range(k_tiles):
            stage = it % STAGES
            mbarrier.wait(full.index(stage), (it // STAGES) & 1)
            tok = warpgroup_mma(dy_s.index(2 * stage + WG), w2_s.index(stage), acc, use_acc=kk > 0, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(tok,))
            if kk > 0:
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
            elif not DIRECT and t > 0:  # the previous tile's da and db have had this tile's first MMAs to drain
                tma.store_wait(pendings=0)
                mbarrier.arrive(ab_empty)
            it += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        om = pid_m * 2 * ROWS + WG * ROWS
        mbarrier.wait(ab_full, t & 1)
        a = a_s.load(acc_layout).to(gl.float32)
        b = b_s.load(acc_layout).to(gl.float32)
        if DIRECT:  # a and b are in registers (every warp of this warpgroup's): their buffers go back now
            gl.thread_barrier()
            mbarrier.arrive(ab_empty)
        dh = acc.to(dtype).to(gl.float32)
        sig = _sigmoid(a)
        da = (dh * b * sig * (1.0 + a * (1.0 - sig))).to(dtype)
        db = (dh * a * sig).to(dtype)
        if DIRECT:
            _store_direct(DA, da, om, pid_n * BLOCK_N, M, N, N)
            _store_direct(DB, db, om, pid_n * BLOCK_N, M, N, N)
        else:
            a_s.store(da)
            b_s.store(db)
            fence_async_shared()
            tma.async_copy_shared_to_global(da_desc, [om, pid_n * BLOCK_N], a_s)
            tma.async_copy_shared_to_global(db_desc, [om, pid_n * BLOCK_N], b_s)
    tma.store_wait(pendings=0)


@gluon.jit
def _swiglu_bwd_ws_kernel(dy_desc, w2_desc, a_desc, b_desc, da_desc, db_desc, DA, DB, M, N, K, GROUP_M: gl.constexpr,
                          STAGES: gl.constexpr, DIRECT: gl.constexpr, REGS: gl.constexpr = 240):
    """``_swiglu_bwd_kernel``'s work, warp-specialised; dy_desc's and the (M, N) descriptors' blocks are half a
    tile's rows (launch 4 warps)."""
    ROWS: gl.constexpr = dy_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = dy_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w2_desc.block_type.shape[1]
    dtype: gl.constexpr = dy_desc.dtype
    dy_s = gl.allocate_shared_memory(dtype, [2 * STAGES, ROWS, BLOCK_K], dy_desc.layout)
    w2_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, BLOCK_N], w2_desc.layout)
    ab_s = gl.allocate_shared_memory(dtype, [4, ROWS, BLOCK_N], a_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ab_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ab_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    mbarrier.init(ab_full, count=1)
    mbarrier.init(ab_empty, count=2)
    gl.warp_specialize([
        (_ws_bwd_consumer, (da_desc, db_desc, DA, DB, dy_s, w2_s, ab_s, full, empty, ab_full, ab_empty, M, N, K, 0,
                            GROUP_M, STAGES, DIRECT)),
        (_ws_bwd_consumer, (da_desc, db_desc, DA, DB, dy_s, w2_s, ab_s, full, empty, ab_full, ab_empty, M, N, K, 1,
                            GROUP_M, STAGES, DIRECT)),
        (_ws_bwd_producer, (dy_desc, w2_desc, a_desc, b_desc, dy_s, w2_s, ab_s, full, empty, ab_full, ab_empty, M, N,
                            K, GROUP_M, STAGES)),
    ], [4, 1], [REGS, 264 - REGS])


def supported(*tensors: torch.Tensor) -> bool:
    """Whether the Gluon kernels take these operands: CUDA sm_90, one 16-bit dtype, 2-D, unit stride along rows,
    16-byte aligned rows and bases."""
    t0 = tensors[0]
    if not (t0.is_cuda and torch.cuda.get_device_capability(t0.device) == (9, 0)):
        return False
    return all(t.dtype == t0.dtype and t.dtype in (torch.bfloat16, torch.float16) and t.dim() == 2
               and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
               for t in tensors)


def _desc(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16)
    return TensorDescriptor.from_tensor(t, block, layout)


def _programs(device: torch.device, m: int, n: int, block_m: int, block_n: int) -> int:
    tiles = -(-m // block_m) * -(-n // block_n)
    return min(tiles, torch.cuda.get_device_properties(device).multi_processor_count)


def dual_swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, save_ab: bool = True,
                config: tuple = FWD_CONFIG, mma_lag: int = 1, ws: bool = False, direct: bool = False,
                regs: int = 240) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """h = silu(x W1^T) * (x W3^T) for x (M, K), W1 and W3 (N, K); also a = x W1^T and b = x W3^T with
    ``save_ab`` (else None). ``ws``: the warp-specialised kernel (BLOCK_M 128, 4 warps)."""
    block_m, block_n, block_k, stages, warps, group_m = config
    (m, k), n = x.shape, w1.shape[0]
    h = x.new_empty(m, n)
    a, b = (x.new_empty(m, n), x.new_empty(m, n)) if save_ab else (h, h)
    mn = [block_m, block_n]
    programs = _programs(x.device, m, n, block_m, block_n)
    if ws:
        rows = [block_m // 2, block_n]
        _dual_swiglu_ws_kernel[(programs,)](
            _desc(x, [block_m // 2, block_k]), _desc(w1, [block_n, block_k]), _desc(w3, [block_n, block_k]),
            _desc(h, rows), _desc(a, rows), _desc(b, rows), a, b, m, n, k, GROUP_M=group_m, STAGES=stages,
            SAVE_AB=save_ab, DIRECT=direct, REGS=regs, num_warps=4)
        return (h, a, b) if save_ab else (h, None, None)
    _dual_swiglu_kernel[(programs,)](
        _desc(x, [block_m, block_k]), _desc(w1, [block_n, block_k]), _desc(w3, [block_n, block_k]),
        _desc(h, mn), _desc(a, mn), _desc(b, mn), m, n, k, GROUP_M=group_m, STAGES=stages, SAVE_AB=save_ab,
        MMA_LAG=mma_lag, num_warps=warps)
    return (h, a, b) if save_ab else (h, None, None)


def swiglu_backward(dy: torch.Tensor, w2: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    config: tuple = BWD_CONFIG, ws: bool = False, direct: bool = False, regs: int = 240
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """da, db of h = silu(a) * b given dy (M, d_model) and the down projection's weight w2 (d_model, d_ff).
    ``ws``: the warp-specialised kernel (BLOCK_M 128, 4 warps)."""
    block_m, block_n, block_k, stages, warps, group_m = config
    (m, k), n = dy.shape, w2.shape[1]
    da, db = torch.empty_like(a), torch.empty_like(b)
    mn = [block_m, block_n]
    programs = _programs(dy.device, m, n, block_m, block_n)
    if ws:
        rows = [block_m // 2, block_n]
        _swiglu_bwd_ws_kernel[(programs,)](
            _desc(dy, [block_m // 2, block_k]), _desc(w2, [block_k, block_n]), _desc(a, rows), _desc(b, rows),
            _desc(da, rows), _desc(db, rows), da, db, m, n, k, GROUP_M=group_m, STAGES=stages, DIRECT=direct,
            REGS=regs, num_warps=4)
        return da, db
    _swiglu_bwd_kernel[(programs,)](
        _desc(dy, [block_m, block_k]), _desc(w2, [block_k, block_n]), _desc(a, mn), _desc(b, mn), _desc(da, mn),
        _desc(db, mn), m, n, k, GROUP_M=group_m, STAGES=stages, num_warps=warps)
    return da, db
