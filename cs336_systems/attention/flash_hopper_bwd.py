"""FlashAttention backward dK / dV / dQ-atomic kernel for Hopper (sm_90a) in Gluon.

The middle kernel of the three-launch backward (``flash_triton._flash_bwd_dkdv_kernel`` with ATOMIC_DQ):
the same arguments in the same order (the heads slot takes the total of batch x key/value heads), so the
``_Launch`` machinery launches either. A work item is one key tile (``BLOCK_N`` rows) of one batch x key/value
head: its program keeps K and V in shared memory and dK, dV in fp32 registers, and walks the query tiles of the
``GROUP`` query heads that read it (FlashAttention-3's backward, Shah et al. 2024, section 3 and appendix B).
``PERSISTENT``: as many programs as the GPU holds, items taken from a counter (see the kernel); else a program per
item (head dim 128, where persistence spilled and gained nothing).

- Q and dO tiles stream through ``STAGES`` shared-memory buffers filled by TMA (tensor descriptors built on
  the host, ``backward_descs``: 3-D over the heads so the pipeline runs across a group's query heads); an mbarrier
  per buffer.
- S^T = K Q^T and dP^T = V dO^T are issued together as asynchronous wgmma; P^T = exp2(S^T - L) is computed
  while dP^T is still in flight.
- dV += P^T dO and dK += dS^T Q take P^T and dS^T straight from registers (wgmma's register A operand);
  dS^T also goes to shared memory for dQ^T = K^T dS^T (transposed so that wgmma's M is the head dim and query
  tiles of 32 rows work), whose fp32 tile is added to the dQ accumulator: a TMA reduce-add from shared memory
  (``DQ_TMA``) or ``atomic_add`` on pointers in the accumulator layout.
- L and Delta of a query tile are loaded one value per thread an iteration ahead, written to shared memory before
  the iteration's closing barrier and read from there in the S^T column layout (loaded directly, each thread would
  hold a quarter of the columns with a 64-bit address each). Loaded at the point of use and spread with
  ``convert_layout`` (two more barriers and a shared-memory round trip per tile) they cost 5-8% of the
  kernel's time on an H100 (docs/flash_tuning_notes.md, session 17).
- Causal (top-left): only query tiles at or after the key tile's diagonal; the mask is applied (a runtime branch)
  only on tiles crossing the diagonal or the end of the queries or keys. Three loops with the mask as a
  constexpr (as the Triton kernel has) cost 25-50 more registers here and spilled.
- 4 warps (one warpgroup) or 8 (two, splitting the key tile's rows; dQ^T splits its query columns). Every
  refill of a shared buffer waits until both warpgroups' wgmmas that read it have finished.

``_hopper_bwd_ws_kernel`` is the warp-specialised form (FlashAttention-3's): 128-row key tiles over two consumer
warpgroups with 240 registers per thread and a producer warp that fills the Q / dO / L / Delta ring; no CTA-wide
barrier in the loop. The default at head dim 128 (where one warpgroup had to run 64 x 32 tiles: with 8 warps and
128-row key tiles every query tile size spilled) and at 64 from 8,192 queries.

Inputs (the dispatcher's guarantee, not checked here): bf16 or fp16, head dim 64 or 128 (``HEAD_DIM``),
unit stride along d, 16-byte aligned bases and strides; L the natural-log logsumexp and Delta = rowsum(O dO),
both fp32 ``(B * Hq, Nq)``; DQ_ACC fp32 ``(B * Hq, Nq, HEAD_DIM)`` contiguous and zeroed. No windows or
documents (RIGHT, DOC, SPAN are accepted and ignored; the middle kernel takes its INTERLEAVE in LEFT's slot).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from cs336_systems.attention import ptx_release
from cs336_systems.attention.flash_hopper import HostDesc, _fold_head, _item_head, head_desc
from cs336_systems.attention.ptx_release import release as _release

LOG2E = 1.4426950408889634
# The head dims at which the warp-specialised kernel's consumers release ring stages without Gluon's warpgroup
# barrier (``flash_hopper``'s LEAN_RELEASE for the backward; where ``ptx_release``'s rewrite is active). H100,
# session 40 (docs/flash_tuning_notes.md): 0.3-0.7% faster at head dim 64, 0.5-6% slower at 128
LEAN_RELEASE = frozenset({64})


@builtin
def _tma_reduce_add(desc, coord, src, _semantic=None):
    """Add a shared-memory tile into global memory through TMA (``cp.reduce.async.bulk.tensor``): Gluon 3.6
    has the op (``create_async_tma_reduce``) but no public wrapper. Completes like a TMA store
    (``tma.store_wait``)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, coord, src.handle)


@gluon.constexpr_function
def _mma_layout(m, n, num_warps):
    """wgmma accumulator layout of an (m, n) tile: warps down the rows first (16 rows each), the rest across
    the columns; the widest instruction n that divides a warp column's share."""
    rows = min(num_warps, max(m // 16, 1))
    cols = num_warps // rows
    per_col = n // cols
    instr_n = 256
    while instr_n > per_col or per_col % instr_n:
        instr_n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[rows, cols], instr_shape=[16, instr_n, 16])


@gluon.jit
def _load_q_do(q_desc, do_desc, q_buf, do_buf, q_bar, do_bar, slot, idx, n_iter, n_tiles, lo, h0,
               BLOCK_M: gl.constexpr, tile_bytes: gl.constexpr, FOLD: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Start the TMA loads of the Q and dO tiles of iteration ``idx`` (query head ``h0 + idx // n_tiles``, then the
    query tile) into ring slot ``slot``, each completing on its slot's barrier; nothing past ``n_iter``. FOLD,
    HEAD_DIM: the query side's layout (``_fold_head``)."""
    pred = idx < n_iter
    g = idx // gl.maximum(n_tiles, 1)
    start = lo + (idx - g * n_tiles) * BLOCK_M
    hb, hc = _fold_head(h0 + g, FOLD, HEAD_DIM)
    mbarrier.expect(q_bar.index(slot), tile_bytes, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [hb, start, hc], q_bar.index(slot), q_buf.index(slot), pred=pred)
    mbarrier.expect(do_bar.index(slot), tile_bytes, pred=pred)
    tma.async_copy_global_to_shared(do_desc, [hb, start, hc], do_bar.index(slot), do_buf.index(slot), pred=pred)


@gluon.jit
def _load_stats(L, Delta, bh, start_m, N_Q, offs, pred):
    """L and Delta of the query tile at ``start_m`` of row ``bh`` (one value per thread; nothing unless ``pred``)."""
    offs = start_m + offs
    mask = (offs < N_Q) & pred
    return (gl.load(L + bh * N_Q + offs, mask=mask, other=0.0),
            gl.load(Delta + bh * N_Q + offs, mask=mask, other=0.0))


@gluon.jit
def _hopper_bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV, DQ_ACC, DOC, SPAN,
                            stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                            stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod,
                            stride_dkb, stride_dkn, stride_dkd, stride_dvb, stride_dvn, stride_dvd,
                            N_Q, N_K, GROUP, BKV, INTERLEAVE, RIGHT, sm_scale, qk_scale,
                            HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            CAUSAL: gl.constexpr, STAGES: gl.constexpr, DQ_TMA: gl.constexpr,
                            PERSISTENT: gl.constexpr, FOLD_Q: gl.constexpr = 0, FOLD_KV: gl.constexpr = 0):
    """The (key tile, batch x key/value head) work items of ``BKV`` heads: persistent programs (PERSISTENT) or a
    program per item (grid: key tiles x BKV); see the module docstring. INTERLEAVE (the Triton kernel's window left
    side, unused here): the heads a group of items spans (``flash_hopper._item_head``; 0 reads as 1). Q, K, V, DO, DK,
    DV (and DQ_ACC with DQ_TMA) are descriptors built on the host (``backward_descs``; the strides are in them)."""
    dtype: gl.constexpr = Q.dtype
    NUM_WARPS: gl.constexpr = gl.num_warps()

    # ---- layouts: S^T, dP^T (BLOCK_N, BLOCK_M); dK, dV (BLOCK_N, HEAD_DIM); dQ^T (HEAD_DIM, BLOCK_M)
    s_layout: gl.constexpr = _mma_layout(BLOCK_N, BLOCK_M, NUM_WARPS)
    kv_layout: gl.constexpr = _mma_layout(BLOCK_N, HEAD_DIM, NUM_WARPS)
    dq_layout: gl.constexpr = _mma_layout(HEAD_DIM, BLOCK_M, NUM_WARPS)  # dQ^T
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # along the query axis of S^T
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)  # along the key axis of S^T
    # L and Delta rows are loaded one value per thread and then spread to col_layout (through shared memory):
    # col_layout holds a quarter of the tile's columns per thread, with a 64-bit address each if loaded directly
    vec_layout: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
    kv_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_N, HEAD_DIM], dtype)
    q_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_M, HEAD_DIM], dtype)
    ds_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    stats_smem: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

    k_desc, v_desc, dk_desc, dv_desc, q_desc, do_desc = K, V, DK, DV, Q, DO

    # ---- shared memory and barriers
    k_buf = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], kv_smem)
    v_buf = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], kv_smem)
    k_t = k_buf.reshape([BLOCK_N, HEAD_DIM])
    v_t = v_buf.reshape([BLOCK_N, HEAD_DIM])
    q_buf = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, HEAD_DIM], q_smem)
    do_buf = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, HEAD_DIM], q_smem)
    ds_buf = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_smem_layout)
    # L and Delta of the current query tile wait in shared memory, written during the previous iteration (before
    # its closing barrier) from registers loaded at that iteration's start, and are read straight into the S^T
    # column layout: no layout conversion (and its barriers) in the loop
    lse_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stats_smem)
    delta_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stats_smem)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(do_bar.index(i), count=1)
    fence_async_shared()
    if DQ_TMA:
        dq_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_M, HEAD_DIM], gl.float32)
        dq_desc = DQ_ACC
        dq_buf = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, HEAD_DIM], dq_smem)

    tile_bytes: gl.constexpr = BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)
    dq_zero = gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, layout=dq_layout)
    stats_offs = gl.arange(0, BLOCK_M, layout=vec_layout)
    full_hi = (N_Q // BLOCK_M) * BLOCK_M
    n_kt = gl.cdiv(N_K, BLOCK_N)
    n_items = BKV * n_kt
    done = 0  # query tiles this program has processed: the ring's slot and phase continue across work items
    item = 0
    # work items (key tile, key/value head) in groups of ``interleave`` heads, a group's items key tile by key tile
    # across its heads (``_item_head``; 1: a head's key tiles in a row). Persistent programs take items from a counter
    # in the int32 past Delta's end (zeroed by the preprocess kernel), in that order, so that the items in flight at
    # once share a group's Q, dO and dQ in L2 (all heads at once measured 1.4-2.8x slower at long shapes, where they
    # overflow it; the planner sizes the groups to fit, ``_tuning.interleave_for``): whichever program finishes first
    # takes the next, as the hardware's block scheduler would (a fixed round-robin lost 23-30% at long causal
    # shapes). A program draws its next ticket when it has finished an item: drawn when it starts one (to hide
    # the atomic's latency), twice as many items are in flight and their heads' Q, dO and dQ overflow L2 (2x slower
    # with grouped heads at 2 x 32/8 x 8,192 x 128, 3% at 1 x 16 x 16,384 x 64; H100, session 18).
    counter = (Delta + BKV * GROUP * N_Q).to(gl.pointer_type(gl.int32))
    interleave = gl.maximum(INTERLEAVE, 1)
    if PERSISTENT:
        w = gl.atomic_add(counter, 1, sem="relaxed")
    else:
        w = gl.program_id(1) * n_kt + gl.program_id(0)
    while w < n_items:
        head, kt = _item_head(w, n_kt, BKV, interleave)
        bkv = head.to(gl.int64)
        h0 = head * GROUP
        start_n = kt * BLOCK_N

        # ---- the query tiles that see this key tile: causal, from the tile holding query start_n on
        if CAUSAL:
            lo = (start_n // BLOCK_M) * BLOCK_M
        else:
            lo = 0
        n_tiles = gl.maximum(gl.cdiv(N_Q - lo, BLOCK_M), 0)
        n_iter = n_tiles * GROUP
        # tiles [lo, full_lo) cross the diagonal, [full_hi, ...) the end of the queries; a key tile past N_K is
        # masked throughout
        full_lo = lo
        if CAUSAL:
            full_lo = gl.minimum(((start_n + BLOCK_N + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, N_Q)
        keys_edge = start_n + BLOCK_N > N_K

        mbarrier.expect(kv_bar, 2 * BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8)
        kb, kc = _fold_head(head, FOLD_KV, HEAD_DIM)
        tma.async_copy_global_to_shared(k_desc, [kb, start_n, kc], kv_bar, k_buf)
        tma.async_copy_global_to_shared(v_desc, [kb, start_n, kc], kv_bar, v_buf)
        for i in gl.static_range(STAGES):  # prologue: the item's first STAGES tiles
            _load_q_do(q_desc, do_desc, q_buf, do_buf, q_bar, do_bar, (done + i) % STAGES, i, n_iter, n_tiles, lo,
                       h0, BLOCK_M, tile_bytes, FOLD_Q, HEAD_DIM)
        lse_next, delta_next = _load_stats(L, Delta, bkv * GROUP, lo, N_Q, stats_offs, n_iter > 0)
        lse_smem.store(lse_next * 1.4426950408889634)
        delta_smem.store(delta_next)
        gl.thread_barrier()

        offs_n = start_n + gl.arange(0, BLOCK_N, layout=row_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        mbarrier.wait(kv_bar, item & 1)

        for it in range(n_iter):
            g = it // n_tiles
            start_m = lo + (it - g * n_tiles) * BLOCK_M
            s = (done + it) % STAGES
            phase = ((done + it) // STAGES) & 1
            q_s = q_buf.index(s).reshape([BLOCK_M, HEAD_DIM])
            do_s = do_buf.index(s).reshape([BLOCK_M, HEAD_DIM])

            mbarrier.wait(q_bar.index(s), phase)
            s_t = warpgroup_mma(k_t, q_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)  # S^T, eq. 13
            mbarrier.wait(do_bar.index(s), phase)
            dp_t = warpgroup_mma(v_t, do_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)  # dP^T, eq. 16
            nxt = it + 1  # the next tile's L and Delta: loads in flight while this tile computes
            g_next = nxt // n_tiles
            lse_next, delta_next = _load_stats(L, Delta, bkv * GROUP + g_next,
                                               lo + (nxt - g_next * n_tiles) * BLOCK_M, N_Q, stats_offs, nxt < n_iter)
            lse2 = lse_smem.load(col_layout)  # log2 units

            s_t = warpgroup_mma_wait(num_outstanding=1, deps=[s_t])
            p_t = gl.exp2(s_t * qk_scale - lse2[None, :])  # eq. 14 in log2 units
            if keys_edge or start_m < full_lo or start_m >= full_hi:
                offs_m = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
                visible = (offs_m[None, :] < N_Q) & (offs_n[:, None] < N_K)
                if CAUSAL:
                    visible = visible & (offs_n[:, None] <= offs_m[None, :])
                p_t = gl.where(visible, p_t, 0.0)
            dp_t = warpgroup_mma_wait(num_outstanding=0, deps=[dp_t])
            delta = delta_smem.load(col_layout)
            ds_t = (p_t * (dp_t - delta[None, :])).to(dtype)  # eq. 17
            dv = warpgroup_mma(gl.convert_layout(p_t.to(dtype), a_layout), do_s, dv, is_async=True)  # eq. 15
            ds_buf.store(ds_t)
            fence_async_shared()
            gl.thread_barrier()  # both warpgroups' halves of dS^T are written before either reads it
            dk = warpgroup_mma(gl.convert_layout(ds_t, a_layout), q_s, dk, is_async=True)  # eq. 19 (unscaled)
            # eq. 18 transposed, dQ^T = K^T dS^T: wgmma's M is the head dim, so BLOCK_M may be 32
            dq = warpgroup_mma(k_t.permute((1, 0)), ds_buf, dq_zero, use_acc=False, is_async=True)
            dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=[dv, dk, dq])
            # every thread read this tile's L and Delta before the barrier above: the next tile's replace them
            lse_smem.store(lse_next * 1.4426950408889634)
            delta_smem.store(delta_next)
            gl.thread_barrier()  # every wgmma reading Q, dO (buffer s) and dS^T has finished; L, Delta written

            # refill buffer s with the item's tile STAGES ahead
            _load_q_do(q_desc, do_desc, q_buf, do_buf, q_bar, do_bar, s, it + STAGES, n_iter, n_tiles, lo, h0,
                       BLOCK_M, tile_bytes, FOLD_Q, HEAD_DIM)

            if DQ_TMA:
                tma.store_wait(pendings=0)  # the previous tile's reduce has read dq_buf
                gl.thread_barrier()
                dq_buf.reshape([BLOCK_M, HEAD_DIM]).permute((1, 0)).store(dq)
                fence_async_shared()
                gl.thread_barrier()
                _tma_reduce_add(dq_desc, [h0 + g, start_m, 0], dq_buf)  # rows past N_Q are clipped
            else:
                offs_qm = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, dq_layout))
                offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, dq_layout))
                ptrs = DQ_ACC + ((bkv * GROUP + g) * N_Q + offs_qm[None, :]) * HEAD_DIM + offs_d[:, None]
                gl.atomic_add(ptrs, dq, mask=offs_qm[None, :] < N_Q, sem="relaxed")

        # ---- dK (scaled, eq. 19), dV through the K and V buffers (every MMA that read them has finished) and TMA
        # stores (rows past N_K clipped); the next item loads into them only after the stores have read them
        k_t.store((dk * sm_scale).to(dtype))
        v_t.store(dv.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(dk_desc, [kb, start_n, kc], k_buf)
        tma.async_copy_shared_to_global(dv_desc, [kb, start_n, kc], v_buf)
        tma.store_wait(pendings=0)
        gl.thread_barrier()
        done += n_iter
        item += 1
        if PERSISTENT:
            w = gl.atomic_add(counter, 1, sem="relaxed")
        else:
            w = n_items

    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(q_bar.index(i))
        mbarrier.invalidate(do_bar.index(i))


# ------------------------------------------------------------------------------- warp-specialised form
# FlashAttention-3's backward layout (Shah et al. 2024, appendix B): a program owns a 128-row key tile; two consumer
# warpgroups take 64 key rows each (their own S^T, dP^T, dK, dV in registers, raised to 240 per thread with
# setmaxnreg) and share the Q / dO / L / Delta ring that one producer warp fills. dQ^T = K^T dS^T runs over all 128
# keys from both halves of dS^T in shared memory, each warpgroup computing half of it: 64 of its head-dim rows at
# head dim 128, half of its query columns at 64 (wgmma's M is at least 64). So a query tile's dQ is reduced into the
# accumulator once per 128 keys (half the one-warpgroup kernel's reduce-adds) and every Q / dO tile is loaded once
# per 128 keys.
@gluon.constexpr_function
def _ds_swizzle(head_dim, block_m):
    """dS^T's (16-bit) shared-memory swizzle in bytes: each consumer's block of query columns (``_dq_split``) must
    start on a swizzle atom to be an MMA operand, so 64 bytes where the halves are 32 columns (head dim 64, block_m
    64)."""
    dq_n = block_m if head_dim >= 128 else block_m // 2
    return min(128, dq_n * 2)


@gluon.constexpr_function
def _dq_split(head_dim, block_m):
    """The (rows, columns) of dQ^T each consumer warpgroup computes: half the head dim where that is at least
    wgmma's 64 rows, else half the query columns (each half starting on a swizzle atom of dS^T: ``_ds_swizzle``)."""
    return (head_dim // 2, block_m) if head_dim >= 128 else (head_dim, block_m // 2)


@gluon.jit
def _ws_bwd_producer(q_desc, do_desc, k_desc, v_desc, L, Delta, q_buf, do_buf, k_buf, v_buf, lse_buf, delta_buf,
                     kv_bar, q_bars, do_bars, empty_bars, head, start_n, bq0, lo, n_tiles, n_iter, N_Q,
                     BLOCK_M: gl.constexpr, STAGES: gl.constexpr, HEAD_DIM: gl.constexpr, FOLD_Q: gl.constexpr,
                     FOLD_KV: gl.constexpr):
    """One warp: K and V of the key tile, then per query tile (query head ``bq0 + idx // n_tiles``) Q and dO by TMA
    and L (log2 units) and Delta by plain loads into the ring stage, once both consumers have released it. Q's
    barrier counts the stats' store as its second arrival."""
    vec: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    kb, kc = _fold_head(head, FOLD_KV, HEAD_DIM)
    tma.async_copy_global_to_shared(k_desc, [kb, start_n, kc], kv_bar, k_buf)
    tma.async_copy_global_to_shared(v_desc, [kb, start_n, kc], kv_bar, v_buf)
    offs = gl.arange(0, BLOCK_M, layout=vec)
    for it in range(n_iter):
        s = it % STAGES
        g = it // n_tiles
        start_m = lo + (it - g * n_tiles) * BLOCK_M
        rows = start_m + offs
        row_ptr = (bq0 + g).to(gl.int64) * N_Q + rows
        lse = gl.load(L + row_ptr, mask=rows < N_Q, other=0.0)  # in flight while the stage drains
        delta = gl.load(Delta + row_ptr, mask=rows < N_Q, other=0.0)
        mbarrier.wait(empty_bars.index(s), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
        qb, qc = _fold_head(bq0 + g, FOLD_Q, HEAD_DIM)
        mbarrier.expect(q_bars.index(s), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [qb, start_m, qc], q_bars.index(s), q_buf.index(s))
        mbarrier.expect(do_bars.index(s), do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(do_desc, [qb, start_m, qc], do_bars.index(s), do_buf.index(s))
        lse_buf.index(s).store(lse * 1.4426950408889634)
        delta_buf.index(s).store(delta)
        mbarrier.arrive(q_bars.index(s))


@gluon.jit
def _ws_bwd_consumer(dq_desc, dk_desc, dv_desc, q_buf, do_buf, k_buf, v_buf, lse_buf, delta_buf, ds_buf, dq_buf,
                     kv_bar, q_bars, do_bars, empty_bars, ds_bars, epi_bar, head, start_n, bq0, lo, n_tiles, n_iter,
                     N_Q, N_K, sm_scale, qk_scale, WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                     CAUSAL: gl.constexpr, STAGES: gl.constexpr, FOLD_KV: gl.constexpr, DQ_EARLY: gl.constexpr,
                     LEAN: gl.constexpr):
    """Key rows ``start_n + 64 WG`` .. + 64 of the tile: S^T, dP^T, dS^T, dK and dV for them, and this warpgroup's
    half of each query tile's dQ^T (``_dq_split``) over all 128 keys (the other warpgroup's dS^T rows included).
    LEAN: ring stages released without Gluon's warpgroup barrier (``ptx_release.release``): every warp's reads of
    the stage's L and Delta feed the MMAs whose completion the release follows."""
    dtype: gl.constexpr = q_buf.dtype
    ROWS: gl.constexpr = 64
    DQ: gl.constexpr = _dq_split(HEAD_DIM, BLOCK_M)
    DQ_M: gl.constexpr = DQ[0]  # this warpgroup's part of dQ^T: head-dim rows x query columns
    DQ_N: gl.constexpr = DQ[1]
    s_layout: gl.constexpr = _mma_layout(ROWS, BLOCK_M, 4)
    kv_layout: gl.constexpr = _mma_layout(ROWS, HEAD_DIM, 4)
    dq_layout: gl.constexpr = _mma_layout(DQ_M, DQ_N, 4)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    k_tile = k_buf.reshape([2 * ROWS, HEAD_DIM])
    k_t = k_tile.slice(WG * ROWS, ROWS, dim=0)  # this warpgroup's keys
    v_t = v_buf.reshape([2 * ROWS, HEAD_DIM]).slice(WG * ROWS, ROWS, dim=0)
    if DQ_M < HEAD_DIM:  # K^T's head-dim rows of this warpgroup's dQ^T, and its corner of the accumulator
        k_dq = k_tile.slice(WG * DQ_M, DQ_M, dim=1).permute((1, 0))
        dq_row, dq_col = 0, WG * DQ_M
    else:
        k_dq = k_tile.permute((1, 0))
        dq_row, dq_col = WG * DQ_N, 0
    dq_stage = dq_buf.index(WG)

    s_zero = gl.zeros([ROWS, BLOCK_M], gl.float32, layout=s_layout)
    dq_zero = gl.zeros([DQ_M, DQ_N], gl.float32, layout=dq_layout)
    full_hi = (N_Q // BLOCK_M) * BLOCK_M
    k0 = start_n + WG * ROWS
    full_lo = lo
    if CAUSAL:
        full_lo = gl.minimum(((k0 + ROWS + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, N_Q)
    keys_edge = k0 + ROWS > N_K
    offs_n = k0 + gl.arange(0, ROWS, layout=row_layout)
    dk = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=kv_layout)
    mbarrier.wait(kv_bar, 0)

    for it in range(n_iter):
        g = it // n_tiles
        start_m = lo + (it - g * n_tiles) * BLOCK_M
        s = it % STAGES
        phase = (it // STAGES) & 1
        q_s = q_buf.index(s).reshape([BLOCK_M, HEAD_DIM])
        do_s = do_buf.index(s).reshape([BLOCK_M, HEAD_DIM])

        mbarrier.wait(q_bars.index(s), phase)  # Q, and this tile's L and Delta
        s_t = warpgroup_mma(k_t, q_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)  # S^T, eq. 13
        mbarrier.wait(do_bars.index(s), phase)
        dp_t = warpgroup_mma(v_t, do_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)  # dP^T, eq. 16
        lse2 = lse_buf.index(s).load(col_layout)
        s_t = warpgroup_mma_wait(num_outstanding=1, deps=[s_t])
        p_t = gl.exp2(s_t * qk_scale - lse2[None, :])  # eq. 14 in log2 units
        if keys_edge or start_m < full_lo or start_m >= full_hi:
            offs_m = start_m + gl.arange(0, BLOCK_M, layout=col_layout)
            visible = (offs_m[None, :] < N_Q) & (offs_n[:, None] < N_K)
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= offs_m[None, :])
            p_t = gl.where(visible, p_t, 0.0)
        delta = delta_buf.index(s).load(col_layout)
        dp_t = warpgroup_mma_wait(num_outstanding=0, deps=[dp_t])
        ds_t = (p_t * (dp_t - delta[None, :])).to(dtype)  # eq. 17
        p_op = gl.convert_layout(p_t.to(dtype), a_layout)
        if not DQ_EARLY:
            dv = warpgroup_mma(p_op, do_s, dv, is_async=True)  # eq. 15
        b = it % 2  # dS^T double buffer: see the barrier argument below
        ds_tile = ds_buf.index(b)
        ds_tile.slice(WG * ROWS, ROWS, dim=0).store(ds_t)
        fence_async_shared()
        mbarrier.arrive(ds_bars.index(b))
        dk = warpgroup_mma(gl.convert_layout(ds_t, a_layout), q_s, dk, is_async=True)  # eq. 19 (unscaled)
        # both halves of dS^T written; the other warpgroup passed this barrier's previous phase only after finishing
        # its iteration it - 1 (whose dQ read buffer b ^ 1), so the buffer written at it + 1 is free then
        mbarrier.wait(ds_bars.index(b), (it // 2) & 1)
        if DQ_N < BLOCK_M:
            ds_op = ds_tile.slice(WG * DQ_N, DQ_N, dim=1)
        else:
            ds_op = ds_tile
        dq = warpgroup_mma(k_dq, ds_op, dq_zero, use_acc=False, is_async=True)  # eq. 18 transposed
        if DQ_EARLY:  # dV after dQ: it runs while dQ goes out through shared memory
            dv = warpgroup_mma(p_op, do_s, dv, is_async=True)  # eq. 15
            dk, dq = warpgroup_mma_wait(num_outstanding=1, deps=[dk, dq])
        else:
            dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=[dv, dk, dq])
            _release(empty_bars.index(s), LEAN)  # Q, dO, L, Delta of stage s read by this warpgroup's MMAs

        tma.store_wait(pendings=0)  # the previous tile's reduce has read this warpgroup's staging buffer
        gl.thread_barrier()
        dq_stage.reshape([DQ_N, DQ_M]).permute((1, 0)).store(dq)
        fence_async_shared()
        gl.thread_barrier()
        _tma_reduce_add(dq_desc, [bq0 + g, start_m + dq_row, dq_col], dq_stage)  # rows past N_Q are clipped
        if DQ_EARLY:
            dv = warpgroup_mma_wait(num_outstanding=0, deps=[dv])
            _release(empty_bars.index(s), LEAN)  # Q, dO, L, Delta of stage s read by this warpgroup's MMAs

    # dV through this warpgroup's half of V's buffer (only its own MMAs read it); dK through K's half once both
    # warpgroups' dQ^T MMAs, which read all of K, have finished
    v_t.store(dv.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    kb, kc = _fold_head(head, FOLD_KV, HEAD_DIM)
    tma.async_copy_shared_to_global(dv_desc, [kb, k0, kc], v_buf.slice(WG * ROWS, ROWS, dim=1))
    mbarrier.arrive(epi_bar)
    mbarrier.wait(epi_bar, 0)
    k_t.store((dk * sm_scale).to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(dk_desc, [kb, k0, kc], k_buf.slice(WG * ROWS, ROWS, dim=1))
    tma.store_wait(pendings=0)


@gluon.jit
def _hopper_bwd_ws_kernel(Q, K, V, DO, L, Delta, DK, DV, DQ_ACC, DOC, SPAN,
                          stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                          stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod,
                          stride_dkb, stride_dkn, stride_dkd, stride_dvb, stride_dvn, stride_dvd,
                          N_Q, N_K, GROUP, BKV, LEFT, RIGHT, sm_scale, qk_scale,
                          HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          CAUSAL: gl.constexpr, STAGES: gl.constexpr, DQ_TMA: gl.constexpr,
                          PERSISTENT: gl.constexpr, FOLD_Q: gl.constexpr = 0, FOLD_KV: gl.constexpr = 0,
                          DQ_EARLY: gl.constexpr = False, LEAN: gl.constexpr = 0):
    """``_hopper_bwd_dkdv_kernel``'s arguments and grid (key tiles x BKV), BLOCK_N = 128, launched with 4 warps:
    the default partition is the first consumer warpgroup, the workers the second and the producer warp. DQ_TMA
    and PERSISTENT are accepted for the shared launcher (always TMA, a program per item). DQ_EARLY: each tile's
    dV product issued after its dQ product, so that it runs while dQ goes out through shared memory (H100, session
    37: 1-2.6% faster without the causal mask at head dim 128, 3.3% slower with it; at head dim 64 it spills).
    LEAN (``ptx_release.VERSION``, or 0): the consumers' ring releases without a warpgroup barrier (needs
    ``ptx_release``'s rewrite, ``ptx_release.active()``). Descriptors as in ``_hopper_bwd_dkdv_kernel``, DQ_ACC's
    always."""
    dtype: gl.constexpr = Q.dtype
    DQ: gl.constexpr = _dq_split(HEAD_DIM, BLOCK_M)
    kv_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_N, HEAD_DIM], dtype)
    q_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_M, HEAD_DIM], dtype)
    ds_smem: gl.constexpr = gl.NVMMASharedLayout(_ds_swizzle(HEAD_DIM, BLOCK_M), 16)
    dq_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, DQ[1], DQ[0]], gl.float32)
    stats_smem: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

    head = gl.program_id(1)
    start_n = gl.program_id(0) * BLOCK_N
    bq0 = head * GROUP
    # dK, dV leave by halves of the key tile, dQ^T by _dq_split's blocks
    k_desc, v_desc, dk_desc, dv_desc, q_desc, do_desc, dq_desc = K, V, DK, DV, Q, DO, DQ_ACC

    k_buf = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], kv_smem)
    v_buf = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], kv_smem)
    q_buf = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, HEAD_DIM], q_smem)
    do_buf = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_M, HEAD_DIM], q_smem)
    lse_buf = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_smem)
    delta_buf = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_smem)
    ds_buf = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_smem)
    dq_buf = gl.allocate_shared_memory(gl.float32, [2, 1, DQ[1], DQ[0]], dq_smem)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    epi_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(epi_bar, count=2)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_bars.index(i), count=2)  # the TMA's expect and the producer's stats
        mbarrier.init(do_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)  # one arrival per consumer warpgroup
    for i in gl.static_range(2):
        mbarrier.init(ds_bars.index(i), count=2)
    fence_async_shared()

    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
    else:
        lo = 0
    n_tiles = gl.maximum(gl.cdiv(N_Q - lo, BLOCK_M), 0)
    n_iter = n_tiles * GROUP
    gl.warp_specialize([
        (_ws_bwd_consumer, (dq_desc, dk_desc, dv_desc, q_buf, do_buf, k_buf, v_buf, lse_buf, delta_buf, ds_buf, dq_buf,
                            kv_bar, q_bars, do_bars, empty_bars, ds_bars, epi_bar, head, start_n, bq0, lo, n_tiles,
                            n_iter, N_Q, N_K, sm_scale, qk_scale, 0, HEAD_DIM, BLOCK_M, CAUSAL, STAGES, FOLD_KV,
                            DQ_EARLY, LEAN)),
        (_ws_bwd_consumer, (dq_desc, dk_desc, dv_desc, q_buf, do_buf, k_buf, v_buf, lse_buf, delta_buf, ds_buf, dq_buf,
                            kv_bar, q_bars, do_bars, empty_bars, ds_bars, epi_bar, head, start_n, bq0, lo, n_tiles,
                            n_iter, N_Q, N_K, sm_scale, qk_scale, 1, HEAD_DIM, BLOCK_M, CAUSAL, STAGES, FOLD_KV,
                            DQ_EARLY, LEAN)),
        (_ws_bwd_producer, (q_desc, do_desc, k_desc, v_desc, L, Delta, q_buf, do_buf, k_buf, v_buf, lse_buf, delta_buf,
                            kv_bar, q_bars, do_bars, empty_bars, head, start_n, bq0, lo, n_tiles, n_iter, N_Q,
                            BLOCK_M, STAGES, HEAD_DIM, FOLD_Q, FOLD_KV)),
    ], [4, 1], [240, 24])


def backward_descs(bh_kv: int, group: int, n_q: int, n_k: int, sq: tuple, sk: tuple, sv: tuple, sdo: tuple,
                   skv: tuple, head_dim: int, block_m: int, block_n: int, dtype, fold_q: int, fold_kv: int,
                   warp_specialize: bool, dq_tma: bool) -> tuple:
    """The kernels' descriptors (built on the host, ``flash_hopper.HostDesc``), aligned with their pointer arguments
    (Q, K, V, DO, L, Delta, DK, DV, DQ_ACC, DOC, SPAN): every tensor as 3-D (batch x heads, rows, head dim), a tile
    one head's rows (rows past N_Q / N_K read as zero and are clipped on stores): K and V tiles of ``block_n`` rows,
    dK and dV of ``block_n`` (half that warp-specialised: they leave by halves), Q and dO of ``block_m`` rows of the
    ``group`` query heads of each key/value head, and the fp32 dQ accumulator's (``dq_tma``, always in the
    warp-specialised kernel: its dQ^T leaves by ``_dq_split``'s blocks). ``skv``: the strides of dK and dV."""
    bh = bh_kv * group
    out_rows = block_n // 2 if warp_specialize else block_n
    dq = None
    if warp_specialize or dq_tma:
        rows, cols = _dq_split(head_dim, block_m) if warp_specialize else (head_dim, block_m)
        dq = HostDesc((bh, n_q, head_dim), (n_q * head_dim, head_dim, 1), (1, cols, rows), torch.float32)
    return (head_desc(bh, n_q, sq[0], sq[1], head_dim, block_m, dtype, fold_q),
            head_desc(bh_kv, n_k, sk[0], sk[1], head_dim, block_n, dtype, fold_kv),
            head_desc(bh_kv, n_k, sv[0], sv[1], head_dim, block_n, dtype, fold_kv),
            head_desc(bh, n_q, sdo[0], sdo[1], head_dim, block_m, dtype, fold_q), None, None,
            head_desc(bh_kv, n_k, skv[0], skv[1], head_dim, out_rows, dtype, fold_kv),
            head_desc(bh_kv, n_k, skv[0], skv[1], head_dim, out_rows, dtype, fold_kv), dq, None, None)


# ------------------------------------------------------------------------------------------------ variants
@dataclass(frozen=True)
class Variant:
    """One compiled form of the kernel: tiles, warps (4: one warpgroup, 8: two), Q/dO pipeline depth, how dQ
    is accumulated (TMA reduce-add or pointer atomics), whether programs are persistent, and the warp-specialised
    form (``_hopper_bwd_ws_kernel``: 128-row key tiles over two consumer warpgroups and a producer warp, launched
    with 4 warps), with its dV product after dQ's (``dq_early``) and its ring releases without Gluon's warpgroup
    barrier (``lean``)."""

    head_dim: int
    block_n: int
    block_m: int
    num_warps: int
    stages: int
    dq_tma: bool = True
    persistent: bool = False
    warp_specialize: bool = False
    dq_early: bool = False
    lean: bool = False

    @property
    def kernel(self):
        return _hopper_bwd_ws_kernel if self.warp_specialize else _hopper_bwd_dkdv_kernel

    def constexprs(self, causal: bool) -> dict:
        extra = dict(DQ_EARLY=self.dq_early, LEAN=ptx_release.VERSION if self.lean else 0) if self.warp_specialize \
            else {}
        return dict(HEAD_DIM=self.head_dim, BLOCK_M=self.block_m, BLOCK_N=self.block_n, CAUSAL=causal,
                    STAGES=self.stages, DQ_TMA=self.dq_tma, PERSISTENT=self.persistent, **extra)

    def name(self) -> str:
        return (f"d{self.head_dim}/n{self.block_n}xm{self.block_m}/w{self.num_warps}/s{self.stages}/"
                f"{'tma' if self.dq_tma else 'ptr'}{'/p' if self.persistent else ''}"
                f"{'/ws' if self.warp_specialize else ''}{'/early' if self.dq_early else ''}"
                f"{'/lean' if self.lean else ''}")


# Registers and spills: scripts/device/flash_aot.py --gluon-bwd. The one- and two-warpgroup variants compile without
# spills (head dim 128 with 8 warps and 128-row key tiles spills at any query tile: dK and dV alone hold 128 fp32
# registers per thread, hence the warp-specialised form there, with 240 per consumer thread). The warp-specialised
# ones spill a few scalars around the loop at head dim 128 (36-60 B) and 330-380 B at 64 on 128 x 128 tiles (S^T and
# dP^T of 64 x 128 a consumer); at 64 on 64 query rows (dS^T in a 64-byte swizzle, ``_ds_swizzle``) they do not spill,
# and with three stages that form is the table's from 8,192 queries on (docs/flash_tuning_notes.md, session 37).
VARIANTS = (
    Variant(64, 64, 64, 4, 2), Variant(64, 64, 64, 4, 3), Variant(64, 64, 64, 4, 2, dq_tma=False),
    Variant(64, 128, 64, 8, 2), Variant(64, 128, 64, 8, 3), Variant(64, 128, 64, 8, 2, dq_tma=False),
    Variant(128, 64, 32, 4, 2), Variant(128, 64, 32, 4, 3), Variant(128, 64, 32, 4, 2, dq_tma=False),
    Variant(64, 64, 64, 4, 2, persistent=True), Variant(128, 128, 64, 4, 2, warp_specialize=True),
    Variant(64, 128, 128, 4, 2, warp_specialize=True),
    Variant(128, 128, 64, 4, 2, warp_specialize=True, dq_early=True),
    Variant(64, 128, 64, 4, 3, warp_specialize=True),
    Variant(128, 128, 64, 4, 2, warp_specialize=True, lean=True),
    Variant(128, 128, 64, 4, 2, warp_specialize=True, dq_early=True, lean=True),
    Variant(64, 128, 64, 4, 3, warp_specialize=True, lean=True),
)


def default_variant(head_dim: int) -> Variant:
    """The dispatcher's variant on an H100 (``_tuning``'s ``hopper_bwd``), which the check script and tests use
    unless told otherwise."""
    if head_dim not in (64, 128):
        raise ValueError(f"the Hopper backward supports head dims 64 and 128, got {head_dim}")
    return Variant(64, 64, 64, 4, 2, persistent=True) if head_dim == 64 else Variant(128, 128, 64, 4, 2,
                                                                                     warp_specialize=True)


# ------------------------------------------------------------------------------------------- check launches
def backward_launches(q, k, v, o, lse, do, causal: bool, variant: Variant | None = None, scale: float | None = None,
                      middle=None):
    """The three launches of the atomic-dQ backward with this kernel in the middle (``flash_triton``'s
    preprocess and postprocess around it), as zero-argument callables, and the (dQ, dK, dV) they fill. For the
    device check script and the GPU tests; the dispatcher's own launcher replaces it. ``q`` (B, Hq, Nq, d),
    ``k``, ``v`` (B, Hkv, Nk, d) contiguous CUDA tensors, ``o``, ``lse`` from the forward. ``middle``: another
    kernel of the same arguments in place of ours, as ``(kernel, constexprs, num_warps, num_stages)``."""
    import math

    import triton

    from cs336_systems.attention import flash_triton as ft
    from cs336_systems.attention._tuning import KernelConfig

    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    variant = variant or default_variant(d)
    if variant.head_dim != d:
        raise ValueError(f"variant {variant.name()} is for head dim {variant.head_dim}, the inputs have {d}")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    lse = lse.contiguous()
    bh, bh_kv = b * hq, b * hkv
    dev = q.device
    delta = torch.empty(bh * n_q + 1, device=dev, dtype=torch.float32)[:-1].view(bh, n_q)  # + the work counter
    dq_acc = torch.empty((bh, n_q, d), device=dev, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sq, skv = (n_q * d, d, 1), (n_k * d, d, 1)
    rows = 64
    row_grid = (triton.cdiv(n_q, rows), bh)

    def pre():
        ft._flash_bwd_preprocess[row_grid](o, do, delta, dq_acc, *sq, *sq, n_q, HEAD_DIM=d, D_PAD=d, BLOCK_M=rows,
                                           ZERO_DQ=True)

    pointers = (q, k, v, do, lse, delta, dk, dv, dq_acc, lse, lse)
    if middle is None:
        # ours through the dispatcher's launcher (a persistent variant's grid sized from the compiled kernel): the
        # work items' batch x key/value heads in the HEADS slot
        cfg = KernelConfig(variant.block_m, variant.block_n, variant.num_warps, 1, True,
                           warp_specialize=variant.warp_specialize, persistent=variant.persistent)
        descs = backward_descs(bh_kv, hq // hkv, n_q, n_k, sq, skv, skv, sq, skv, d, variant.block_m,
                               variant.block_n, q.dtype, 0, 0, variant.warp_specialize, variant.dq_tma)
        launch = ft._Launch(variant.kernel, variant.constexprs(causal), cfg, descs)
        items = triton.cdiv(n_k, variant.block_n)
        grid = (items * bh_kv, 1, 1) if variant.persistent else (items, bh_kv, 1)
        scalars = (*sq, *skv, *skv, *sq, *skv, *skv, n_q, n_k, hq // hkv, bh_kv, 0, 0, scale, scale * ft.LOG2E)

        def mid():
            launch(grid, pointers, scalars)
    else:
        kernel, constexprs, warps, stages = middle

        def mid():
            triton.set_allocator(ft._tma_workspace)  # the kernels build their descriptors in global scratch
            kernel[(triton.cdiv(n_k, constexprs["BLOCK_N"]), bh_kv)](  # the Triton kernel takes heads per batch
                *pointers, *sq, *skv, *skv, *sq, *skv, *skv, n_q, n_k, hq // hkv, hkv, 0, 0, scale,
                scale * ft.LOG2E, **constexprs, num_warps=warps, num_stages=stages)

    def post():
        ft._flash_bwd_dq_postprocess[row_grid](dq_acc, dq, *sq, n_q, scale, HEAD_DIM=d, D_PAD=d, BLOCK_M=rows)

    return (pre, mid, post), (dq, dk, dv)


def run_backward(q, k, v, o, lse, do, causal: bool, variant: Variant | None = None, scale: float | None = None):
    """dQ, dK, dV through ``backward_launches``."""
    launches, grads = backward_launches(q, k, v, o, lse, do, causal, variant, scale)
    for launch in launches:
        launch()
    return grads


ptx_release.register(_hopper_bwd_ws_kernel)
