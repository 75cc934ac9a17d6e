"""SwiGLU inside its matmuls on Hopper (Gluon): the feed-forward's elementwise passes as GEMM epilogues.

The compiled feed-forward ``w2(silu(w1 x) * w3 x)`` writes a = x W1^T and b = x W3^T, reads both to write h, and in
the backward writes dh = dy W2, then reads dh, a and b to write da and db: at xl/2048 on an H100 those elementwise
passes take about 0.09 ms (forward) and 0.16 ms (backward) a block beside the 0.49 and 0.24 ms of the GEMMs they
follow (docs/training_step.md, session 29). Here:

- ``dual_swiglu(x, w1, w3)``: a tile of a and the same tile of b from one load of x's tile (CUTLASS calls this a
  dual GEMM); h = silu(a) * b, a and b leave from the accumulators' registers;
- ``swiglu_backward(dy, w2, a, b)``: dh = dy W2, whose epilogue reads the tile's a and b (loaded by TMA while its
  products run) and writes da = dh * b * silu'(a) and db = dh * silu(a); dh itself never reaches memory.

Both are persistent and warp-specialised, as cuBLAS's Hopper GEMMs are (``nvjet_sm90_*_coopB``): one producer warp
fills a ring of ``STAGES`` TMA buffers for two consumer warpgroups with 240 registers a thread, which the two fp32
accumulators need, issuing the warpgroup MMAs one K slice in flight. The forward's consumers split each 128-row tile
(64 rows each: cooperative); the backward's own whole tiles in turn (ping-pong), so one's epilogue runs under the
other's products (session 30, timed alternately: 0.353 against 0.360 ms at xl/2048, 0.106 against 0.104 at
xl/512; a ping-pong forward, 64-row tiles a consumer, lost: 0.665 against 0.562). Programs take tiles in groups of
``GROUP_M`` row tiles (the Triton matmul tutorial's order). Rounding follows the unfused path: a, b and dh are
rounded to the input dtype before the elementwise arithmetic, which runs in fp32; the backward's epilogue works a
quarter tile at a time, which keeps its temporaries in registers (session 34). Variants measured and dropped
(software-pipelined, Triton, epilogue stores from registers, other tiles, the ping-pong forward, two K slices in
flight, a and b of both halves loaded ahead): ``experiments/swiglu_gemm_epilogues/``.

Scope: sm_90, bf16 or fp16, 2-D row-major operands with 16-byte aligned rows and bases (``supported``).
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

# (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M), measured at the xl shapes on an H100
# (scripts/device/swiglu_dual_gemm_probe.py; docs/training_step.md, session 29). Shared memory sets the stages: the
# forward's ring takes 48 KiB a stage beside 32 KiB of output buffers, the backward's 32 KiB a stage beside 64 KiB
# for half tiles of a and b (227 KiB in all).
FWD_CONFIG = (128, 128, 64, 4, 8)
BWD_CONFIG = (128, 128, 64, 5, 8)
CONSUMER_REGS = 240  # of the 264 a thread that the consumers and the producer share (168 at launch, 384 threads)


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
def _store_tile(desc, out_s, value, om, on):
    """``value`` to ``desc`` at (om, on) through ``out_s`` once the previous store has left it."""
    tma.store_wait(pendings=0)
    out_s.store(value)
    fence_async_shared()
    tma.async_copy_shared_to_global(desc, [om, on], out_s)


@gluon.jit
def _claim_stage(full, empty, it, nbytes, STAGES: gl.constexpr):
    """The producer's ring stage for its ``it``-th K slice, once the consumers released it (both arrive), with its
    full barrier armed for ``nbytes`` of TMA loads: (stage, barrier)."""
    stage = it % STAGES
    mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
    bar = full.index(stage)
    mbarrier.expect(bar, nbytes)
    return stage, bar


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
            stage, bar = _claim_stage(full, empty, it, 2 * x_desc.block_type.nbytes + 2 * w1_desc.block_type.nbytes,
                                      STAGES)
            k = kk * BLOCK_K
            tma.async_copy_global_to_shared(x_desc, [pid_m * 2 * ROWS, k], bar, x_s.index(2 * stage))
            tma.async_copy_global_to_shared(x_desc, [pid_m * 2 * ROWS + ROWS, k], bar, x_s.index(2 * stage + 1))
            tma.async_copy_global_to_shared(w1_desc, [pid_n * BLOCK_N, k], bar, w1_s.index(stage))
            tma.async_copy_global_to_shared(w3_desc, [pid_n * BLOCK_N, k], bar, w3_s.index(stage))
            it += 1


@gluon.jit
def _dual_mainloop(x_s, w1_s, w3_s, full, empty, acc_a, acc_b, it, k_tiles, WG: gl.constexpr,
                   STAGES: gl.constexpr):
    """One tile's two products for consumer WG (its 64 rows of x's tiles against both weights' tiles), from the
    ring's ``it``-th K slice on; each stage goes back to the producer once its MMAs are done. Returns (acc_a,
    acc_b, it) with ``it`` past the tile's slices."""
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
    return acc_a, acc_b, it


@gluon.jit
def _ws_dual_consumer(h_desc, a_desc, b_desc, x_s, w1_s, w3_s, out_s, full, empty, M, N, K, WG: gl.constexpr,
                      GROUP_M: gl.constexpr, STAGES: gl.constexpr, SAVE_AB: gl.constexpr):
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
        acc_a, acc_b, it = _dual_mainloop(x_s, w1_s, w3_s, full, empty, acc_a, acc_b, it, k_tiles, WG, STAGES)
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        om = pid_m * 2 * ROWS + WG * ROWS
        a = acc_a.to(dtype)
        b = acc_b.to(dtype)
        af = a.to(gl.float32)
        _store_tile(h_desc, out, (af * _sigmoid(af) * b.to(gl.float32)).to(dtype), om, pid_n * BLOCK_N)
        if SAVE_AB:
            _store_tile(a_desc, out, a, om, pid_n * BLOCK_N)
            _store_tile(b_desc, out, b, om, pid_n * BLOCK_N)
    tma.store_wait(pendings=0)


@gluon.jit
def _dual_swiglu_kernel(x_desc, w1_desc, w3_desc, h_desc, a_desc, b_desc, M, N, K, GROUP_M: gl.constexpr,
                        STAGES: gl.constexpr, SAVE_AB: gl.constexpr, REGS: gl.constexpr):
    """h = silu(x W1^T) * (x W3^T) (and a, b with SAVE_AB) for x (M, K), W1 and W3 (N, K); x's and the outputs'
    descriptors have blocks of half a tile's rows (launch with 4 warps: the first consumer)."""
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
        (_ws_dual_consumer, (h_desc, a_desc, b_desc, x_s, w1_s, w3_s, out_s, full, empty, M, N, K, 0, GROUP_M, STAGES,
                             SAVE_AB)),
        (_ws_dual_consumer, (h_desc, a_desc, b_desc, x_s, w1_s, w3_s, out_s, full, empty, M, N, K, 1, GROUP_M, STAGES,
                             SAVE_AB)),
        (_ws_dual_producer, (x_desc, w1_desc, w3_desc, x_s, w1_s, w3_s, full, empty, M, N, K, GROUP_M, STAGES)),
    ], [4, 1], [REGS, 264 - REGS])


@gluon.jit
def _bwd_producer(dy_desc, w2_desc, dy_s, w2_s, full, empty, M, N, K, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """The ring's loads, tile after tile: each tile's K slices go to the consumer that owns the tile."""
    ROWS: gl.constexpr = dy_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = dy_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w2_desc.block_type.shape[1]
    start, step, n_m, n_n, n_mine, k_tiles = _ws_tiles(M, N, K, 2 * ROWS, BLOCK_N, BLOCK_K)
    it = 0
    for t in range(n_mine):
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        for kk in range(k_tiles):
            stage, bar = _claim_stage(full, empty, it, 2 * dy_desc.block_type.nbytes + w2_desc.block_type.nbytes,
                                      STAGES)
            k = kk * BLOCK_K
            tma.async_copy_global_to_shared(dy_desc, [pid_m * 2 * ROWS, k], bar, dy_s.index(2 * stage))
            tma.async_copy_global_to_shared(dy_desc, [pid_m * 2 * ROWS + ROWS, k], bar, dy_s.index(2 * stage + 1))
            tma.async_copy_global_to_shared(w2_desc, [k, pid_n * BLOCK_N], bar, w2_s.index(stage))
            it += 1


@gluon.jit
def _load_ab(a_desc, b_desc, a_s, b_s, bar, om, on):
    """A half tile's a and b into this consumer's buffers, once its last da and db have left them."""
    tma.store_wait(pendings=0)
    mbarrier.expect(bar, 2 * a_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [om, on], bar, a_s)
    tma.async_copy_global_to_shared(b_desc, [om, on], bar, b_s)


@gluon.jit
def _column_halves(x):
    """x (R, N) split into its left and right N / 2 columns in registers: in the MMA layout each thread holds both
    halves' values, so the split moves no data."""
    R: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    return gl.split(x.reshape([R, 2, N // 2]).permute(0, 2, 1))


@gluon.jit
def _gate_grad_cols(g, a_s, b_s):
    """da and db for the columns of ``a_s`` and ``b_s`` that ``g`` (dh, rounded) covers, written over them (each
    thread writes exactly the elements it read)."""
    a = a_s.load(g.type.layout).to(gl.float32)
    b = b_s.load(g.type.layout).to(gl.float32)
    gf = g.to(gl.float32)
    sig = _sigmoid(a)
    a_s.store((gf * b * sig * (1.0 + a * (1.0 - sig))).to(g.dtype))
    b_s.store((gf * a * sig).to(g.dtype))


@gluon.jit
def _gate_grad_epilogue(dh, a_s, b_s, bar, phase: gl.constexpr, da_desc, db_desc, om, on):
    """da and db of a half tile from its dh (rounded to the input dtype) and the a, b in ``a_s``, ``b_s``, written
    over them and stored by TMA. A quarter tile at a time: the whole half's fp32 temporaries beside the other half's
    dh spilled (344 bytes a thread), and the kernel ran 7% slower (session 34)."""
    HALF: gl.constexpr = dh.shape[1] // 2
    mbarrier.wait(bar, phase)
    g0, g1 = _column_halves(dh)
    _gate_grad_cols(g0, a_s.slice(0, HALF, dim=1), b_s.slice(0, HALF, dim=1))
    _gate_grad_cols(g1, a_s.slice(HALF, HALF, dim=1), b_s.slice(HALF, HALF, dim=1))
    fence_async_shared()
    tma.async_copy_shared_to_global(da_desc, [om, on], a_s)
    tma.async_copy_shared_to_global(db_desc, [om, on], b_s)


@gluon.jit
def _bwd_consumer(a_desc, b_desc, da_desc, db_desc, dy_s, w2_s, ab_s, full, empty, ab_bar, turn, M, N, K,
                  WG: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """Every other tile of this program (ping-pong): both 64-row halves of dh, then their da and db while the other
    consumer runs its tile's products. The consumers take turns at the products (``turn``), as CUTLASS's ping-pong
    kernels do: that keeps each one's ring waits within a lap of the producer, which a parity wait needs."""
    ROWS: gl.constexpr = da_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = da_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = dy_s.type.shape[2]
    dtype: gl.constexpr = da_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    start, step, n_m, n_n, n_mine, k_tiles = _ws_tiles(M, N, K, 2 * ROWS, BLOCK_N, BLOCK_K)
    a_s = ab_s.index(2 * WG)
    b_s = ab_s.index(2 * WG + 1)
    bar = ab_bar.index(WG)
    for t in range(WG, n_mine, 2):
        pid_m, pid_n = _tile_coords(start + t * step, n_m, n_n, GROUP_M)
        om = pid_m * 2 * ROWS
        on = pid_n * BLOCK_N
        acc0 = gl.zeros([ROWS, BLOCK_N], gl.float32, acc_layout)  # fresh each tile: nothing live across epilogues
        acc1 = gl.zeros([ROWS, BLOCK_N], gl.float32, acc_layout)
        it = t * k_tiles
        j = t // 2
        if WG == 0:
            mbarrier.wait(turn.index(0), (j + 1) & 1, pred=j > 0)
        else:
            mbarrier.wait(turn.index(1), j & 1)
        for kk in range(k_tiles):
            stage = it % STAGES
            mbarrier.wait(full.index(stage), (it // STAGES) & 1)
            w = w2_s.index(stage)
            tok0 = warpgroup_mma(dy_s.index(2 * stage), w, acc0, is_async=True)
            tok1 = warpgroup_mma(dy_s.index(2 * stage + 1), w, acc1, is_async=True)
            acc0, acc1 = warpgroup_mma_wait(2, deps=(tok0, tok1))
            if kk > 0:
                mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
            else:
                _load_ab(a_desc, b_desc, a_s, b_s, bar, om, on)
            it += 1
        mbarrier.arrive(turn.index(1 - WG))  # the other consumer's products may start behind these
        acc0, acc1 = warpgroup_mma_wait(0, deps=(acc0, acc1))
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        dh0 = acc0.to(dtype)
        dh1 = acc1.to(dtype)
        _gate_grad_epilogue(dh0, a_s, b_s, bar, 0, da_desc, db_desc, om, on)
        _load_ab(a_desc, b_desc, a_s, b_s, bar, om + ROWS, on)
        _gate_grad_epilogue(dh1, a_s, b_s, bar, 1, da_desc, db_desc, om + ROWS, on)
    tma.store_wait(pendings=0)


@gluon.jit
def _swiglu_bwd_kernel(dy_desc, w2_desc, a_desc, b_desc, da_desc, db_desc, M, N, K, GROUP_M: gl.constexpr,
                       STAGES: gl.constexpr, REGS: gl.constexpr):
    """da, db of h = silu(a) * b for dh = dy W2; dy (M, K), W2 (K, N) (the Linear's (d_model, d_ff) weight), a and b
    (M, N); dy's and the (M, N) descriptors have blocks of half a tile's rows (launch with 4 warps). Ping-pong
    schedule (CUTLASS's name): each consumer warpgroup owns whole 128-row tiles, alternating with the other, so one's
    epilogue (a and b in by TMA, da and db out over them) runs under the other's products."""
    ROWS: gl.constexpr = dy_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = dy_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w2_desc.block_type.shape[1]
    dtype: gl.constexpr = dy_desc.dtype
    dy_s = gl.allocate_shared_memory(dtype, [2 * STAGES, ROWS, BLOCK_K], dy_desc.layout)
    w2_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_K, BLOCK_N], w2_desc.layout)
    ab_s = gl.allocate_shared_memory(dtype, [4, ROWS, BLOCK_N], a_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ab_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(ab_bar.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    gl.warp_specialize([
        (_bwd_consumer, (a_desc, b_desc, da_desc, db_desc, dy_s, w2_s, ab_s, full, empty, ab_bar, turn, M, N, K, 0,
                         GROUP_M, STAGES)),
        (_bwd_consumer, (a_desc, b_desc, da_desc, db_desc, dy_s, w2_s, ab_s, full, empty, ab_bar, turn, M, N, K, 1,
                         GROUP_M, STAGES)),
        (_bwd_producer, (dy_desc, w2_desc, dy_s, w2_s, full, empty, M, N, K, GROUP_M, STAGES)),
    ], [4, 1], [REGS, 264 - REGS])


def supported(*tensors: torch.Tensor) -> bool:
    """Whether the kernels take these operands: CUDA sm_90, one 16-bit dtype, 2-D, unit stride along rows, 16-byte
    aligned rows and bases (what TMA descriptors need)."""
    t0 = tensors[0]
    if not (t0.is_cuda and torch.cuda.get_device_capability(t0.device) == (9, 0)):
        return False
    return all(t.dtype == t0.dtype and t.dtype in (torch.bfloat16, torch.float16) and t.dim() == 2 and t.numel() > 0
               and t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
               for t in tensors)


def _desc(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16)
    return TensorDescriptor.from_tensor(t, block, layout)


def _programs(device: torch.device, m: int, n: int, block_m: int, block_n: int) -> int:
    tiles = -(-m // block_m) * -(-n // block_n)
    return min(tiles, torch.cuda.get_device_properties(device).multi_processor_count)


def dual_swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, save_ab: bool = True,
                config: tuple = FWD_CONFIG, regs: int = CONSUMER_REGS
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """h = silu(x W1^T) * (x W3^T) for x (M, K), W1 and W3 (N, K); also a = x W1^T and b = x W3^T with
    ``save_ab`` (else None). ``config``: (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M), BLOCK_M = 128."""
    block_m, block_n, block_k, stages, group_m = config
    (m, k), n = x.shape, w1.shape[0]
    h = x.new_empty(m, n)
    a, b = (x.new_empty(m, n), x.new_empty(m, n)) if save_ab else (h, h)
    rows = [block_m // 2, block_n]
    _dual_swiglu_kernel[(_programs(x.device, m, n, block_m, block_n),)](
        _desc(x, [block_m // 2, block_k]), _desc(w1, [block_n, block_k]), _desc(w3, [block_n, block_k]),
        _desc(h, rows), _desc(a, rows), _desc(b, rows), m, n, k, GROUP_M=group_m, STAGES=stages, SAVE_AB=save_ab,
        REGS=regs, num_warps=4)
    return (h, a, b) if save_ab else (h, None, None)


def swiglu_backward(dy: torch.Tensor, w2: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    config: tuple = BWD_CONFIG, regs: int = CONSUMER_REGS) -> tuple[torch.Tensor, torch.Tensor]:
    """da, db of h = silu(a) * b given dy (M, d_model) and the down projection's weight w2 (d_model, d_ff).
    ``config`` as ``dual_swiglu``'s."""
    block_m, block_n, block_k, stages, group_m = config
    (m, k), n = dy.shape, w2.shape[1]
    da, db = torch.empty_like(a), torch.empty_like(b)
    rows = [block_m // 2, block_n]
    _swiglu_bwd_kernel[(_programs(dy.device, m, n, block_m, block_n),)](
        _desc(dy, [block_m // 2, block_k]), _desc(w2, [block_k, block_n]), _desc(a, rows), _desc(b, rows),
        _desc(da, rows), _desc(db, rows), m, n, k, GROUP_M=group_m, STAGES=stages, REGS=regs, num_warps=4)
    return da, db
