# ruff: noqa: E741  (O, the attention output, is the handout's name)
"""FlashAttention forward for Hopper (sm_90a) in Gluon: what the portable Triton kernel cannot say.

Work items (query tile, batch x head), as the programs of ``_flash_fwd_kernel`` in ``flash_triton``, with the same
integer arguments, outputs (O, and L in natural log) and causal convention (top-left aligned), so that its backward is
unchanged; Q, K, V and O come as TMA descriptors built on the host (``HostDesc``). What differs is how a key tile is
processed, following FlashAttention-3 (Shah et al., 2024, section 3):

- K and V tiles arrive by TMA into a ring of ``STAGES`` shared-memory buffers, each with its own mbarrier; a
  buffer is refilled as soon as the MMAs that read it have completed, ``STAGES - 1`` tiles ahead.
- S = Q K^T and O += P V are warpgroup MMAs issued asynchronously: in iteration j the program issues S_j and
  P_{j-1} V_{j-1}, waits for S_j only, computes the softmax of tile j while the tensor cores run P V, then
  waits for P V (FA3's intra-warpgroup overlap of softmax and matmuls).
- P stays in registers as the A operand of the P V MMA (no shared-memory round trip); O leaves through shared
  memory and a TMA store (out-of-range rows clipped by the unit, as out-of-range rows are zero-filled on load).
- Causal: the tiles right of the diagonal are never loaded; only the tiles that cross it (or the end of the
  keys) are masked.

Two kernels: one warpgroup that refills its ring itself (``_hopper_fwd_persistent_kernel``, head dim 64 up to 8,192
queries) and a warp-specialised one, two consumer warpgroups and a producer warp (``_hopper_fwd_ws_persistent_kernel``,
``KernelConfig.warp_specialize``). Both run as programs that stay resident and take the items from a counter
(``KernelConfig.persistent``), or, where one wave holds every item, a program per item (``PERSISTENT=False``).

Scope: 16-bit inputs, head dims 64 and 128, unit stride along d with 16-byte aligned strides, full attention or
causal, grouped-query heads; windows and packed documents stay on the Triton kernel. ``flash_triton`` chooses it
per call (``hopper_forward``) and falls back to Triton elsewhere.
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

from cs336_systems.attention import ptx_release
from cs336_systems.attention.ptx_release import release as _release

LN2 = gl.constexpr(0.6931471805599453)

HEAD_DIMS = (64, 128)
# The warp-specialised forward's consumers release ring stages without Gluon's warpgroup barrier (``_release``; where
# ``ptx_release``'s rewrite is active): see docs/flash_tuning_notes.md, session 39
LEAN_RELEASE = True
# The one-warpgroup forward's P rounded in packed pairs, l kept in per-thread parts and O scaled by 1 / l (PACK_P,
# LEAN_L: 7% fewer instructions an item; on the H200 3.5% faster in bursts and 3% less energy a call at the power cap,
# docs/flash_tuning_notes.md, session 43); the warp-specialised forward's consumers' l the same way (LEAN_L: 3.5%
# faster at lb2025 in bursts, even at noncausal_2k, session 44)
LEAN_SOFTMAX = True
# The warp-specialised forward's m moved only past this many log2 units and O's rescale skipped by warps whose rows
# kept theirs (LAZY_RESCALE, FlashAttention-4's conditional rescaling; 0 off), with the tile's largest P's rounding
# kept for O's denominator (``_softmax_tile``: without it O's error reached 2.1x SDPA's simulated, past 2x on the
# H200). The planner passes it at ``WS_RESCALE_HEAD_DIMS``: at head dim 128 on the H200 1.6-3% faster at
# noncausal_2k and 2% at lb2026 in bursts, 2.2% less energy a call at the cap (2.5% slower at d128_4k's 0.12 ms); at
# 64 uncompensated 0.8% slower at lb2025. In the one-warpgroup forward it cost 1-2%
# (experiments/flash_fwd_lazy_rescale/; docs/flash_tuning_notes.md, sessions 44-45)
RESCALE_THRESHOLD = 4
WS_RESCALE_HEAD_DIMS = (128,)
_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


class HostDesc:
    """A tensor argument that a Gluon kernel takes as a TMA descriptor built on the host: ``shape`` and ``strides`` in
    elements, a tile of ``block``, the shared-memory layout its tiles land in. Built in the kernel instead
    (``tma.make_tensor_descriptor``), a descriptor costs each program a global write, a proxy fence and barriers per
    tensor before its first load: 4.5 us of a 25 us forward at 4 x 25 x 512 x 64 on an H100 (session 38); from the
    host it is a kernel parameter. The launcher (``flash_triton._direct_launcher``) encodes it once per tensor
    address, so a call at a known address encodes nothing."""

    __slots__ = ("block", "layout", "shape", "strides")

    def __init__(self, shape: tuple, strides: tuple, block: tuple, dtype):
        self.shape, self.strides, self.block = tuple(shape), tuple(strides), tuple(block)
        self.layout = gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])

    def descriptor(self, t):
        """Triton's descriptor object of tensor ``t`` (the JIT's launch path)."""
        return TensorDescriptor(t, list(self.shape), list(self.strides), list(self.block), self.layout)


def head_desc(heads: int, rows: int, stride_h: int, stride_r: int, head_dim: int, tile: int, dtype,
              fold: int = 0) -> HostDesc:
    """A tensor as 3-D (heads, rows, head dim), unit stride along d, a tile ``tile`` rows of one head (rows past
    ``rows`` read as zero and are clipped on stores); FOLD heads side by side in each row: 3-D (batches, rows, FOLD x
    head dim), ``stride_h`` the batch stride, a tile at ``_fold_head``'s coordinates."""
    if fold:
        return HostDesc((heads // fold, rows, fold * head_dim), (stride_h, stride_r, 1), (1, tile, head_dim), dtype)
    return HostDesc((heads, rows, head_dim), (stride_h, stride_r, 1), (1, tile, head_dim), dtype)


def forward_descs(heads: int, group: int, n_q: int, n_k: int, sq: tuple, sk: tuple, sv: tuple, so: tuple,
                  head_dim: int, q_rows: int, block_n: int, dtype, fold_q: int, fold_kv: int) -> tuple:
    """The forwards' descriptors, aligned with their pointer arguments (Q, K, V, O, L, DOC, SPAN): Q and O tiles of
    ``q_rows`` rows (a consumer's, warp-specialised) of one of ``heads`` batch x query heads, K and V tiles of
    ``block_n`` rows of one of ``heads // group`` key/value heads; fold_q, fold_kv the sides' layout."""
    return (head_desc(heads, n_q, sq[0], sq[1], head_dim, q_rows, dtype, fold_q),
            head_desc(heads // group, n_k, sk[0], sk[1], head_dim, block_n, dtype, fold_kv),
            head_desc(heads // group, n_k, sv[0], sv[1], head_dim, block_n, dtype, fold_kv),
            head_desc(heads, n_q, so[0], so[1], head_dim, q_rows, dtype, fold_q), None, None, None)


@gluon.jit
def _softmax_tile(s, m_i, l_i, c_i, offs_m, start_n, N_K, qk_scale, BLOCK_N: gl.constexpr,
                  col_layout: gl.constexpr, MASKED: gl.constexpr, CAUSAL: gl.constexpr, PARTIAL: gl.constexpr = False,
                  LAZY: gl.constexpr = 0, DTYPE: gl.constexpr = gl.bfloat16):
    """Online softmax of one score tile (log2 units): P, the rescale factor of the running sums, new l, m and c.
    Every row sees key 0 (causal is top-left aligned), so m is finite after the first tile: no NaN guards.
    PARTIAL: l as ``_row_partials`` (each thread's own columns), summed across threads once, after the last tile.
    LAZY > 0: m moves only where the row's maximum passes it by more than LAZY (log2 units; P then stays below
    2^LAZY), so that alpha is exactly 1 on most rows of most tiles and ``_rescale_lazy`` can skip O's rescale
    (FlashAttention-4's conditional rescaling, threshold 8); m, l and O stay consistent, so L = m + log2(l) holds
    either way. The cost would be the tile's largest P, up to 2^LAZY, no longer exactly 1 in P V's 16 bits
    (``DTYPE``), which ``scripts/lazy_rescale_sim.py --draws 40`` puts at up to 1.9-2.1x SDPA's error against
    fp64 at threshold 4 (1,000 x 128, 128-key tiles, random and growing keys; 2.15x at 8). c_i keeps that element's
    rounding (rescaled like l) and O's denominator is l + c (``_normalise``), so the dominant term cancels as in the
    exact form: 1.31-1.37x there (the exact form 1.12-1.33x); L keeps l alone."""
    if MASKED:
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=col_layout)
        visible = gl.expand_dims(offs_n < N_K, 0)
        if CAUSAL:
            visible = visible & (gl.expand_dims(offs_n, 0) <= gl.expand_dims(offs_m, 1))
        s = gl.where(visible, s, float("-inf"))
    m_row = gl.max(s, 1) * qk_scale
    if LAZY > 0:
        m_new = gl.where(m_row > m_i + LAZY, m_row, m_i)
    else:
        m_new = gl.maximum(m_i, m_row)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    if PARTIAL:
        part = _row_partials(p, BLOCK_N)
        l_i = l_i * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, part.type.layout)), 1) + part
    else:
        l_i = l_i * alpha + gl.sum(p, 1)
    if LAZY > 0:
        p_max = gl.exp2(m_row - m_new)  # 1 where m moved to this tile's maximum, 0 on rows it masks wholly
        c_i = c_i * alpha + (p_max.to(DTYPE).to(gl.float32) - p_max)
    return p, alpha, l_i, m_new, c_i


@gluon.jit
def _row_partials(x, BLOCK_N: gl.constexpr):
    """Row sums of the (rows, BLOCK_N) tile ``x`` in four parts, (rows, 4): part c sums columns 8j + 2c + {0, 1},
    which in the warpgroup MMA's accumulator layout are the columns one thread of the row's four holds, so the sum
    needs no shuffles; the four parts are added once, at the end."""
    ROWS: gl.constexpr = x.shape[0]
    return gl.sum(gl.sum(gl.reshape(x, [ROWS, BLOCK_N // 8, 4, 2]), 3), 1)


# ``_rescale_lazy``'s PTX. The vote: 1.0 where any row of this warp rescales, else 0.0 (warp-uniform); two rows a
# thread.
_VOTE_ASM = gl.constexpr(
    "{ .reg .pred p, q; setp.neu.f32 p, $2, 0f3F800000; setp.neu.or.f32 p, $3, 0f3F800000, p; "
    "vote.sync.any.pred q, p, 0xffffffff; selp.f32 $0, 0f3F800000, 0f00000000, q; mov.b32 $1, $0; }")


def _rescale_asm(n: int) -> tuple[str, str]:
    """The rescale's PTX and constraints, ``n`` elements an instance (outputs, then acc, alpha and the vote): a copy,
    and the products only where the vote says so. Labels are local to the braces, as CUTLASS's inline waits rely on."""
    copies = " ".join(f"mov.b32 ${i}, ${n + i};" for i in range(n))
    products = " ".join(f"mul.f32 ${i}, ${n + i}, ${2 * n + i};" for i in range(n))
    asm = f"{{ .reg .pred p; {copies} setp.eq.f32 p, ${3 * n}, 0f00000000; @p bra.uni SKIP; {products} SKIP: }}"
    return asm, ",".join(["=f"] * n + ["f"] * (3 * n))


_RESCALE_PACK = gl.constexpr(16)
_RESCALE_ASM, _RESCALE_CONSTRAINTS = (gl.constexpr(x) for x in _rescale_asm(16))


@gluon.jit
def _rescale_lazy(acc, alpha):
    """``acc * alpha`` (alpha a row, in acc's row layout) with the multiplies skipped by whole warps: a warp whose
    rows all have alpha == 1 (``_softmax_tile``'s LAZY: m did not move) branches around its 32 FMULs a thread (64 x 64
    tile). The decision is the warp's vote, so the branch never diverges; the products are the plain ones."""
    need = gl.inline_asm_elementwise(_VOTE_ASM, "=f,=f,f,f", [alpha], dtype=gl.float32, is_pure=False, pack=2)
    return gl.inline_asm_elementwise(_RESCALE_ASM, _RESCALE_CONSTRAINTS,
                                     [acc, gl.expand_dims(alpha, 1), gl.expand_dims(need, 1)], dtype=gl.float32,
                                     is_pure=True, pack=_RESCALE_PACK)


@gluon.jit
def _to_16bit(x, dtype: gl.constexpr, PACK: gl.constexpr):
    """fp32 ``x`` as ``dtype`` (bf16 or fp16). PACK: two neighbouring elements of a thread (one 32-bit P V operand
    register) rounded by one ``cvt.rn.{bf16,f16}x2.f32``, the first in the low half. The one-warpgroup forward carries
    P across key tiles as 16-bit values; converted one by one, ptxas packs each pair the wrong way round and swaps
    the halves with a PRMT before the MMA (16 a tile at 64 x 64, sm_90a SASS, session 42)."""
    if PACK:
        if dtype == gl.bfloat16:
            return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.bfloat16,
                                             is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=gl.float16,
                                             is_pure=True, pack=2)
    else:
        return x.to(dtype)


@gluon.jit
def _fold_head(x, FOLD: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Batch-head ``x`` as the first and last coordinates of a tile in a ``head_desc`` descriptor: (x, 0), or with
    FOLD heads side by side in each row (``flash_triton._folded``) its batch and its head's first column."""
    if FOLD:
        return x // FOLD, (x % FOLD) * HEAD_DIM
    else:
        return x, 0


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, tile, n_tiles, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, base, kv_head, FOLD: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Start the TMA loads of key/value tile ``tile`` of key/value head ``kv_head`` into its ring stage (nothing past
    the last tile); ``base``: tiles through the ring before this query tile's first. Descriptors over all heads
    (``forward_descs``), ring buffers of shape (STAGES, 1, BLOCK_N, HEAD_DIM); FOLD, HEAD_DIM: as in
    ``_fold_head``."""
    stage = (base + tile) % STAGES
    pred = tile < n_tiles
    outer, col = _fold_head(kv_head, FOLD, HEAD_DIM)
    coord = [outer, tile * BLOCK_N, col]
    mbarrier.expect(k_bars.index(stage), k_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, coord, k_bars.index(stage), k_smem.index(stage), pred=pred)
    mbarrier.expect(v_bars.index(stage), v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(v_desc, coord, v_bars.index(stage), v_smem.index(stage), pred=pred)


@gluon.jit
def _stage_tile(ring, stage, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """A ring stage as the (BLOCK_N, HEAD_DIM) operand of a warpgroup MMA."""
    return ring.index(stage).reshape([BLOCK_N, HEAD_DIM])


@gluon.jit
def _attend_step(j, q, k_smem, v_smem, k_bars, v_bars, empty_bars, k_desc, v_desc, offs_m, p, alpha, acc, l_i, m_i,
                 c_i, s_init, n_tiles, n_full, N_K, qk_scale, MASK: gl.constexpr, CARRY16: gl.constexpr,
                 BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                 WARPS: gl.constexpr, RELEASE: gl.constexpr, LEAN: gl.constexpr, base, kv_head, FOLD: gl.constexpr,
                 PACK_P: gl.constexpr = False, LEAN_L: gl.constexpr = False, LAZY: gl.constexpr = 0):
    """Key tile j >= 1 of ``_attend``: issue S_j and P_{j-1} V_{j-1}, wait for S_j only, softmax of tile j while
    P V runs (MASK 0: no mask, 1: masked, 2: masked from tile ``n_full`` on), then wait for P V and release or
    refill stage j - 1. ``p``: P_{j-1}, the 16-bit P V operand (CARRY16) or fp32; returns P_j the same way, its
    rescale factor, O, l, m and c (``_softmax_tile``)."""
    dtype: gl.constexpr = q.dtype
    row_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_init.type.layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    stage = (base + j) % STAGES
    prev = (base + j - 1) % STAGES
    mbarrier.wait(k_bars.index(stage), ((base + j) // STAGES) & 1)
    s_tok = warpgroup_mma(q, _stage_tile(k_smem, stage, BLOCK_N, HEAD_DIM).permute((1, 0)), s_init,
                          use_acc=False, is_async=True)
    mbarrier.wait(v_bars.index(prev), ((base + j - 1) // STAGES) & 1)
    if LAZY > 0:
        acc = _rescale_lazy(acc, gl.convert_layout(alpha, row_o))
    else:
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
    if CARRY16:
        p_op = p
    else:
        p_op = gl.convert_layout(p.to(dtype), p_layout)
    acc_tok = warpgroup_mma(p_op, _stage_tile(v_smem, prev, BLOCK_N, HEAD_DIM), acc, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s_tok, ))  # S_j is done; P_{j-1} V_{j-1} may still run
    if RELEASE:
        _release(empty_bars.index(stage), LEAN)
    if MASK == 2:
        if j < n_full:
            p, alpha, l_i, m_i, c_i = _softmax_tile(s, m_i, l_i, c_i, offs_m, j * BLOCK_N, N_K, qk_scale, BLOCK_N,
                                                    col_s, False, CAUSAL, LEAN_L, LAZY, dtype)
        else:
            p, alpha, l_i, m_i, c_i = _softmax_tile(s, m_i, l_i, c_i, offs_m, j * BLOCK_N, N_K, qk_scale, BLOCK_N,
                                                    col_s, True, CAUSAL, LEAN_L, LAZY, dtype)
    else:
        p, alpha, l_i, m_i, c_i = _softmax_tile(s, m_i, l_i, c_i, offs_m, j * BLOCK_N, N_K, qk_scale, BLOCK_N, col_s,
                                                MASK == 1, CAUSAL, LEAN_L, LAZY, dtype)
    if CARRY16:
        p = gl.convert_layout(_to_16bit(p, dtype, PACK_P), p_layout)  # while P_{j-1} V_{j-1} runs
        acc, p_op = warpgroup_mma_wait(0, deps=(acc_tok, p_op))  # P_{j-1}'s registers stay the MMA's until here
    else:
        acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
    if RELEASE:
        _release(empty_bars.index(STAGES + prev), LEAN)
    else:
        if WARPS > 4:  # the other warpgroup may still be reading the stage about to be refilled
            gl.thread_barrier()
        _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, j - 1 + STAGES, n_tiles, BLOCK_N, STAGES, base,
                 kv_head, FOLD, HEAD_DIM)
    return p, alpha, acc, l_i, m_i, c_i


@gluon.jit
def _attend(q, k_smem, v_smem, k_bars, v_bars, empty_bars, k_desc, v_desc, offs_m, n_tiles, n_full, N_K, qk_scale,
            ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
            STAGES: gl.constexpr, WARPS: gl.constexpr, RELEASE: gl.constexpr, LEAN: gl.constexpr, base, kv_head,
            FOLD: gl.constexpr, PACK_P: gl.constexpr = False, LEAN_L: gl.constexpr = False,
            LAZY: gl.constexpr = 0):
    """The key-tile loop of ``ROWS`` query rows (Q in shared memory ``q``, offs_m in the S rows' layout): O not yet
    normalised, l and m in the S rows' layout. A stage whose MMAs have completed is refilled with the tile
    ``STAGES`` ahead (RELEASE False: these warps issue the loads) or released to a producer (RELEASE True) through
    the mbarriers in ``empty_bars``: K's half of a stage (index ``stage``) as soon as S has been computed from it, V's
    (``STAGES + stage``) after P V, so that the next K tile can arrive while this tile's P V runs. LEAN: releases
    (RELEASE True) without the warpgroup barrier Gluon puts before them (``_release``). ``base``, ``kv_head``, FOLD:
    as in ``_load_kv``. PACK_P: the 16-bit P by packed conversions (``_to_16bit``; RELEASE False only). LEAN_L: l
    kept in per-thread parts through the loop (``_row_partials``), no shuffles a tile for its sum (the kernels'
    ``_normalise`` then scales O by 1 / l as well). LAZY > 0: m moves only past that threshold (``_softmax_tile``) and
    O's rescale is skipped by warps whose rows kept theirs (``_rescale_lazy``); returns O, l, m and c, O's
    denominator l + c (c stays 0 without LAZY).

    Where these warps also load (RELEASE False: the one-warpgroup kernels, whose registers set how many programs
    share an SM), the tiles that need no mask run in a loop of their own before the masked ones, and P crosses from
    one tile to the next as the 16-bit P V operand: 128 registers a thread instead of 164 for the persistent 64 x 64
    tile, 168 instead of 210 for 64 x 128 (H100: 2-4% faster at head dim 64 and 512 tokens, within the noise at
    2,048). The warp-specialised consumers keep one loop and an fp32 P (the split form ran them 2-8% slower)."""
    dtype: gl.constexpr = q.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_s)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    s_init = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    if LEAN_L:
        l_i = _row_partials(s_init, BLOCK_N)
    else:
        l_i = gl.full([ROWS], 0.0, gl.float32, row_s)
    c_i = gl.full([ROWS], 0.0, gl.float32, row_s)

    # tile 0: S alone
    mbarrier.wait(k_bars.index(base % STAGES), (base // STAGES) & 1)
    s = warpgroup_mma(q, _stage_tile(k_smem, base % STAGES, BLOCK_N, HEAD_DIM).permute((1, 0)), s_init,
                      use_acc=False)
    if RELEASE:
        _release(empty_bars.index(base % STAGES), LEAN)
    if n_full > 0:
        p, alpha, l_i, m_i, c_i = _softmax_tile(s, m_i, l_i, c_i, offs_m, 0, N_K, qk_scale, BLOCK_N, col_s, False,
                                                CAUSAL, LEAN_L, LAZY, dtype)
    else:
        p, alpha, l_i, m_i, c_i = _softmax_tile(s, m_i, l_i, c_i, offs_m, 0, N_K, qk_scale, BLOCK_N, col_s, True,
                                                CAUSAL, LEAN_L, LAZY, dtype)

    if RELEASE:
        for j in range(1, n_tiles):
            p, alpha, acc, l_i, m_i, c_i = _attend_step(j, q, k_smem, v_smem, k_bars, v_bars, empty_bars, k_desc,
                                                        v_desc, offs_m, p, alpha, acc, l_i, m_i, c_i, s_init, n_tiles,
                                                        n_full, N_K, qk_scale, 2, False, BLOCK_N, HEAD_DIM, CAUSAL,
                                                        STAGES, WARPS, RELEASE, LEAN, base, kv_head, FOLD, False,
                                                        LEAN_L, LAZY)
        p = gl.convert_layout(p.to(dtype), p_layout)
    else:
        p = gl.convert_layout(_to_16bit(p, dtype, PACK_P), p_layout)
        for j in range(1, n_full):
            p, alpha, acc, l_i, m_i, c_i = _attend_step(j, q, k_smem, v_smem, k_bars, v_bars, empty_bars, k_desc,
                                                        v_desc, offs_m, p, alpha, acc, l_i, m_i, c_i, s_init, n_tiles,
                                                        n_full, N_K, qk_scale, 0, True, BLOCK_N, HEAD_DIM, CAUSAL,
                                                        STAGES, WARPS, RELEASE, LEAN, base, kv_head, FOLD, PACK_P,
                                                        LEAN_L, LAZY)
        for j in range(gl.maximum(n_full, 1), n_tiles):
            p, alpha, acc, l_i, m_i, c_i = _attend_step(j, q, k_smem, v_smem, k_bars, v_bars, empty_bars, k_desc,
                                                        v_desc, offs_m, p, alpha, acc, l_i, m_i, c_i, s_init, n_tiles,
                                                        n_full, N_K, qk_scale, 1, True, BLOCK_N, HEAD_DIM, CAUSAL,
                                                        STAGES, WARPS, RELEASE, LEAN, base, kv_head, FOLD, PACK_P,
                                                        LEAN_L, LAZY)

    last = base + n_tiles - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
    acc = warpgroup_mma(p, _stage_tile(v_smem, last % STAGES, BLOCK_N, HEAD_DIM), acc)
    if RELEASE:  # a persistent producer refills this stage with the next item's tiles
        _release(empty_bars.index(STAGES + last % STAGES), LEAN)
    if LEAN_L:
        l_i = gl.convert_layout(gl.sum(l_i, 1), row_s)
    return acc, l_i, m_i, c_i


@gluon.jit
def _ring_barriers(STAGES: gl.constexpr):
    """Initialised mbarriers of the one-warpgroup forward: Q's, and one per K and V ring stage."""
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    return q_bar, k_bars, v_bars


@gluon.jit
def _key_tiles(start_m, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """The key tiles a query tile from row ``start_m`` reads, and how many of them need no mask (wholly left of
    the diagonal and inside N_K)."""
    if CAUSAL:
        hi = gl.minimum(N_K, start_m + BLOCK_M)
        n_full = gl.minimum(start_m + 1, N_K) // BLOCK_N
    else:
        hi = N_K
        n_full = N_K // BLOCK_N
    return gl.cdiv(hi, BLOCK_N), n_full


@gluon.jit
def _normalise(acc, l_i, m_i, c_i, L, bh, offs_m, N_Q, RECIPROCAL: gl.constexpr, LAZY: gl.constexpr):
    """The key loop's end (``_attend``'s O, l, m and c) for head ``bh``: stores L = m + log2(l) in natural log for the
    rows below N_Q and returns O = acc / l, where LAZY makes l + c O's denominator (``_softmax_tile``). RECIPROCAL:
    acc times 1 / l, one division a row instead of one an element (89 fewer SASS instructions an item at 64 x 64;
    within an fp32 rounding of the quotient)."""
    row_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    gl.store(L + bh * N_Q + offs_m, (m_i + gl.log2(l_i)) * LN2, mask=offs_m < N_Q)
    if LAZY:
        l_i = l_i + c_i
    if RECIPROCAL:
        acc = acc * gl.expand_dims(gl.convert_layout(1.0 / l_i, row_o), 1)
    else:
        acc = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    return acc


@gluon.jit
def _finish(acc, l_i, m_i, q, o_desc, L, bh, row0, offs_m, N_Q, FOLD: gl.constexpr, RECIPROCAL: gl.constexpr = False):
    """O (``_normalise``) through Q's (1, rows, HEAD_DIM) buffer (free: every MMA that read it has completed) and a
    TMA store of head ``bh`` (FOLD as in ``_fold_head``) that clips rows past N_Q."""
    acc = _normalise(acc, l_i, m_i, 0.0, L, bh, offs_m, N_Q, RECIPROCAL, False)
    q.reshape([acc.shape[0], acc.shape[1]]).store(acc.to(q.dtype))
    fence_async_shared()
    outer, col = _fold_head(bh, FOLD, acc.shape[1])
    tma.async_copy_shared_to_global(o_desc, [outer, row0, col], q)
    tma.store_wait(pendings=0)


@gluon.jit
def _item_head(w, n_tiles, HEADS, interleave):
    """The head and tile of persistent work item ``w`` of ``HEADS`` heads with ``n_tiles`` tiles each: heads in groups
    of ``interleave`` (the last group takes the heads left), a group's items tile by tile across its heads; 1: each
    head's tiles in a row. The heads of the groups in flight are what the running items share in L2."""
    grp = w // (n_tiles * interleave)
    first = grp * interleave
    size = gl.minimum(HEADS - first, interleave)
    r = w - grp * (n_tiles * interleave)
    tile = r // size
    return first + (r - tile * size), tile


@gluon.jit
def _item_coords(w, n_mt, N_K, GROUP, HEADS, interleave, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr):
    """Item ``w``'s batch x head, key/value head, first query row and key tiles: heads in groups (``_item_head``;
    their K and V stay in L2 while their tiles run) and, causal, the longest tiles first."""
    bh, pid_m = _item_head(w, n_mt, HEADS, interleave)
    if CAUSAL:
        pid_m = n_mt - 1 - pid_m
    start_m = pid_m * BLOCK_M
    n_tiles, _ = _key_tiles(start_m, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    return bh, bh // GROUP, start_m, n_tiles


@gluon.jit
def _hopper_fwd_persistent_kernel(Q, K, V, O, L, DOC, SPAN, stride_qb, stride_qm, stride_qd, stride_kb, stride_kn,
                                  stride_kd, stride_vb, stride_vn, stride_vd, stride_ob, stride_om, stride_od, N_Q, N_K,
                                  GROUP, HEADS, INTERLEAVE, RIGHT, qk_scale, HEAD_DIM: gl.constexpr,
                                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                                  STAGES: gl.constexpr, FOLD_Q: gl.constexpr = 0, FOLD_KV: gl.constexpr = 0,
                                  PERSISTENT: gl.constexpr = True, PACK_P: gl.constexpr = False,
                                  LEAN_L: gl.constexpr = False):
    """One warpgroup's forward over (query tile, batch x head) work items: as many programs as the GPU holds, items
    taken from a counter in ``_item_coords``' order, the K/V ring's stages and phases running on across items
    (PERSISTENT; else a program per item, where one wave holds them all). Q, K, V, O: host descriptors
    (``forward_descs``: (batch x heads, rows, head dim), FOLD_Q, FOLD_KV as in ``_fold_head``). HEADS: batch x query
    heads; INTERLEAVE (the window's left side in the Triton kernel, which this one has no use for) the heads a group
    of items spans (``_item_head``; 0 reads as 1); DOC the counter's int32 pair (next item, finished programs), zero
    at launch: the last program to finish zeroes it again, so the next launch on the stream finds it zero (no memset
    per call). SPAN, RIGHT and the strides (in the descriptors) are unused. PACK_P, LEAN_L: as in ``_attend`` (3%
    and 2.5% fewer instructions in the key loop, LEAN_L also O's reciprocal in ``_normalise``; the planner passes
    ``LEAN_SOFTMAX``). The skipped rescales (``_attend``'s LAZY) cost more here than they save:
    experiments/flash_fwd_lazy_rescale/."""
    NUM_WARPS: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = Q.dtype
    smem: gl.constexpr = Q.layout
    q_desc, k_desc, v_desc, o_desc = Q, K, V, O
    q_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_M, HEAD_DIM], smem)
    q_tile = q_smem.reshape([BLOCK_M, HEAD_DIM])
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], smem)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], smem)
    q_bar, k_bars, v_bars = _ring_barriers(STAGES)
    row_s: gl.constexpr = gl.SliceLayout(1, gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                                      instr_shape=[16, BLOCK_N, 16]))
    n_mt = gl.cdiv(N_Q, BLOCK_M)
    n_items = HEADS * n_mt
    interleave = gl.maximum(INTERLEAVE, 1)
    counter = DOC.to(gl.pointer_type(gl.int32))
    base = 0  # key/value tiles through the ring before this item's
    item = 0
    w = _ticket(counter, n_items, True, PERSISTENT)
    while w < n_items:
        bh, bkv, start_m, n_tiles = _item_coords(w, n_mt, N_K, GROUP, HEADS, interleave, BLOCK_M, BLOCK_N, CAUSAL)
        n_full = _key_tiles(start_m, N_K, BLOCK_M, BLOCK_N, CAUSAL)[1]
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        qb, qc = _fold_head(bh, FOLD_Q, HEAD_DIM)
        tma.async_copy_global_to_shared(q_desc, [qb, start_m, qc], q_bar, q_smem)
        for i in gl.static_range(STAGES):
            _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i, n_tiles, BLOCK_N, STAGES, base, bkv, FOLD_KV,
                     HEAD_DIM)
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_s)
        mbarrier.wait(q_bar, item & 1)
        acc, l_i, m_i, _ = _attend(q_tile, k_smem, v_smem, k_bars, v_bars, k_bars, k_desc, v_desc, offs_m, n_tiles,
                                   n_full, N_K, qk_scale, BLOCK_M, HEAD_DIM, BLOCK_N, CAUSAL, STAGES, NUM_WARPS, False,
                                   0, base, bkv, FOLD_KV, PACK_P, LEAN_L)
        if NUM_WARPS > 4:  # both warpgroups are done with Q's buffer before it takes O
            gl.thread_barrier()
        _finish(acc, l_i, m_i, q_smem, o_desc, L, bh, start_m, offs_m, N_Q, FOLD_Q, LEAN_L)
        gl.thread_barrier()  # O has left Q's buffer before the next item's Q arrives in it
        base += n_tiles
        item += 1
        w = _ticket(counter, n_items, False, PERSISTENT)
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    _reset_counter(counter, PERSISTENT)


@gluon.jit
def _ticket(counter, n_items, first: gl.constexpr, PERSISTENT: gl.constexpr):
    """A program's next work item: drawn from the counter (PERSISTENT), else its own first and then none."""
    if PERSISTENT:
        w = gl.atomic_add(counter, 1, sem="relaxed")
    elif first:
        w = gl.program_id(0)
    else:
        w = n_items
    return w


@gluon.jit
def _reset_counter(counter, PERSISTENT: gl.constexpr):
    """Every program has drawn its last ticket before it counts itself finished: the last one resets the pair."""
    if PERSISTENT:  # noqa: SIM102  (a compile-time branch around a run-time one)
        if gl.atomic_add(counter + 1, 1, sem="acq_rel") == gl.num_programs(0) - 1:
            gl.atomic_xchg(counter, 0, sem="relaxed")
            gl.atomic_xchg(counter + 1, 0, sem="relaxed")


# Warp-specialised form: two consumer warpgroups (64 query rows each) share the K/V ring that one producer warp
# fills, as in FlashAttention-3's forward: no CTA-wide barrier in the loop, a stage's K (V) tile is refilled once
# both consumers have released it (an mbarrier of count 2 each), and the producer runs ahead of both. Releasing K
# and V apart lets 128-key tiles run with two stages (1.05-1.19x faster than 64-key tiles with three at head dim
# 128, H100, session 19); turns between the consumers (FlashAttention-3's ping-pong) gained 1% at 2 x 32 x 32,768
# and lost 3% at 8 x 16 x 2,048 (docs/flash_tuning_notes.md).
@gluon.jit
def _ws_barriers(STAGES: gl.constexpr):
    """Initialised mbarriers of the warp-specialised forwards: one per consumer's Q rows, one per K and V ring stage,
    and each stage's two release barriers (K's, then V's: index ``stage`` and ``STAGES + stage``) of count 2, one
    arrival per consumer warpgroup."""
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)
        mbarrier.init(empty_bars.index(STAGES + i), count=2)
    return q_bars, k_bars, v_bars, empty_bars


# Persistent warp-specialised form: the two consumers and the producer stay resident and take (query tile, head) items
# in turn; the producer draws each item from the counter and hands it to the consumers through shared memory with the
# item's Q load, and fills the K/V ring across items, so the next item's Q and first key tiles arrive while the
# consumers finish the current one (its O leaves through a buffer of its own).
@gluon.jit
def _wsp_producer(counter, item_buf, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_bars, v_bars,
                  empty_bars, n_items, n_mt, N_K, GROUP, interleave, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, FOLD_Q: gl.constexpr,
                  FOLD_KV: gl.constexpr, PERSISTENT: gl.constexpr):
    """One warp: per item, once both consumers are done with their Q rows, the item's number into ``item_buf`` and
    the two Q halves (the barrier's arrival publishes the number), then the item's K and V tiles through the ring;
    after the last item, the number ``n_items`` and a plain arrival, which ends the consumers."""
    ROWS: gl.constexpr = BLOCK_M // 2
    vec: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    base = 0
    i = 0
    w = _ticket(counter, n_items, True, PERSISTENT)
    while w < n_items:
        bh, bkv, start_m, n_tiles = _item_coords(w, n_mt, N_K, GROUP, n_items // n_mt, interleave, BLOCK_M,
                                                 BLOCK_N, CAUSAL)
        for h in gl.static_range(2):
            mbarrier.wait(q_empty.index(h), (i & 1) ^ 1, pred=i > 0)
        item_buf.store(gl.full([32], w, gl.int32, vec))
        gl.thread_barrier()  # every lane's store precedes the arrivals (made by one lane)
        qb, qc = _fold_head(bh, FOLD_Q, HEAD_DIM)
        kb, kc = _fold_head(bkv, FOLD_KV, HEAD_DIM)
        for h in gl.static_range(2):
            mbarrier.expect(q_bars.index(h), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [qb, start_m + h * ROWS, qc], q_bars.index(h), q_smem.index(h))
        for t in range(base, base + n_tiles):
            stage = t % STAGES
            coord = [kb, (t - base) * BLOCK_N, kc]
            mbarrier.wait(empty_bars.index(stage), ((t // STAGES) & 1) ^ 1, pred=t >= STAGES)  # K's half
            mbarrier.expect(k_bars.index(stage), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, coord, k_bars.index(stage), k_smem.index(stage))
            mbarrier.wait(empty_bars.index(STAGES + stage), ((t // STAGES) & 1) ^ 1, pred=t >= STAGES)  # V's half
            mbarrier.expect(v_bars.index(stage), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, coord, v_bars.index(stage), v_smem.index(stage))
        base += n_tiles
        i += 1
        w = _ticket(counter, n_items, False, PERSISTENT)
    for h in gl.static_range(2):
        mbarrier.wait(q_empty.index(h), (i & 1) ^ 1, pred=i > 0)
    item_buf.store(gl.full([32], n_items, gl.int32, vec))
    gl.thread_barrier()
    for h in gl.static_range(2):
        mbarrier.arrive(q_bars.index(h))


@gluon.jit
def _item(item_buf, vec: gl.constexpr, LEAN: gl.constexpr):
    """The item number the producer published in ``item_buf``. LEAN: a warpgroup barrier after the read, once an
    item, so that no shared-memory read is pending in the key loop and ``ptx_release`` can drop the barrier that
    Triton puts before each tile's K wait (``ptx_release.drop_quiet_barriers``)."""
    w = gl.max(item_buf.load(vec), 0)
    if LEAN:
        gl.thread_barrier()
    return w


@gluon.jit
def _wsp_consumer(o_desc, L, item_buf, q_smem, o_smem, k_smem, v_smem, q_bars, q_empty, k_bars, v_bars, empty_bars,
                  n_items, n_mt, N_Q, N_K, GROUP, interleave, qk_scale, WG: gl.constexpr, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
                  FOLD_Q: gl.constexpr, LEAN: gl.constexpr, LEAN_L: gl.constexpr = False, LAZY: gl.constexpr = 0):
    """One warpgroup's 64 query rows of each item the producer hands over: ``_attend`` on the ring, Q's rows
    released as soon as its last matmul is done, O through this warpgroup's own buffer (the previous item's store
    finished first). LEAN (nonzero: ``ptx_release.VERSION``): releases without the warpgroup barrier (``_release``).
    LEAN_L: l in per-thread parts through the key loop and O scaled by 1 / l (``_attend``, ``_normalise``). LAZY: the
    skipped rescales' threshold (``_attend``; 0 off)."""
    ROWS: gl.constexpr = BLOCK_M // 2
    vec: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    row_s: gl.constexpr = gl.SliceLayout(1, gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                      instr_shape=[16, BLOCK_N, 16]))
    q = q_smem.index(WG).reshape([ROWS, HEAD_DIM])
    o = o_smem.index(WG)
    base = 0
    i = 0
    mbarrier.wait(q_bars.index(WG), 0)
    w = _item(item_buf, vec, LEAN)
    while w < n_items:
        bh, bkv, start_m, n_tiles = _item_coords(w, n_mt, N_K, GROUP, n_items // n_mt, interleave, BLOCK_M,
                                                 BLOCK_N, CAUSAL)
        row0 = start_m + WG * ROWS
        if CAUSAL:
            n_full = gl.minimum(row0 + 1, N_K) // BLOCK_N
        else:
            n_full = N_K // BLOCK_N
        offs_m = row0 + gl.arange(0, ROWS, layout=row_s)
        # the producer loads: the ring's coordinates are its
        acc, l_i, m_i, c_i = _attend(q, k_smem, v_smem, k_bars, v_bars, empty_bars, o_desc, o_desc, offs_m,
                                     n_tiles, n_full, N_K, qk_scale, ROWS, HEAD_DIM, BLOCK_N, CAUSAL, STAGES, 4, True,
                                     LEAN, base, bkv, 0, False, LEAN_L, LAZY)
        _release(q_empty.index(WG), LEAN)  # every matmul that read Q has completed
        acc = _normalise(acc, l_i, m_i, c_i, L, bh, offs_m, N_Q, LEAN_L, LAZY > 0)
        tma.store_wait(pendings=0)  # the previous item's O has left the buffer
        o.reshape([ROWS, HEAD_DIM]).store(acc.to(o.dtype))
        fence_async_shared()
        ob, oc = _fold_head(bh, FOLD_Q, HEAD_DIM)
        tma.async_copy_shared_to_global(o_desc, [ob, row0, oc], o)
        base += n_tiles
        i += 1
        mbarrier.wait(q_bars.index(WG), i & 1)
        w = _item(item_buf, vec, LEAN)
    tma.store_wait(pendings=0)


@gluon.jit
def _hopper_fwd_ws_persistent_kernel(Q, K, V, O, L, DOC, SPAN, stride_qb, stride_qm, stride_qd, stride_kb, stride_kn,
                                     stride_kd, stride_vb, stride_vn, stride_vd, stride_ob, stride_om, stride_od, N_Q,
                                     N_K, GROUP, HEADS, INTERLEAVE, RIGHT, qk_scale, HEAD_DIM: gl.constexpr,
                                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                                     STAGES: gl.constexpr, FOLD_Q: gl.constexpr = 0, FOLD_KV: gl.constexpr = 0,
                                     PERSISTENT: gl.constexpr = True, LEAN: gl.constexpr = 0,
                                     LEAN_L: gl.constexpr = False, LAZY_RESCALE: gl.constexpr = 0):
    """``_hopper_fwd_persistent_kernel``'s arguments (Q and O descriptors of 64-row tiles, a consumer's) with the
    warp-specialised partitions: two consumer warpgroups, a producer warp (launch with 4 warps, BLOCK_M 128). LEAN
    (``ptx_release.VERSION``, or 0): the consumers release ring stages and Q without a warpgroup barrier (needs
    ``ptx_release``'s rewrite, ``ptx_release.active()``). LEAN_L: the consumers' l in per-thread parts and O scaled
    by 1 / l (``_wsp_consumer``; the planner passes ``LEAN_SOFTMAX``). LAZY_RESCALE: the consumers' skipped rescales
    (``_attend``'s LAZY; 0 off; the planner passes ``RESCALE_THRESHOLD`` at ``WS_RESCALE_HEAD_DIMS``)."""
    ROWS: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = Q.dtype
    smem: gl.constexpr = Q.layout
    q_desc, k_desc, v_desc, o_desc = Q, K, V, O
    q_smem = gl.allocate_shared_memory(dtype, [2, 1, ROWS, HEAD_DIM], smem)
    o_smem = gl.allocate_shared_memory(dtype, [2, 1, ROWS, HEAD_DIM], smem)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], smem)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, HEAD_DIM], smem)
    item_buf = gl.allocate_shared_memory(gl.int32, [32], gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                                                                 order=[0]))
    q_bars, k_bars, v_bars, empty_bars = _ws_barriers(STAGES)
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_empty.index(i), count=1)
    n_mt = gl.cdiv(N_Q, BLOCK_M)
    n_items = HEADS * n_mt
    interleave = gl.maximum(INTERLEAVE, 1)
    counter = DOC.to(gl.pointer_type(gl.int32))
    gl.warp_specialize([
        (_wsp_consumer, (o_desc, L, item_buf, q_smem, o_smem, k_smem, v_smem, q_bars, q_empty, k_bars, v_bars,
                         empty_bars, n_items, n_mt, N_Q, N_K, GROUP, interleave, qk_scale, 0, HEAD_DIM, BLOCK_M,
                         BLOCK_N, CAUSAL, STAGES, FOLD_Q, LEAN, LEAN_L, LAZY_RESCALE)),
        (_wsp_consumer, (o_desc, L, item_buf, q_smem, o_smem, k_smem, v_smem, q_bars, q_empty, k_bars, v_bars,
                         empty_bars, n_items, n_mt, N_Q, N_K, GROUP, interleave, qk_scale, 1, HEAD_DIM, BLOCK_M,
                         BLOCK_N, CAUSAL, STAGES, FOLD_Q, LEAN, LEAN_L, LAZY_RESCALE)),
        (_wsp_producer, (counter, item_buf, q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_bars,
                         v_bars, empty_bars, n_items, n_mt, N_K, GROUP, interleave, BLOCK_M, BLOCK_N, STAGES, CAUSAL,
                         HEAD_DIM, FOLD_Q, FOLD_KV, PERSISTENT)),
    ], [4, 1], [240, 24])
    _reset_counter(counter, PERSISTENT)


ptx_release.register(_hopper_fwd_ws_persistent_kernel)
