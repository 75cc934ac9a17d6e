# ruff: noqa: E741  (O, the attention output, is the handout's name)
"""FlashAttention-2 in Triton: a fused forward kernel and a five-matmul backward.

Layering (as in the flash-attention repo and the Triton tutorials): ``@triton.jit`` kernels ->
launchers that validate inputs (``ValueError``) and pick tiles -> ``FlashAttention2Triton``
(``autograd.Function``; under ``torch.compile`` the launchers run behind ``torch.library`` custom ops,
eagerly they are called directly) -> ``flash_attention_triton``.

Forward (handout Algorithm 1): grid (query tiles, batch x heads); each program keeps fp32 running max,
denominator and output tile on chip and makes one pass over key tiles. Scores are kept in log2 units:
log2(e) is folded into the softmax scale so the exponentials are ``exp2``; the saved logsumexp L is
converted back to natural log (the course tests compare it with ``logsumexp``).

Backward (equations 13-19), FlashAttention-2's five matmuls per tile pair: a preprocessing kernel
computes D = rowsum(O * dO) (and zeroes an fp32 dQ accumulator); one kernel owns a key tile, walks the
query tiles that see it, accumulates dK and dV on chip and adds each tile's dS K into the dQ accumulator
with atomics (a TMA reduce-add on Hopper, as FlashAttention-3 does); a postprocessing kernel scales and
casts dQ. ``deterministic=True`` (or ``torch.use_deterministic_algorithms(True)``) instead runs a
separate dQ kernel that owns a query tile and recomputes P (seven matmuls, no atomics, bitwise
reproducible); the config table makes that pair the default where it measured faster (``atomic_dq=False``:
head dim 128 in 16-bit dtypes, whose fp32 dQ reduce-adds cost more than the two extra matmuls). Small calls
(``single_max_programs``) run the whole backward as one kernel: a program per key tile computes its dK, dV and
one per query tile its dQ, with D from the O and dO tiles (one launch instead of three, where launches are the
cost; an autograd.Function's eager call outside CUDA graph capture up to ``eager_single_max_pairs``, since the
host's time is what it costs, and with dQ, dK and dV from one allocation; ``captured_forms()`` plans such calls as
captured ones); and small forwards (``small_fwd``) take tiles of their own: one-warpgroup Gluon tiles where the
Gluon forward runs, block pointers in the Triton forward elsewhere (a short program does not amortise tensor
descriptors built on the device, which the Triton kernels' TMA form builds; docs/flash_tuning_notes.md, sessions 36
and 39).

Hopper (sm_90): where a call is in their scope (``_in_hopper_scope``: 16-bit, head dim 64/128, full or causal,
no documents), the planner launches the Gluon kernels of ``flash_hopper`` (forward) and ``flash_hopper_bwd`` (the
atomic-dQ middle kernel) instead, with the same arguments; ``deterministic=True`` keeps the Triton kernels.

Host path: everything that follows from a call's layout (checks, strides, grid, compiled kernel) is planned
once per layout (``_plan_for``); after its first launch a kernel is called through the compiled module's C
launcher (``_Launch``), so a small forward+backward costs two launches and little Python. The Gluon kernels' TMA
descriptors are described per plan (``flash_hopper.HostDesc``) and encoded on the host once per tensor address.

Causal (top-left aligned: query i sees keys 0..i, also when Nq != Nk): tiles entirely above the diagonal
are never visited; tiles entirely below it run a loop with no index comparisons; only tiles crossing the
diagonal (or the end of the sequence) are masked. Causal programs are launched heaviest first.

Features (``flash_attention``): grouped-query heads (a program reads key/value head bh // GROUP; the dK/dV
program of a key/value head loops over its group's query heads, no atomics), sliding windows
``(left, right)`` and packed documents (``doc_ids``). ``_tile_ranges`` gives every program the tiles that hold
a visible pair (masked edge runs, an unmasked middle run); the others are never loaded. Causal is a window's
right side of 0. Documents: per-position document bounds computed on the device (``_doc_span``) narrow the
ranges where a sequence's ids are sorted; ids are compared only in masked tiles.

One kernel per pass, two ways to address memory (``TMA`` constexpr, chosen per launch): tensor
descriptors (``tl.make_tensor_descriptor``, built on the device per program and batch-head: loads and
stores through Hopper's TMA unit, out-of-bounds rows zero-filled and clipped) where the tensors allow it
(unit stride along d, 16-byte aligned bases and strides, sm_90+), else block pointers (any strides; any
GPU; the CPU interpreter). ``_tile_src`` / ``_load_rows`` / ``_store_rows`` hide the difference.

Supported: Q ``(..., Nq, d)``, K and V ``(..., Nk, d)`` (``flash_attention``: K and V may have fewer heads, dim -3)
with any leading dims (flattened into one
batch x heads grid axis); any Nq, Nk >= 1; head dim 16..256, non-powers of two padded to the next power
of two inside the kernel; fp16, bf16, fp32 (fp32 dots use TF32 unless
``torch.get_float32_matmul_precision() == "highest"``, PyTorch's default, in which case they are IEEE
fp32); non-contiguous inputs and gradients. Not supported (``ValueError``): mismatched head dims, K and V
of different lengths, mixed dtypes or devices, head dims outside 16..256, other dtypes, a non-bool
``is_causal``. CPU tensors run through the Triton interpreter, which needs ``TRITON_INTERPRET=1`` in the
environment before this module is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import weakref

import torch
import triton
import triton.language as tl
from torch import Tensor

from cs336_basics.attention import register_attention_backend
from cs336_systems.attention import _tuning, flash_hopper, flash_hopper_bwd, ptx_release
from cs336_systems.attention._common import (
    check_attention_inputs,
    check_doc_ids,
    check_grad_output,
    check_is_causal,
    check_scale,
    check_window,
    normalize_window,
)
from cs336_systems.attention._tuning import FlashConfig, KernelConfig

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------- kernels
@triton.jit
def _tile_src(X, bh, stride_b, FOLD: tl.constexpr, n_rows, stride_row, stride_d, HEAD_DIM: tl.constexpr,
              BLOCK: tl.constexpr, D_PAD: tl.constexpr, TMA: tl.constexpr):
    """Rows of batch-head ``bh``'s ``(n_rows, HEAD_DIM)`` matrix in ``X`` (its offset: ``_head``), ``BLOCK`` at a
    time: a tensor descriptor (TMA) or a block pointer at row 0. Blocks are ``D_PAD`` wide; columns past HEAD_DIM
    read as zero."""
    base = X + _head(bh, stride_b, FOLD, HEAD_DIM)
    if TMA:
        src = tl.make_tensor_descriptor(base, shape=[n_rows, HEAD_DIM], strides=[stride_row, 1],
                                        block_shape=[BLOCK, D_PAD])
    else:
        src = tl.make_block_ptr(base, shape=(n_rows, HEAD_DIM), strides=(stride_row, stride_d), offsets=(0, 0),
                                block_shape=(BLOCK, D_PAD), order=(1, 0))
    return src


@triton.jit
def _head(bh, stride_b, FOLD: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Element offset of batch-head ``bh``: ``bh * stride_b`` where one stride walks the batch-heads (FOLD 0), or,
    for a (B, H, N, d) view whose H = FOLD heads lie side by side in each row (a (B, N, H, d) tensor transposed:
    head stride d, ``stride_b`` the batch stride), batch ``bh // FOLD`` and head ``bh % FOLD``."""
    if FOLD:
        return (bh // FOLD) * stride_b + (bh % FOLD) * HEAD_DIM
    else:
        return bh * stride_b


@triton.jit
def _load_rows(src, start, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr, TMA: tl.constexpr):
    """The block of rows [start, start + BLOCK), zero past the matrix (descriptors always clip; block
    pointers check only the dimensions that can run past it)."""
    if TMA:
        x = src.load([start, 0])
    else:
        ptr = tl.advance(src, (start, 0))
        if CHECK_ROWS and CHECK_COLS:
            x = tl.load(ptr, boundary_check=(0, 1), padding_option="zero")
        elif CHECK_ROWS:
            x = tl.load(ptr, boundary_check=(0,), padding_option="zero")
        elif CHECK_COLS:
            x = tl.load(ptr, boundary_check=(1,), padding_option="zero")
        else:
            x = tl.load(ptr)
    return x


@triton.jit
def _store_rows(dst, start, x, TMA: tl.constexpr):
    if TMA:
        dst.store([start, 0], x)
    else:
        tl.store(tl.advance(dst, (start, 0)), x, boundary_check=(0, 1))


@triton.jit
def _doc_spans(SPAN, start, n_rows, BLOCK_ROWS: tl.constexpr):
    """Document bounds of the rows [start, start + BLOCK_ROWS) from SPAN (one sequence's ``(2, N)`` int32
    starts and ends of each position's document; -1 where the ids are not sorted): the range of columns some
    row may see and the range every row sees (empty unless the rows lie in one document)."""
    last = tl.minimum(start + BLOCK_ROWS, n_rows) - 1
    first_start = tl.load(SPAN + start)
    known = first_start >= 0
    any_lo = tl.maximum(first_start, 0)
    any_hi = tl.where(known, tl.load(SPAN + n_rows + last), n_rows)
    all_lo = tl.load(SPAN + last)
    all_hi = tl.where(known, tl.load(SPAN + n_rows + start), 0)
    return any_lo, any_hi, all_lo, all_hi


@triton.jit
def _tile_ranges(start, n_rows, N_COLS, LEFT, RIGHT, any_lo, any_hi, all_lo, all_hi, BLOCK_ROWS: tl.constexpr,
                 BLOCK_COLS: tl.constexpr, LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr,
                 HAS_DOCS: tl.constexpr):
    """Rows r in [start, start + BLOCK_ROWS) see columns c with r - LEFT <= c <= r + RIGHT (each side only if
    limited: LIMIT_* is 0 for no limit, else 1 where the side is 0, 2 otherwise) and, with documents, c in their
    document ([any_lo, any_hi) bounds what some row may see, [all_lo, all_hi) what every row sees). Returns
    column tiles ``lo <= full_lo <= full_hi <= hi``: [lo, full_lo) and [full_hi, hi) need the mask,
    [full_lo, full_hi) are visible to every row and lie inside N_COLS; other tiles hold no visible pair and are
    never loaded. Queries over keys (forward, dQ) and, with the sides swapped, keys over queries (dK, dV) use
    it alike."""
    last = tl.minimum(start + BLOCK_ROWS, n_rows) - 1  # rows past n_rows are never stored: ignore them
    lo = 0
    hi = N_COLS
    f_lo = 0
    f_hi = N_COLS
    if LIMIT_LEFT:
        lo = tl.maximum(start - LEFT, 0)
        f_lo = tl.maximum(last - LEFT, 0)
    if LIMIT_RIGHT:
        hi = tl.minimum(last + RIGHT + 1, N_COLS)
        f_hi = tl.minimum(start + RIGHT + 1, N_COLS)
    if HAS_DOCS:
        lo = tl.maximum(lo, any_lo)
        hi = tl.minimum(hi, any_hi)
        f_lo = tl.maximum(f_lo, all_lo)
        f_hi = tl.minimum(f_hi, all_hi)
    lo_t = (lo // BLOCK_COLS) * BLOCK_COLS
    hi_t = tl.where(hi > lo, tl.cdiv(hi, BLOCK_COLS) * BLOCK_COLS, lo_t)  # no visible pair: no tile
    full_lo = tl.minimum(tl.maximum(tl.cdiv(f_lo, BLOCK_COLS) * BLOCK_COLS, lo_t), hi_t)
    full_hi = tl.minimum(tl.maximum((f_hi // BLOCK_COLS) * BLOCK_COLS, full_lo), hi_t)
    return lo_t, full_lo, full_hi, hi_t


@triton.jit
def _tile_plan(DOC, SPAN, batch, start, offs, n_rows, N_COLS, LEFT, RIGHT, BLOCK_ROWS: tl.constexpr,
               BLOCK_COLS: tl.constexpr, LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr):
    """What one program visits, for every kernel: its rows' document ids (a column; 0 without documents), the
    ids of its sequence (rows and columns share them: documents need Nq == Nk) and the column tiles of
    ``_tile_ranges``."""
    doc = DOC
    row_doc = 0
    any_lo = 0
    any_hi = 0
    all_lo = 0
    all_hi = 0
    if HAS_DOCS:
        doc = DOC + batch * n_rows
        row_doc = tl.load(doc + offs, mask=offs < n_rows, other=0)[:, None]
        any_lo, any_hi, all_lo, all_hi = _doc_spans(SPAN + batch * 2 * n_rows, start, n_rows, BLOCK_ROWS)
    lo, full_lo, full_hi, hi = _tile_ranges(start, n_rows, N_COLS, LEFT, RIGHT, any_lo, any_hi, all_lo, all_hi,
                                            BLOCK_ROWS, BLOCK_COLS, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS)
    return doc, row_doc, lo, full_lo, full_hi, hi


@triton.jit
def _visible(offs_q, offs_k, q_doc, k_doc, n_valid, LEFT, RIGHT, LIMIT_LEFT: tl.constexpr,
             LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, KEY_TILE: tl.constexpr):
    """Which (query, key) pairs of a masked tile are visible; the index tensors broadcast to the tile (queries
    along one axis, keys along the other). The tile's own rows past n_valid are not: keys past N_K in a
    program that owns a query tile (``KEY_TILE=False``), queries past N_Q in one that owns a key tile (whose
    own key rows past N_K are zero and never stored)."""
    if KEY_TILE:
        visible = offs_q < n_valid
    else:
        visible = offs_k < n_valid
    if LIMIT_LEFT == 1:
        visible = visible & (offs_k >= offs_q)
    elif LIMIT_LEFT:
        visible = visible & (offs_k >= offs_q - LEFT)
    if LIMIT_RIGHT == 1:  # causal: a compile-time 0 keeps the diagonal tiles' arithmetic as before windows
        visible = visible & (offs_k <= offs_q)
    elif LIMIT_RIGHT:
        visible = visible & (offs_k <= offs_q + RIGHT)
    if HAS_DOCS:
        visible = visible & (q_doc == k_doc)
    return visible


@triton.jit
def _key_tile_visible(offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT, BLOCK_N: tl.constexpr, LIMIT_LEFT: tl.constexpr,
                      LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr):
    """``_visible`` for a program that owns a query tile (rows offs_m, document ids q_doc) at the masked key tile
    [start_n, start_n + BLOCK_N): the forward's and the dQ kernel's masks."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k_doc = 0
    if HAS_DOCS:
        k_doc = tl.load(doc + offs_n, mask=offs_n < N_K, other=0)[None, :]
    return _visible(offs_m[:, None], offs_n[None, :], q_doc, k_doc, N_K, LEFT, RIGHT, LIMIT_LEFT, LIMIT_RIGHT,
                    HAS_DOCS, False)


# Forward ------------------------------------------------------------------------------------------------
@triton.jit
def _fwd_step(acc, l_i, m_i, q, k_src, v_src, offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT, qk_scale,
              BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr, LIMIT_LEFT: tl.constexpr,
              LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One key tile of the online softmax (Algorithm 1, lines 8-13)."""
    k = _load_rows(k_src, start_n, MASKED, not EVEN_D, TMA)
    qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # (BLOCK_M, BLOCK_N), fp32
    if MASKED:
        visible = _key_tile_visible(offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT, BLOCK_N, LIMIT_LEFT, LIMIT_RIGHT,
                                    HAS_DOCS)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: no NaN
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # finite: every row sees every key of this tile
        m_ref = m_new
    p = tl.math.exp2(qk * qk_scale - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_rows(v_src, start_n, MASKED, not EVEN_D, TMA)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, q_doc, doc, lo, hi, N_K, LEFT, RIGHT, qk_scale,
              BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr, LIMIT_LEFT: tl.constexpr,
              LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, TMA: tl.constexpr,
              INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Key tiles [lo, hi). A pipelined ``for`` when compiled; a ``while`` in the interpreter, whose
    ``range`` cannot take run-time bounds under numpy >= 2.4."""
    if INTERPRET:
        start_n = lo
        while start_n < hi:
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT,
                                      qk_scale, BLOCK_N, EVEN_D, MASKED, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA,
                                      INPUT_PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT,
                                      qk_scale, BLOCK_N, EVEN_D, MASKED, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA,
                                      INPUT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, L, DOC, SPAN, stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                      stride_vb, stride_vn, stride_vd, stride_ob, stride_om, stride_od, N_Q, N_K, GROUP, HEADS,
                      LEFT, RIGHT, qk_scale,
                      HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr,
                      EVEN_D: tl.constexpr, TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                      INTERPRET: tl.constexpr, FOLD_Q: tl.constexpr = 0, FOLD_KV: tl.constexpr = 0):
    """A program per (query tile, batch x query head); K and V rows of key/value head bh // GROUP. FOLD_Q, FOLD_KV:
    the query (Q, O) and key/value (K, V) sides' layout (``_head``)."""
    pid_m = tl.program_id(0)
    if LIMIT_RIGHT and not LIMIT_LEFT:  # causal: the last query tiles see the most keys, launch them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    bkv = bh // GROUP
    start_m = pid_m * BLOCK_M
    q_src = _tile_src(Q, bh, stride_qb, FOLD_Q, N_Q, stride_qm, stride_qd, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    k_src = _tile_src(K, bkv, stride_kb, FOLD_KV, N_K, stride_kn, stride_kd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    v_src = _tile_src(V, bkv, stride_vb, FOLD_KV, N_K, stride_vn, stride_vd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    q = _load_rows(q_src, start_m, True, not EVEN_D, TMA)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    doc, q_doc, lo, full_lo, full_hi, hi = _tile_plan(DOC, SPAN, bh // HEADS, start_m, offs_m, N_Q, N_K, LEFT, RIGHT,
                                                      BLOCK_M, BLOCK_N, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS)
    if LIMIT_LEFT or HAS_DOCS:  # the window's left edge or the document's start
        acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, q_doc, doc, lo, full_lo, N_K, LEFT, RIGHT,
                                  qk_scale, BLOCK_N, EVEN_D, True, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA,
                                  INPUT_PRECISION, INTERPRET)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, q_doc, doc, full_lo, full_hi, N_K, LEFT, RIGHT,
                              qk_scale, BLOCK_N, EVEN_D, False, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA,
                              INPUT_PRECISION, INTERPRET)
    # the diagonal (or the window's right edge), the document's end, the end of the keys
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, q_doc, doc, full_hi, hi, N_K, LEFT, RIGHT,
                              qk_scale, BLOCK_N, EVEN_D, True, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA,
                              INPUT_PRECISION, INTERPRET)
    # Algorithm 1 lines 15-16; a row that sees no key (possible with a window when Nq > Nk) gets O = 0, L = -inf
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # back to natural log
    o_dst = _tile_src(O, bh, stride_ob, FOLD_Q, N_Q, stride_om, stride_od, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    _store_rows(o_dst, start_m, acc.to(O.dtype.element_ty), TMA)
    tl.store(L + bh * N_Q + offs_m, lse, mask=offs_m < N_Q)


# Backward -----------------------------------------------------------------------------------------------
@triton.jit
def _flash_bwd_preprocess(O, DO, Delta, DQ_ACC, stride_ob, stride_om, stride_od, stride_dob, stride_dom,
                          stride_dod, N_Q, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                          ZERO_DQ: tl.constexpr, FOLD_Q: tl.constexpr = 0):
    """D = rowsum(O * dO) in fp32 ``(BH, Nq)``; with ZERO_DQ also zeroes the fp32 dQ accumulator
    ``(BH, Nq, D_PAD)`` (one launch instead of a memset)."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    rows, cols = offs_m[:, None], offs_d[None, :]
    o = tl.load(O + _head(bh, stride_ob, FOLD_Q, HEAD_DIM) + rows * stride_om + cols * stride_od, mask=mask,
                other=0.0)
    do = tl.load(DO + _head(bh, stride_dob, FOLD_Q, HEAD_DIM) + rows * stride_dom + cols * stride_dod, mask=mask,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + bh * N_Q + offs_m, delta, mask=offs_m < N_Q)
    if ZERO_DQ:
        tl.store(DQ_ACC + (bh * N_Q + offs_m[:, None]) * D_PAD + offs_d[None, :],
                 tl.zeros((BLOCK_M, D_PAD), tl.float32), mask=offs_m[:, None] < N_Q)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):  # the persistent backward's work counter
            tl.store((Delta + tl.num_programs(1).to(tl.int64) * N_Q).to(tl.pointer_type(tl.int32)), 0)


@triton.jit
def _row_lse2(L, offs_m, N_Q, MASKED: tl.constexpr):
    """log2-unit logsumexp of the query rows offs_m (L already offset to the batch-head)."""
    if MASKED:
        lse2 = tl.load(L + offs_m, mask=offs_m < N_Q, other=0.0) * 1.4426950408889634
        # a row that sees no key (L = -inf) only occurs in masked tiles: P = exp2(S - inf) = 0 rather than inf
        # (which times a zero key row past N_K would be NaN)
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    else:
        lse2 = tl.load(L + offs_m) * 1.4426950408889634
    return lse2


@triton.jit
def _row_stats(L, Delta, offs_m, N_Q, MASKED: tl.constexpr):
    """log2-unit logsumexp and D of the query rows offs_m (L and Delta already offset to the batch-head)."""
    lse2 = _row_lse2(L, offs_m, N_Q, MASKED)
    if MASKED:
        delta = tl.load(Delta + offs_m, mask=offs_m < N_Q, other=0.0)
    else:
        delta = tl.load(Delta + offs_m)
    return lse2, delta


@triton.jit
def _dkdv_step(dk, dv, k, v, q_src, do_src, o_src, dq_dst, L, Delta, offs_n, k_doc, doc, start_m, N_Q, LEFT, RIGHT,
               qk_scale, BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr,
               LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, TMA: tl.constexpr,
               ATOMIC_DQ: tl.constexpr, DELTA_FROM_O: tl.constexpr, INPUT_PRECISION: tl.constexpr,
               INTERPRET: tl.constexpr):
    """One query tile's contribution to dK, dV of a key tile on transposed score tiles; with ATOMIC_DQ
    also its dS K added to the query tile's rows of the fp32 dQ accumulator (the fifth matmul). DELTA_FROM_O:
    D of the tile's rows from its O and dO tiles here, instead of the preprocessing kernel's Delta."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_rows(q_src, start_m, MASKED, not EVEN_D, TMA)
    if DELTA_FROM_O:
        lse2 = _row_lse2(L, offs_m, N_Q, MASKED)
    else:
        lse2, delta = _row_stats(L, Delta, offs_m, N_Q, MASKED)
    sT = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_M) = S^T, eq. 13
    pT = tl.math.exp2(sT * qk_scale - lse2[None, :])  # eq. 14 in log2 units
    if MASKED:
        q_doc = 0
        if HAS_DOCS:
            q_doc = tl.load(doc + offs_m, mask=offs_m < N_Q, other=0)[None, :]
        visible = _visible(offs_m[None, :], offs_n[:, None], q_doc, k_doc, N_Q, LEFT, RIGHT, LIMIT_LEFT,
                           LIMIT_RIGHT, HAS_DOCS, True)
        pT = tl.where(visible, pT, 0.0)
    do = _load_rows(do_src, start_m, MASKED, not EVEN_D, TMA)
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)  # eq. 15
    dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # eq. 16, transposed
    if DELTA_FROM_O:
        o = _load_rows(o_src, start_m, MASKED, not EVEN_D, TMA)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    dsT = (pT * (dpT - delta[None, :])).to(q.dtype)  # eq. 17
    dk = tl.dot(dsT, q, dk, input_precision=INPUT_PRECISION)  # eq. 19 (unscaled)
    if ATOMIC_DQ:
        dq = tl.dot(tl.trans(dsT), k, input_precision=INPUT_PRECISION)  # eq. 18 (unscaled), (BLOCK_M, D_PAD)
        if TMA and not INTERPRET:  # TMA reduce-add of the whole tile (rows past N_Q are clipped)
            dq_dst.atomic_add([start_m, 0], dq)
        else:
            offs_d = tl.arange(0, D_PAD)
            tl.atomic_add(dq_dst + offs_m[:, None] * D_PAD + offs_d[None, :], dq, mask=offs_m[:, None] < N_Q,
                          sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_loop(dk, dv, k, v, q_src, do_src, o_src, dq_dst, L, Delta, offs_n, k_doc, doc, lo, hi, N_Q, LEFT, RIGHT,
               qk_scale, BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr,
               LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, TMA: tl.constexpr,
               ATOMIC_DQ: tl.constexpr, DELTA_FROM_O: tl.constexpr, INPUT_PRECISION: tl.constexpr,
               INTERPRET: tl.constexpr):
    """Query tiles [lo, hi) (see _fwd_loop for the two loop forms)."""
    if INTERPRET:
        start_m = lo
        while start_m < hi:
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, o_src, dq_dst, L, Delta, offs_n, k_doc, doc, start_m,
                                N_Q, LEFT, RIGHT, qk_scale, BLOCK_M, D_PAD, EVEN_D, MASKED, LIMIT_LEFT, LIMIT_RIGHT,
                                HAS_DOCS, TMA, ATOMIC_DQ, DELTA_FROM_O, INPUT_PRECISION, INTERPRET)
            start_m += BLOCK_M
    else:
        for start_m in range(lo, hi, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, o_src, dq_dst, L, Delta, offs_n, k_doc, doc, start_m,
                                N_Q, LEFT, RIGHT, qk_scale, BLOCK_M, D_PAD, EVEN_D, MASKED, LIMIT_LEFT, LIMIT_RIGHT,
                                HAS_DOCS, TMA, ATOMIC_DQ, DELTA_FROM_O, INPUT_PRECISION, INTERPRET)
    return dk, dv


@triton.jit
def _dkdv_head(dk, dv, k, v, Q, DO, O, L, Delta, DQ_ACC, bh, stride_qb, stride_qm, stride_qd, stride_dob,
               stride_dom, stride_dod, stride_ob, stride_om, stride_od, offs_n, k_doc, doc, lo, full_lo, full_hi, hi,
               N_Q, LEFT, RIGHT, qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
               EVEN_D: tl.constexpr, LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr,
               TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr, DELTA_FROM_O: tl.constexpr, INPUT_PRECISION: tl.constexpr,
               INTERPRET: tl.constexpr, FOLD_Q: tl.constexpr):
    """The query tiles of one query head (batch-head bh) that see this key tile."""
    L += bh * N_Q
    Delta += bh * N_Q
    q_src = _tile_src(Q, bh, stride_qb, FOLD_Q, N_Q, stride_qm, stride_qd, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    do_src = _tile_src(DO, bh, stride_dob, FOLD_Q, N_Q, stride_dom, stride_dod, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    if DELTA_FROM_O:
        o_src = _tile_src(O, bh, stride_ob, FOLD_Q, N_Q, stride_om, stride_od, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    else:
        o_src = do_src  # not read
    if ATOMIC_DQ and TMA and not INTERPRET:
        dq_dst = tl.make_tensor_descriptor(DQ_ACC + bh * N_Q * D_PAD, shape=[N_Q, D_PAD], strides=[D_PAD, 1],
                                           block_shape=[BLOCK_M, D_PAD])
    else:
        dq_dst = DQ_ACC + bh * N_Q * D_PAD
    if LIMIT_RIGHT or HAS_DOCS:  # the diagonal (or the window's right edge), the document's start
        dk, dv = _dkdv_loop(dk, dv, k, v, q_src, do_src, o_src, dq_dst, L, Delta, offs_n, k_doc, doc, lo, full_lo,
                            N_Q, LEFT, RIGHT, qk_scale, BLOCK_M, D_PAD, EVEN_D, True, LIMIT_LEFT, LIMIT_RIGHT,
                            HAS_DOCS, TMA, ATOMIC_DQ, DELTA_FROM_O, INPUT_PRECISION, INTERPRET)
    dk, dv = _dkdv_loop(dk, dv, k, v, q_src, do_src, o_src, dq_dst, L, Delta, offs_n, k_doc, doc, full_lo, full_hi,
                        N_Q, LEFT, RIGHT, qk_scale, BLOCK_M, D_PAD, EVEN_D, False, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS,
                        TMA, ATOMIC_DQ, DELTA_FROM_O, INPUT_PRECISION, INTERPRET)
    # the window's left edge, the document's end, the end of the queries
    dk, dv = _dkdv_loop(dk, dv, k, v, q_src, do_src, o_src, dq_dst, L, Delta, offs_n, k_doc, doc, full_hi, hi, N_Q,
                        LEFT, RIGHT, qk_scale, BLOCK_M, D_PAD, EVEN_D, True, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA,
                        ATOMIC_DQ, DELTA_FROM_O, INPUT_PRECISION, INTERPRET)
    return dk, dv


@triton.jit
def _dkdv_tile(Q, K, V, DO, O, L, Delta, DK, DV, DQ_ACC, DOC, SPAN, bkv, start_n,
               stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
               stride_dob, stride_dom, stride_dod, stride_ob, stride_om, stride_od, stride_dkb, stride_dkn, stride_dkd,
               stride_dvb, stride_dvn, stride_dvd, N_Q, N_K, GROUP, HEADS, LEFT, RIGHT, sm_scale, qk_scale,
               HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr,
               TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr, DELTA_FROM_O: tl.constexpr, INPUT_PRECISION: tl.constexpr,
               INTERPRET: tl.constexpr, FOLD_Q: tl.constexpr, FOLD_KV: tl.constexpr):
    """dK, dV of the key tile [start_n, start_n + BLOCK_N) of key/value head bkv (HEADS of them per batch),
    summed over the GROUP query heads that read it (no atomics); with ATOMIC_DQ also every dQ contribution of
    those pairs."""
    k_src = _tile_src(K, bkv, stride_kb, FOLD_KV, N_K, stride_kn, stride_kd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    v_src = _tile_src(V, bkv, stride_vb, FOLD_KV, N_K, stride_vn, stride_vd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    # Key rows past N_K are zero and their dK/dV rows are never stored: no key mask is needed here.
    k = _load_rows(k_src, start_n, True, not EVEN_D, TMA)
    v = _load_rows(v_src, start_n, True, not EVEN_D, TMA)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    # key j is seen by queries j - RIGHT .. j + LEFT (and those of its document): the query tiles' view with the
    # sides swapped
    doc, k_doc, lo, full_lo, full_hi, hi = _tile_plan(DOC, SPAN, bkv // HEADS, start_n, offs_n, N_K, N_Q, RIGHT, LEFT,
                                                      BLOCK_N, BLOCK_M, LIMIT_RIGHT, LIMIT_LEFT, HAS_DOCS)
    dk = tl.zeros((BLOCK_N, D_PAD), tl.float32)
    dv = tl.zeros((BLOCK_N, D_PAD), tl.float32)
    if INTERPRET:
        g = 0
        while g < GROUP:
            dk, dv = _dkdv_head(dk, dv, k, v, Q, DO, O, L, Delta, DQ_ACC, bkv * GROUP + g, stride_qb, stride_qm,
                                stride_qd, stride_dob, stride_dom, stride_dod, stride_ob, stride_om, stride_od, offs_n,
                                k_doc, doc, lo, full_lo, full_hi, hi, N_Q, LEFT, RIGHT, qk_scale, HEAD_DIM, D_PAD,
                                BLOCK_M, EVEN_D, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA, ATOMIC_DQ, DELTA_FROM_O,
                                INPUT_PRECISION, INTERPRET, FOLD_Q)
            g += 1
    else:
        for g in range(GROUP):  # GROUP == 1 is a compile-time constant (Triton specialises 1): no loop
            dk, dv = _dkdv_head(dk, dv, k, v, Q, DO, O, L, Delta, DQ_ACC, bkv * GROUP + g, stride_qb, stride_qm,
                                stride_qd, stride_dob, stride_dom, stride_dod, stride_ob, stride_om, stride_od, offs_n,
                                k_doc, doc, lo, full_lo, full_hi, hi, N_Q, LEFT, RIGHT, qk_scale, HEAD_DIM, D_PAD,
                                BLOCK_M, EVEN_D, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA, ATOMIC_DQ, DELTA_FROM_O,
                                INPUT_PRECISION, INTERPRET, FOLD_Q)
    dk_dst = _tile_src(DK, bkv, stride_dkb, FOLD_KV, N_K, stride_dkn, stride_dkd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    dv_dst = _tile_src(DV, bkv, stride_dvb, FOLD_KV, N_K, stride_dvn, stride_dvd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    _store_rows(dk_dst, start_n, (dk * sm_scale).to(DK.dtype.element_ty), TMA)
    _store_rows(dv_dst, start_n, dv.to(DV.dtype.element_ty), TMA)


@triton.jit
def _flash_bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV, DQ_ACC, DOC, SPAN,
                           stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                           stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod,
                           stride_dkb, stride_dkn, stride_dkd, stride_dvb, stride_dvn, stride_dvd,
                           N_Q, N_K, GROUP, HEADS, LEFT, RIGHT, sm_scale, qk_scale,
                           HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr,
                           HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr, TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                           INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr, FOLD_Q: tl.constexpr = 0,
                           FOLD_KV: tl.constexpr = 0):
    """A program per (key tile, batch x key/value head): ``_dkdv_tile`` with D from the preprocessing kernel.
    Causal: the first key tiles, seen by the most queries, go first."""
    _dkdv_tile(Q, K, V, DO, DO, L, Delta, DK, DV, DQ_ACC, DOC, SPAN, tl.program_id(1).to(tl.int64),
               tl.program_id(0) * BLOCK_N, stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
               stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod, stride_dob, stride_dom, stride_dod,
               stride_dkb, stride_dkn, stride_dkd, stride_dvb, stride_dvn, stride_dvd, N_Q, N_K, GROUP, HEADS, LEFT,
               RIGHT, sm_scale, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, EVEN_D,
               TMA, ATOMIC_DQ, False, INPUT_PRECISION, INTERPRET, FOLD_Q, FOLD_KV)


@triton.jit
def _flash_bwd_dq_postprocess(DQ_ACC, DQ, stride_dqb, stride_dqm, stride_dqd, N_Q, sm_scale,
                              HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                              FOLD_Q: tl.constexpr = 0):
    """dQ = sm_scale * accumulator, cast to the input dtype."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    acc = tl.load(DQ_ACC + (bh * N_Q + offs_m[:, None]) * D_PAD + offs_d[None, :], mask=offs_m[:, None] < N_Q,
                  other=0.0)
    tl.store(DQ + _head(bh, stride_dqb, FOLD_Q, HEAD_DIM) + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             (acc * sm_scale).to(DQ.dtype.element_ty), mask=(offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _dq_step(dq, q, do, lse2, delta, k_src, v_src, offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT, qk_scale,
             BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr, LIMIT_LEFT: tl.constexpr,
             LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One key tile's contribution to dQ of a query tile (eqs. 13-18), recomputing P (deterministic mode)."""
    k = _load_rows(k_src, start_n, MASKED, not EVEN_D, TMA)
    v = _load_rows(v_src, start_n, MASKED, not EVEN_D, TMA)
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # eq. 13
    p = tl.math.exp2(s * qk_scale - lse2[:, None])  # eq. 14
    if MASKED:
        visible = _key_tile_visible(offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT, BLOCK_N, LIMIT_LEFT, LIMIT_RIGHT,
                                    HAS_DOCS)
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)  # eq. 16
    ds = p * (dp - delta[:, None])  # eq. 17
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)  # eq. 18 (unscaled)


@triton.jit
def _dq_loop(dq, q, do, lse2, delta, k_src, v_src, offs_m, q_doc, doc, lo, hi, N_K, LEFT, RIGHT, qk_scale,
             BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr, LIMIT_LEFT: tl.constexpr,
             LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr,
             INTERPRET: tl.constexpr):
    """Key tiles [lo, hi) (see _fwd_loop for the two loop forms)."""
    if INTERPRET:
        start_n = lo
        while start_n < hi:
            dq = _dq_step(dq, q, do, lse2, delta, k_src, v_src, offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT,
                          qk_scale, BLOCK_N, EVEN_D, MASKED, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA, INPUT_PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_step(dq, q, do, lse2, delta, k_src, v_src, offs_m, q_doc, doc, start_n, N_K, LEFT, RIGHT,
                          qk_scale, BLOCK_N, EVEN_D, MASKED, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA, INPUT_PRECISION)
    return dq


@triton.jit
def _dq_tile(Q, K, V, DO, O, L, Delta, DQ, DOC, SPAN, bh, bkv, batch, start_m,
             stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
             stride_dob, stride_dom, stride_dod, stride_ob, stride_om, stride_od, stride_dqb, stride_dqm, stride_dqd,
             N_Q, N_K, LEFT, RIGHT, sm_scale, qk_scale,
             HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr, HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr,
             TMA: tl.constexpr, DELTA_FROM_O: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
             FOLD_Q: tl.constexpr, FOLD_KV: tl.constexpr):
    """dQ of the query tile [start_m, start_m + BLOCK_M) of batch-head bh (key/value head bkv, sequence batch):
    walks its key tiles and writes its dQ rows once (no atomics). DELTA_FROM_O: D from the O and dO tiles."""
    q_src = _tile_src(Q, bh, stride_qb, FOLD_Q, N_Q, stride_qm, stride_qd, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    do_src = _tile_src(DO, bh, stride_dob, FOLD_Q, N_Q, stride_dom, stride_dod, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    k_src = _tile_src(K, bkv, stride_kb, FOLD_KV, N_K, stride_kn, stride_kd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    v_src = _tile_src(V, bkv, stride_vb, FOLD_KV, N_K, stride_vn, stride_vd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    q = _load_rows(q_src, start_m, True, not EVEN_D, TMA)
    do = _load_rows(do_src, start_m, True, not EVEN_D, TMA)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    if DELTA_FROM_O:
        lse2 = _row_lse2(L + bh * N_Q, offs_m, N_Q, True)
        o_src = _tile_src(O, bh, stride_ob, FOLD_Q, N_Q, stride_om, stride_od, HEAD_DIM, BLOCK_M, D_PAD, TMA)
        o = _load_rows(o_src, start_m, True, not EVEN_D, TMA)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    else:
        lse2, delta = _row_stats(L + bh * N_Q, Delta + bh * N_Q, offs_m, N_Q, True)
    dq = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    doc, q_doc, lo, full_lo, full_hi, hi = _tile_plan(DOC, SPAN, batch, start_m, offs_m, N_Q, N_K, LEFT, RIGHT,
                                                      BLOCK_M, BLOCK_N, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS)
    if LIMIT_LEFT or HAS_DOCS:
        dq = _dq_loop(dq, q, do, lse2, delta, k_src, v_src, offs_m, q_doc, doc, lo, full_lo, N_K, LEFT, RIGHT,
                      qk_scale, BLOCK_N, EVEN_D, True, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA, INPUT_PRECISION,
                      INTERPRET)
    dq = _dq_loop(dq, q, do, lse2, delta, k_src, v_src, offs_m, q_doc, doc, full_lo, full_hi, N_K, LEFT, RIGHT,
                  qk_scale, BLOCK_N, EVEN_D, False, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA, INPUT_PRECISION, INTERPRET)
    dq = _dq_loop(dq, q, do, lse2, delta, k_src, v_src, offs_m, q_doc, doc, full_hi, hi, N_K, LEFT, RIGHT,
                  qk_scale, BLOCK_N, EVEN_D, True, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, TMA, INPUT_PRECISION, INTERPRET)
    dq_dst = _tile_src(DQ, bh, stride_dqb, FOLD_Q, N_Q, stride_dqm, stride_dqd, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    _store_rows(dq_dst, start_m, (dq * sm_scale).to(DQ.dtype.element_ty), TMA)


@triton.jit
def _flash_bwd_dq_kernel(Q, K, V, DO, L, Delta, DQ, DOC, SPAN,
                         stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                         stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod,
                         stride_dqb, stride_dqm, stride_dqd, N_Q, N_K, GROUP, HEADS, LEFT, RIGHT, sm_scale, qk_scale,
                         HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr,
                         HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr, TMA: tl.constexpr,
                         INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr, FOLD_Q: tl.constexpr = 0,
                         FOLD_KV: tl.constexpr = 0):
    """Deterministic mode: a program per (query tile, batch x query head), ``_dq_tile`` with D from the
    preprocessing kernel; causal launches the last (heaviest) query tiles first."""
    pid_m = tl.program_id(0)
    if LIMIT_RIGHT and not LIMIT_LEFT:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    _dq_tile(Q, K, V, DO, DO, L, Delta, DQ, DOC, SPAN, bh, bh // GROUP, bh // HEADS, pid_m * BLOCK_M,
             stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
             stride_dob, stride_dom, stride_dod, stride_dob, stride_dom, stride_dod, stride_dqb, stride_dqm,
             stride_dqd, N_Q, N_K, LEFT, RIGHT, sm_scale, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, BLOCK_N, LIMIT_LEFT,
             LIMIT_RIGHT, HAS_DOCS, EVEN_D, TMA, False, INPUT_PRECISION, INTERPRET, FOLD_Q, FOLD_KV)


@triton.jit
def _flash_bwd_single_kernel(Q, K, V, O, DO, L, DQ, DK, DV, DOC, SPAN,
                             stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                             stride_vb, stride_vn, stride_vd, stride_ob, stride_om, stride_od,
                             stride_dob, stride_dom, stride_dod, stride_dqb, stride_dqm, stride_dqd,
                             stride_dkb, stride_dkn, stride_dkd, stride_dvb, stride_dvn, stride_dvd,
                             N_Q, N_K, GROUP, HEADS, LEFT, RIGHT, sm_scale, qk_scale,
                             HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr,
                             HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr, TMA: tl.constexpr,
                             INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr, FOLD_Q: tl.constexpr = 0,
                             FOLD_KV: tl.constexpr = 0):
    """The whole backward in one launch, for short sequences (where launches and latency, not arithmetic, are the
    cost), taking D from the O and dO tiles it loads (no preprocessing, no dQ accumulator, no atomics: bitwise
    reproducible). Key/value head bkv (HEADS per batch) has a program per key tile (dK, dV, summed over its GROUP
    query heads) and then one per query tile (dQ of each of the GROUP heads): the two halves run side by side, so a
    call's critical path is one tile's loop (H100, 1 x 1 x 128 x 64: 5.8 us, against 8.2 with a program doing
    both of its tiles in turn; scripts/device/flash_floor_variants.py)."""
    pid = tl.program_id(0)
    bkv = tl.program_id(1).to(tl.int64)
    q_pid = pid - tl.cdiv(N_K, BLOCK_N)
    if q_pid < 0:
        _dkdv_tile(Q, K, V, DO, O, L, L, DK, DV, L, DOC, SPAN, bkv, pid * BLOCK_N, stride_qb, stride_qm, stride_qd,
                   stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd, stride_dob, stride_dom,
                   stride_dod, stride_ob, stride_om, stride_od, stride_dkb, stride_dkn, stride_dkd, stride_dvb,
                   stride_dvn, stride_dvd, N_Q, N_K, GROUP, HEADS, LEFT, RIGHT, sm_scale, qk_scale, HEAD_DIM, D_PAD,
                   BLOCK_M, BLOCK_N, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, EVEN_D, TMA, False, True, INPUT_PRECISION,
                   INTERPRET, FOLD_Q, FOLD_KV)
    else:
        g = 0
        while g < GROUP:
            _dq_tile(Q, K, V, DO, O, L, L, DQ, DOC, SPAN, bkv * GROUP + g, bkv, bkv // HEADS, q_pid * BLOCK_M,
                     stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn,
                     stride_vd, stride_dob, stride_dom, stride_dod, stride_ob, stride_om, stride_od, stride_dqb,
                     stride_dqm, stride_dqd, N_Q, N_K, LEFT, RIGHT, sm_scale, qk_scale, HEAD_DIM, D_PAD, BLOCK_M,
                     BLOCK_N, LIMIT_LEFT, LIMIT_RIGHT, HAS_DOCS, EVEN_D, TMA, True, INPUT_PRECISION, INTERPRET, FOLD_Q,
                     FOLD_KV)
            g += 1


# --------------------------------------------------------------------------------------------- launchers
_INTERPRETED = not isinstance(_flash_fwd_kernel, triton.runtime.jit.JITFunction)  # TRITON_INTERPRET=1 at import


def _check_runnable(t: Tensor) -> None:
    if t.device.type == "cuda":
        if _INTERPRETED:
            raise ValueError("the Triton kernels were built for the interpreter (TRITON_INTERPRET=1 at import); "
                             "unset it to run on CUDA tensors")
        return
    if t.device.type != "cpu":
        raise ValueError(f"FlashAttention2Triton runs on CUDA tensors (or CPU ones under TRITON_INTERPRET=1), "
                         f"got device {t.device}")
    if not _INTERPRETED:
        raise ValueError("FlashAttention2Triton got CPU tensors: set TRITON_INTERPRET=1 in the environment before "
                         "importing cs336_systems.attention.flash_triton to run the kernels in Triton's "
                         "interpreter, or move the tensors to a CUDA device")


def _interpreter_upcast(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Triton 3.6's interpreter computes ``tl.dot`` of bf16 operands wrongly (numpy has no bf16), so on a CPU
    bf16 inputs run the kernels in fp32 and the results are rounded back to bf16: the interpreter checks the
    kernels' logic, a GPU their bf16 numerics."""
    return tuple(t.float() for t in tensors)


def _bh_stride(t: Tensor) -> int | None:
    """The stride of the leading dims of ``(..., N, d)`` flattened into one batch-head axis, or None where no
    single stride walks them (then the launcher copies): the kernels address ``t`` itself, never a view."""
    step, want = 0, None  # want: the stride the next outer dim of size > 1 must have
    for size, stride in zip(reversed(t.shape[:-2]), reversed(t.stride()[:-2]), strict=True):
        if size == 1:
            continue
        if want is None:
            step = stride
        elif stride != want:
            return None
        want = stride * size
    return step


def _rows(t: Tensor) -> tuple[Tensor, tuple[int, int, int]]:
    """``t`` (contiguous if its layout needs it: leading dims that do not flatten, or d not of unit stride) and
    its (batch-head, row, column) strides."""
    bh = _bh_stride(t)
    if bh is None or (t.stride(-1) != 1 and t.shape[-1] != 1):
        t = t.contiguous()
        bh = _bh_stride(t)
    return t, (bh, t.stride(-2), t.stride(-1))


def _folded(t: Tensor) -> bool:
    """A (B, H, N, d) view whose H heads lie side by side in each row (head stride d, unit stride along d: a
    (B, N, H, d) tensor transposed, as a projection's output viewed as heads is) and whose batch-heads no single
    stride walks. The kernels address such tensors in place (``_head``'s FOLD) instead of copying them."""
    return (t.ndim == 4 and t.stride(3) == 1 and t.stride(1) == t.shape[3] and t.shape[1] > 1
            and _bh_stride(t) is None)


def _fold(t: Tensor) -> int:
    """The kernels' FOLD for ``t`` (its heads when ``_folded``, else 0)."""
    return t.shape[1] if _folded(t) else 0


def _folds(Q: Tensor, K: Tensor, V: Tensor) -> tuple[int, int]:
    """The query and key/value sides' FOLD (the key/value side is folded only where K and V both are)."""
    return _fold(Q), _fold(K) if _folded(V) else 0


def _heads_aligned(folds: tuple[int, int], d: int, elem_size: int) -> bool:
    """Whether TMA can address a folded side: its heads' rows start d elements apart, which must be 16 bytes."""
    return not any(folds) or d * elem_size % 16 == 0


def _side_rows(t: Tensor, fold: int) -> tuple[Tensor, tuple[int, int, int]]:
    """``_rows`` for one side (query or key/value) of a call: with ``fold`` the side's tensors are addressed
    folded, (batch, row, column) strides, and one not in that layout is copied into it."""
    if not fold:
        return _rows(t)
    if not _folded(t):
        t = _folded_empty(t).copy_(t)
    return t, (t.stride(0), t.stride(2), 1)


def _folded_empty(like: Tensor) -> Tensor:
    """An uninitialised tensor of ``like``'s (B, H, N, d) shape laid out as (B, N, H, d) transposed (``_folded``)."""
    b, h, n, d = like.shape
    return like.new_empty((b, n, h, d)).transpose(1, 2)


def _side_empty(like: Tensor, fold: int) -> Tensor:
    """An output like ``like`` (O like Q, dQ like Q, dK like K, ...): folded where its side is, else contiguous."""
    return _folded_empty(like) if fold else like.new_empty(like.shape)


def _input_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


def _d_pad(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    # not triton.cdiv: that is a jit function, and calling one from Python costs microseconds
    return -(-a // b)


@functools.cache
def _has_tma(device: torch.device) -> bool:
    """Tensor descriptors run on the interpreter and on Hopper or newer (TMA)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def _tma_fits(device: torch.device, elem_size: int, ptrs: tuple[int, ...], strides: tuple[tuple, ...]) -> bool:
    """Whether per-batch-head 2-D descriptors can describe tensors with these data pointers and (batch-head,
    row, column) strides: unit stride along d, 16-byte aligned bases, row strides and batch-head strides."""
    return _has_tma(device) and all(
        s[2] == 1 and p % 16 == 0 and (s[1] * elem_size) % 16 == 0 and (s[0] * elem_size) % 16 == 0
        for p, s in zip(ptrs, strides, strict=True))


def _tma_ready(*tensors: Tensor) -> bool:
    """``_tma_fits`` for these tensors as the launchers address them (``_rows``)."""
    rows = [_rows(t) for t in tensors]
    return _tma_fits(tensors[0].device, tensors[0].element_size(), tuple(r[0].data_ptr() for r in rows),
                     tuple(r[1] for r in rows))


_WORKSPACES: dict[tuple[int, int], Tensor] = {}


def _workspace(device_index: int, stream: int, size: int) -> Tensor:
    """Global memory in which the kernels build their tensor descriptors (one per program and tensor).
    One buffer per (device, stream), grown when too small: kernels on one stream run one after another,
    so they can share it, and a call allocates nothing."""
    key = (device_index, stream)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < size:
        buf = _WORKSPACES[key] = torch.empty(max(size, 1 << 16), dtype=torch.int8,
                                             device=torch.device("cuda", device_index))
    return buf


def _tma_workspace(size: int, alignment: int, stream: int) -> Tensor:
    """Triton's allocator interface (``triton.set_allocator``) to ``_workspace``; buffers are 256-byte aligned."""
    return _workspace(torch.cuda.current_device(), stream, size)


def _with_descs(pointers: tuple, descs: tuple) -> tuple:
    """``pointers`` with those that ``descs`` names (``flash_hopper.HostDesc``) as Triton's descriptor objects."""
    if not descs:
        return pointers
    return tuple(p if d is None else d.descriptor(p) for p, d in zip(pointers, descs, strict=True))


def _raw_launch(launch):
    """The compiled module's C launcher inside Triton's wrapper that encodes descriptor objects on every call
    (Triton 3.6's ``wrap_handle_tensordesc`` closure), or None where it is not there."""
    code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    if code is None or not cells or "launcher" not in code.co_freevars:
        return None
    return cells[code.co_freevars.index("launcher")].cell_contents


def _descriptor_encoders(compiled, descs: tuple):
    """Per pointer argument, None (passed as an address) or what encodes its host descriptor: a cache of its encoded
    maps by address (an encoding depends on this compiled kernel's metadata: swizzle, element type, the box), the
    encoder's arguments after the address, and the shape and strides the launcher takes after the map. None where
    the metadata is not what this was written for."""
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    metas = list(getattr(compiled.metadata, "tensordesc_meta", None) or ())
    if len(metas) != sum(d is not None for d in descs) or any(m.get("fp4_padded") for m in metas):
        return None
    metas = iter(metas)
    encoders = []
    for d in descs:
        if d is None:
            encoders.append(None)
            continue
        m = next(metas)
        encoders.append(({}, (m["swizzle"], m["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]],
                                  list(m["block_size"]), list(d.shape), list(d.strides), 0), (*d.shape, *d.strides)))
    return encoders


def _direct_launcher(compiled, tail: tuple, descs: tuple = ()):
    """``compiled[grid](*args, *tail)`` without Triton's per-launch Python (a closure, the device and stream
    look-ups, launch metadata, two empty hook chains, a scratch allocator call, and a CUDA pointer query per
    tensor argument, which integer pointers skip): a function ``(grid, pointers, scalars)`` that calls the
    compiled module's C launcher. Host descriptors (``descs``) are encoded once per tensor address. Falls back to
    Triton's path while launch hooks are set (a profiler that uses them, such as Proton) or where the launcher's
    layout is not the one this was written for."""
    run = getattr(compiled, "run", None)
    launch = getattr(run, "launch", None)
    fields = ("global_scratch_size", "global_scratch_align", "profile_scratch_size", "num_ctas",
              "launch_cooperative_grid", "launch_pdl")
    hooks = triton.knobs.runtime

    def slow(grid, pointers, scalars):
        triton.set_allocator(_tma_workspace)  # a context variable: the thread that launches sets it
        compiled[grid](*_with_descs(pointers, descs), *scalars, *tail)

    if launch is None or not all(hasattr(run, f) for f in fields) or run.profile_scratch_size:
        return slow
    encoders = None
    if any(d is not None for d in descs):
        launch, encoders = _raw_launch(launch), _descriptor_encoders(compiled, descs)
        if launch is None or encoders is None:
            return slow
        encode = triton.runtime.driver.active.utils.fill_tma_descriptor
        calls: dict[tuple, list] = {}  # the launcher's arguments by the pointers' addresses

        def encoded(addresses: tuple) -> list:
            args = []
            for ptr, enc in zip(addresses, encoders, strict=True):
                if enc is None:
                    args.append(ptr)
                    continue
                maps, how, after = enc
                m = maps.get(ptr)
                if m is None:
                    if len(maps) >= 8:
                        maps.clear()
                    m = maps[ptr] = encode(ptr, *how)
                args.append(m)
                args.extend(after)
            return args

        def args_of(pointers):
            # a few address sets recur (the caching allocator's blocks); a stream of new ones re-encodes
            addresses = tuple([p.data_ptr() for p in pointers])
            args = calls.get(addresses)
            if args is None:
                if len(calls) >= 16:
                    calls.clear()
                args = calls[addresses] = encoded(addresses)
            return args
    compiled._init_handles()
    function, packed = compiled.function, compiled.packed_metadata
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    scratch = run.global_scratch_size * run.num_ctas
    current_device, current_stream = torch._C._cuda_getDevice, torch._C._cuda_getCurrentRawStream

    def hooked() -> bool:  # Triton 3.6's hooks are HookChains (empty: no hook); older ones a callable or None
        enter, exit_ = hooks.launch_enter_hook, hooks.launch_exit_hook
        return bool(getattr(enter, "calls", enter)) or bool(getattr(exit_, "calls", exit_))

    def fast(grid, pointers, scalars):
        if hooked():
            return slow(grid, pointers, scalars)
        device = current_device()
        stream = current_stream(device)
        ws = _workspace(device, stream, grid[0] * grid[1] * grid[2] * scratch).data_ptr() if scratch else None
        launch(grid[0], grid[1], grid[2], stream, function, coop, pdl, ws, None, packed, None, None, None,
               *(args_of(pointers) if encoders else [p.data_ptr() for p in pointers]), *scalars, *tail)

    return fast


class _Launch:
    """``kernel[grid](*pointers, *scalars, **constexprs)`` for one layout of its arguments (what Triton
    specialises a launch on: dtypes, 16-byte alignment of the pointers, the integer arguments, constexprs,
    warps and stages). The first call goes through Triton's JIT (compiling if needed); later ones call the
    compiled kernel directly (``_direct_launcher``). A persistent kernel (``cfg.persistent``) takes its work
    items' count as ``grid[0]`` and runs as many programs as stay resident on the GPU (from the compiled kernel's
    registers and shared memory), at most one per item. ``descs``: per pointer argument, None or the
    ``flash_hopper.HostDesc`` the kernel takes in its place (the Gluon kernels' tensors)."""

    __slots__ = ("cfg", "constexprs", "descs", "kernel", "programs", "run")

    def __init__(self, kernel, constexprs: dict, cfg: KernelConfig, descs: tuple = ()):
        self.kernel, self.constexprs, self.cfg, self.run, self.programs = kernel, constexprs, cfg, None, 0
        self.descs = descs

    def __call__(self, grid: tuple[int, int, int], pointers: tuple, scalars: tuple) -> None:
        if self.programs:
            grid = (min(grid[0], self.programs), 1, 1)
        if self.run is not None:
            self.run(grid, pointers, scalars)
            return
        if not _INTERPRETED:
            triton.set_allocator(_tma_workspace)
        options = dict(self.constexprs, num_warps=self.cfg.num_warps, num_stages=self.cfg.num_stages)
        args = _with_descs(pointers, self.descs)
        if self.cfg.persistent or self.constexprs.get("LEAN"):
            compiled = self.kernel.warmup(*args, *scalars, grid=grid, **options)
            if not _INTERPRETED:
                ptx_release.check(compiled)  # before any launch: never run arrives the rewrite left marked
            if self.cfg.persistent:
                self.programs = _resident_programs(compiled, pointers[0].device)
                grid = (min(grid[0], self.programs), 1, 1)
        compiled = self.kernel[grid](*args, *scalars, **options)
        if not _INTERPRETED and compiled is not None:
            if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
                compiled = compiled.result()
            names = self.kernel.arg_names[len(pointers) + len(scalars):]  # the constexprs, in signature order
            defaults = {p.name: p.default for p in getattr(self.kernel, "params", ()) if p.has_default}
            self.run = _direct_launcher(compiled, tuple(self.constexprs[n] if n in self.constexprs else defaults[n]
                                                        for n in names), self.descs)


@functools.cache
def _l2_bytes(device: torch.device) -> int:
    """The GPU's L2 cache size (50 MiB on an H100 SXM)."""
    return torch.cuda.get_device_properties(device).L2_cache_size


def _resident_programs(compiled, device: torch.device) -> int:
    """How many programs of a compiled kernel the GPU runs at once: per SM, the fewest that its registers
    (allocated per warp in units of 256), shared memory (plus the 1 KiB the hardware reserves per block) and
    threads allow. Warps are the launch's, warp-specialised partitions included (``metadata.num_warps``)."""
    compiled._init_handles()  # loads the module, which fills in n_regs
    num_warps = compiled.metadata.num_warps
    props = torch.cuda.get_device_properties(device)
    regs_per_warp = -(-compiled.n_regs * 32 // 256) * 256
    per_sm = min(getattr(props, "regs_per_multiprocessor", 65536) // max(regs_per_warp * num_warps, 1),
                 getattr(props, "shared_memory_per_multiprocessor", 233472) // (compiled.metadata.shared + 1024),
                 getattr(props, "max_threads_per_multi_processor", 2048) // (32 * num_warps), 32)
    return max(1, per_sm) * props.multi_processor_count


_COUNTERS: dict[tuple[int, int], Tensor] = {}


def _work_counter(device: torch.device) -> Tensor:
    """The persistent forward's (next item, finished programs) int32 pair for the current stream: zero at
    allocation, and each launch leaves it zero (its last program resets it), so launches on one stream, which run
    one after another, share it without a memset per call."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    counter = _COUNTERS.get(key)
    if counter is None:
        counter = _COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=torch.device("cuda", index))
    return counter


class _Plan:
    """What follows from one call layout (a key of ``_PLANS``: shapes, strides, dtypes, devices and alignment of
    Q, K, V, the mask, the documents' layout, the config): the mask's window sides, the default scale, the
    forward launch (``_plan_forward``), and the backward's plans by dO layout. Built once, after the inputs
    passed their checks, so a call with a known layout skips them. ``eager``: the autograd.Functions' forward at
    the default scale without documents, ready to run (``_eager_forward``), or None where that call takes the
    general route."""

    __slots__ = ("backward", "config", "eager", "fwd", "left", "mask", "right", "scale")

    def __init__(self, left, right, scale, config, fwd, like: Tensor | None = None):
        self.left, self.right, self.scale, self.config, self.fwd, self.backward = left, right, scale, config, fwd, {}
        self.mask = (left, right, scale)
        self.eager = None if like is None else _eager_forward(fwd, like, scale)


_PLANS: dict[tuple, object] = {}  # plans by call layout; cleared when it grows past _MAX_PLANS
_MAX_PLANS = 4096


def _plan(key: tuple, build):
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = build()
    return plan


def _aligned(*tensors: Tensor) -> int:
    """0 when every data pointer is 16-byte aligned (Triton specialises pointers on it), else a bit per tensor."""
    low = 0
    for t in tensors:
        low |= t.data_ptr()
    if not low & 15:  # the common case, in half the time of a list and any()
        return 0
    return sum(1 << i for i, t in enumerate(tensors) if not t.data_ptr() & 15) | 1 << len(tensors)


def _doc_key(doc_ids: Tensor | None) -> tuple:
    """The documents' part of a plan key: what their checks and the kernels' specialisation depend on (a
    non-contiguous ``doc_ids`` is copied, and copies, like the spans ``_doc_span`` computes, are fresh aligned
    allocations)."""
    if doc_ids is None:
        return ()
    if not isinstance(doc_ids, Tensor):
        return (type(doc_ids),)  # never planned: the checks reject it
    contiguous = doc_ids.is_contiguous()
    return doc_ids.shape, doc_ids.dtype, doc_ids.device, contiguous, contiguous and _aligned(doc_ids)


def _checked_mask(Q: Tensor, K: Tensor, V: Tensor, mask: tuple, doc_ids: Tensor | None) -> tuple:
    """The checks of a call that depend on its layout (``ValueError`` naming the problem), by entry point
    (``mask[0]``), and its (left, right) window sides: "launch" (left, right) comes validated from
    flash_forward/flash_backward; "apply" (is_causal,) is FlashAttention2Triton's; "attn" (is_causal, window)
    is flash_attention's (grouped heads, windows and documents)."""
    entry = mask[0]
    if entry == "launch":
        return mask[1], mask[2]
    check_attention_inputs(Q, K, V, grouped=entry == "attn")
    if entry == "attn":
        check_doc_ids(doc_ids, Q, K)
    _check_runnable(Q)
    return normalize_window(mask[2] if entry == "attn" else None, mask[1], Q.shape[-2], K.shape[-2])


def _plan_for(Q: Tensor, K: Tensor, V: Tensor, mask: tuple, doc_ids: Tensor | None,
              config: FlashConfig | None) -> _Plan:
    key = (mask, Q.shape, Q.stride(), K.shape, K.stride(), V.shape, V.stride(), Q.dtype, K.dtype, V.dtype, Q.device,
           K.device, V.device, _aligned(Q, K, V), _doc_key(doc_ids), config,
           Q.dtype == torch.float32 and torch.get_float32_matmul_precision())
    plan = _PLANS.get(key)
    if plan is None:
        left, right = _checked_mask(Q, K, V, mask, doc_ids)
        plan = _plan(key, lambda: _Plan(left, right, 1.0 / math.sqrt(Q.shape[-1]), config,
                                        _plan_forward(Q, K, V, config, left, right, doc_ids is not None),
                                        Q if mask[0] != "launch" and doc_ids is None else None))
    return plan


def _eager_forward(fwd: tuple, Q: Tensor, scale: float) -> tuple | None:
    """An autograd.Function's eager forward for this layout as (launch, grid, the launch's arguments after the
    pointers, L's shape, L's strides, whether the kernel is persistent): O comes from ``torch.empty_like(Q)`` and L
    from ``torch.empty_strided``, which cost the host less than ``new_empty`` (issue 18: a small call's time is the
    host's); a persistent kernel takes its work counter in the documents' slot (``_launch_forward``). None where the
    call needs more than that: no launch, copies or folds, a non-contiguous Q (a contiguous one's ``empty_like``
    is contiguous too), the interpreter's bf16 upcast."""
    launch, grid, copy, scalars, folds = fwd
    if (launch is None or copy or any(folds) or not Q.is_contiguous()
            or (_INTERPRETED and Q.dtype == torch.bfloat16)):
        return None
    shape = tuple(Q.shape[:-1])
    strides = torch.empty(shape, device="meta").stride()  # L's contiguous strides, found once per layout
    return launch, grid, (*scalars, scale * LOG2E), shape, strides, launch.cfg.persistent


def _check_call(Q: Tensor, K: Tensor, V: Tensor, is_causal, window, doc_ids, scale) -> tuple[int | None, int | None,
                                                                                              float]:
    """Validate a call's inputs (``ValueError`` naming the problem) and normalise its mask: (left, right, scale)."""
    check_is_causal(is_causal)
    check_attention_inputs(Q, K, V, grouped=True)
    check_window(window)
    check_doc_ids(doc_ids, Q, K)
    check_scale(scale)
    left, right = normalize_window(window, is_causal, Q.shape[-2], K.shape[-2])
    return left, right, 1.0 / math.sqrt(Q.shape[-1]) if scale is None else float(scale)


_SPAN_CACHE: list = [None]  # [(weakref to doc_ids, its version, its span)]: layers of a model share one doc_ids


def _doc_span(doc_ids: Tensor | None) -> Tensor | None:
    """``(batch, 2, N)`` int32: where each position's document starts and ends ([start, end) along N) when the
    ids of that sequence are sorted (packed documents), -1 where they are not (then every tile is masked and
    none skipped). Device ops only, no host synchronisation; cached for the last ``doc_ids`` seen (eagerly),
    so the layers of a model that share one ``doc_ids`` compute it once."""
    if doc_ids is None:
        return None
    cache = not torch.compiler.is_compiling() and not doc_ids.is_inference()  # inference tensors have no version
    if cache:
        hit = _SPAN_CACHE[0]
        if hit is not None and hit[0]() is doc_ids and hit[1] == doc_ids._version:
            return hit[2]
    ids = doc_ids.reshape(-1, doc_ids.shape[-1])
    if not ids.is_contiguous():
        ids = ids.contiguous()
    start = torch.searchsorted(ids, ids, side="left", out_int32=True)  # meaningful where the row is sorted
    end = torch.searchsorted(ids, ids, side="right", out_int32=True)
    is_sorted = (ids[:, 1:] >= ids[:, :-1]).all(dim=1)
    span = torch.stack((start, end), dim=1).masked_fill(~is_sorted[:, None, None], -1)
    if cache:
        _SPAN_CACHE[0] = (weakref.ref(doc_ids), doc_ids._version, span)
    return span


def _limit(side: int | None) -> int:
    """A window side as the kernels' LIMIT_* constexpr: 0 no limit, 1 a side of 0 (causal's right: a compile-time
    constant in the masks), 2 any other."""
    return 0 if side is None else 1 if side == 0 else 2


def _doc_args(doc_ids: Tensor | None, doc_span: Tensor | None, dummy: Tensor) -> tuple[Tensor, Tensor]:
    """The kernels' DOC and SPAN arguments ((batch, N) ids, contiguous; spans); without documents a placeholder
    the kernels never read."""
    if doc_ids is None:
        return dummy, dummy
    return (doc_ids if doc_ids.is_contiguous() else doc_ids.contiguous()), doc_span


def flash_forward(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False, config: FlashConfig | None = None, *,
                  window: tuple[int, int] | None = None, doc_ids: Tensor | None = None,
                  scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel: returns O (like Q) and the logsumexp L (fp32, ``Q.shape[:-1]``; -inf for a row
    that sees no key). Arguments as in :func:`flash_attention`."""
    left, right, scale = _check_call(Q, K, V, is_causal, window, doc_ids, scale)
    _check_runnable(Q)
    return _forward(Q, K, V, config, left, right, doc_ids, _doc_span(doc_ids), scale)


def _forward(Q: Tensor, K: Tensor, V: Tensor, config: FlashConfig | None, left: int | None, right: int | None,
             doc_ids: Tensor | None, doc_span: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    """flash_forward on validated inputs and a normalised mask (see normalize_window; doc_span from _doc_span)."""
    if _INTERPRETED and Q.dtype == torch.bfloat16:  # see _interpreter_upcast
        o, lse = _forward(*_interpreter_upcast(Q, K, V), config, left, right, doc_ids, doc_span, scale)
        return o.to(Q.dtype), lse
    plan = _plan_for(Q, K, V, ("launch", left, right), doc_ids, config)
    return _launch_forward(plan, Q, K, V, doc_ids, doc_span, scale)


def _attention_forward(plan: _Plan, Q: Tensor, K: Tensor, V: Tensor, doc_ids: Tensor | None,
                       doc_span: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    """The autograd.Functions' forward (eager) through the call's plan (``_plan_for``, which ran the layout's
    checks)."""
    if _INTERPRETED and Q.dtype == torch.bfloat16:
        return _forward(Q, K, V, None, plan.left, plan.right, doc_ids, doc_span, scale)
    return _launch_forward(plan, Q, K, V, doc_ids, doc_span, scale)


def _launch_forward(plan: _Plan, Q: Tensor, K: Tensor, V: Tensor, doc_ids: Tensor | None, doc_span: Tensor | None,
                    scale: float) -> tuple[Tensor, Tensor]:
    """A call allocates O (in Q's layout where the kernels address Q folded) and L, and launches (everything else is
    in the plan)."""
    launch, grid, copy, scalars, (fq, fkv) = plan.fwd
    o = _side_empty(Q, fq)
    lse = Q.new_empty(Q.shape[:-1], dtype=torch.float32)  # new_empty: 2-3 us less host time than torch.empty
    if launch is None:  # an empty batch: nothing to launch (a grid axis of 0 is not a valid launch)
        return o, lse
    if copy:
        Q, K, V = _side_rows(Q, fq)[0], _side_rows(K, fkv)[0], _side_rows(V, fkv)[0]
    doc, span = _doc_args(doc_ids, doc_span, lse)
    if launch.cfg.persistent:  # the Gluon forward's work counter in the documents' slot (it takes none)
        doc = _work_counter(Q.device)
    launch(grid, (Q, K, V, o, lse, doc, span), (*scalars, scale * LOG2E))
    return o, lse


def _in_hopper_scope(Q: Tensor, left: int | None, right: int | None, has_docs: bool) -> bool:
    """What the Gluon kernels (``flash_hopper``, ``flash_hopper_bwd``) cover: 16-bit inputs, head dim 64 or 128,
    full or causal attention without documents (the config offers them only on sm_90; the caller checks that
    tensor descriptors can describe the tensors)."""
    return (Q.shape[-1] in flash_hopper.HEAD_DIMS and Q.dtype in (torch.bfloat16, torch.float16) and left is None
            and right in (None, 0) and not has_docs)


def _plan_forward(Q: Tensor, K: Tensor, V: Tensor, config: FlashConfig | None, left: int | None, right: int | None,
                  has_docs: bool) -> tuple:
    """(launch, grid, whether the inputs need a copy, the launch's integer arguments, the sides' FOLD (query,
    key/value): Q, K, V addressed in place where folded, ``_folded``)."""
    fq, fkv = _folds(Q, K, V)
    (q, sq), (k, sk), (v, sv) = _side_rows(Q, fq), _side_rows(K, fkv), _side_rows(V, fkv)
    copy = q is not Q or k is not K or v is not V
    n_q, d = Q.shape[-2:]
    n_k = K.shape[-2]
    bh = Q.numel() // (n_q * d)
    bh_kv = K.numel() // (n_k * d)
    if bh == 0:
        return None, None, copy, (), (fq, fkv)
    d_pad = _d_pad(d)
    cfgs = config or _tuning.config_for(Q.device, n_q, d_pad, Q.dtype)
    so = (n_q * d * fq, d * fq, 1) if fq else (n_q * d, d, 1)
    fits = _tma_fits(Q.device, Q.element_size(), (q.data_ptr(), k.data_ptr(), v.data_ptr(), 0),
                     (sq, sk, sv, so)) and _heads_aligned((fq, fkv), d, Q.element_size())
    folds = dict(FOLD_Q=fq, FOLD_KV=fkv)
    group, heads = bh // bh_kv, Q.shape[-3] if Q.ndim >= 3 else 1
    scalars = (*sq, *sk, *sv, *so, n_q, n_k, group, heads, left or 0, right or 0)
    small = cfgs.small_forward(n_q, bh)
    cfg = small or cfgs.hopper_fwd
    if cfgs.hopper_fwd is not None and fits and _in_hopper_scope(Q, left, right, has_docs):
        sms = torch.cuda.get_device_properties(Q.device).multi_processor_count
        if cfg.persistent and _cdiv(n_q, cfg.block_m) * bh <= sms:  # one wave: no setup to share, nothing to balance
            cfg = dataclasses.replace(cfg, persistent=False)
        kernel = (flash_hopper._hopper_fwd_ws_persistent_kernel if cfg.warp_specialize else
                  flash_hopper._hopper_fwd_persistent_kernel)
        descs = flash_hopper.forward_descs(bh, group, n_q, n_k, sq, sk, sv, so, d,
                                           cfg.block_m // 2 if cfg.warp_specialize else cfg.block_m, cfg.block_n,
                                           Q.dtype, fq, fkv)
        # the warp-specialised consumers' releases without Gluon's warpgroup barriers (``ptx_release``); the leaner
        # softmax (``flash_hopper.LEAN_SOFTMAX``); the skipped rescales (``flash_hopper.RESCALE_THRESHOLD``) in the
        # warp-specialised forward at ``WS_RESCALE_HEAD_DIMS``
        lazy = flash_hopper.RESCALE_THRESHOLD if d in flash_hopper.WS_RESCALE_HEAD_DIMS else 0
        lean = (dict(LEAN=ptx_release.lean(flash_hopper.LEAN_RELEASE), LEAN_L=flash_hopper.LEAN_SOFTMAX,
                     LAZY_RESCALE=lazy)
                if cfg.warp_specialize else
                dict(PACK_P=flash_hopper.LEAN_SOFTMAX, LEAN_L=flash_hopper.LEAN_SOFTMAX))
        launch = _Launch(kernel, dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=right == 0,
                                      STAGES=cfg.num_stages, PERSISTENT=cfg.persistent, **lean, **folds), cfg,
                         descs)
        # (query tile, batch x head) items; the heads slot takes batch x heads, the left side's (no window here) how
        # many heads a group of items spans: K and V of a head, shared by its query group
        order = _tuning.interleave_for(cfg, "fwd", right == 0, bh, 2 * n_k * d * Q.element_size() // group,
                                       _l2_bytes(Q.device)) if cfg.persistent else 1
        scalars = (*scalars[:-3], bh, order, scalars[-1])
        return launch, (_cdiv(n_q, cfg.block_m) * bh, 1, 1), copy, scalars, (fq, fkv)
    cfg = small or cfgs.fwd
    launch = _Launch(_flash_fwd_kernel, dict(HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                             LIMIT_LEFT=_limit(left), LIMIT_RIGHT=_limit(right), HAS_DOCS=has_docs,
                                             EVEN_D=d == d_pad, TMA=cfg.tma and fits,
                                             INPUT_PRECISION=_input_precision(Q.dtype), INTERPRET=_INTERPRETED,
                                             **folds), cfg)
    return launch, (_cdiv(n_q, cfg.block_m), bh, 1), copy, scalars, (fq, fkv)


def flash_backward(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, is_causal: bool = False,
                   config: FlashConfig | None = None, *, deterministic: bool = False,
                   window: tuple[int, int] | None = None, doc_ids: Tensor | None = None,
                   scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the backward; returns (dQ, dK, dV). Default: D preprocessing, the fused dK/dV/dQ-atomic kernel
    and the dQ postprocessing (five matmuls per tile pair); small calls (the config's ``single_max_programs``):
    one kernel for the whole backward. ``deterministic=True``: the atomic-free dK/dV and dQ kernels (seven
    matmuls), bitwise reproducible (so is the single kernel)."""
    left, right, scale = _check_call(Q, K, V, is_causal, window, doc_ids, scale)
    check_grad_output(dO, O)
    _check_runnable(Q)
    return _backward(Q, K, V, O, L, dO, config, bool(deterministic), left, right, doc_ids, _doc_span(doc_ids), scale)


def _backward(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, config: FlashConfig | None,
              deterministic: bool, left: int | None, right: int | None, doc_ids: Tensor | None,
              doc_span: Tensor | None, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """flash_backward on validated inputs (dO is checked against O when its layout is first planned)."""
    if _INTERPRETED and Q.dtype == torch.bfloat16:  # see _interpreter_upcast
        grads = _backward(*_interpreter_upcast(Q, K, V, O), L, dO.float(), config, deterministic, left, right,
                          doc_ids, doc_span, scale)
        return tuple(g.to(t.dtype) for g, t in zip(grads, (Q, K, V), strict=True))
    if dO.dtype != Q.dtype:
        dO = dO.to(Q.dtype)
    key = ("bwd", Q.shape, Q.stride(), K.shape, K.stride(), V.shape, V.stride(), O.shape, O.stride(), dO.shape,
           dO.stride(), L.shape, L.stride(), Q.dtype, Q.device, dO.device, _aligned(Q, K, V, O, dO, L), left, right,
           _doc_key(doc_ids), config, deterministic,
           Q.dtype == torch.float32 and torch.get_float32_matmul_precision())
    plan = _plan(key, lambda: _plan_backward(Q, K, V, O, L, dO, config, deterministic, left, right,
                                             doc_ids is not None))
    return _launch_backward(plan, Q, K, V, O, L, dO, doc_ids, doc_span, scale)


_EAGER_FORMS = [True]  # False inside captured_forms()


@contextlib.contextmanager
def captured_forms():
    """Plan the autograd.Functions' eager calls as captured ones (``_plan_backward``'s ``eager=False``): the
    backward a CUDA graph or a compiled model runs, for timing those kernels alone (``flash-bench``'s kernel times,
    which ``flash_auto``'s table is chosen from)."""
    previous, _EAGER_FORMS[0] = _EAGER_FORMS[0], False
    try:
        yield
    finally:
        _EAGER_FORMS[0] = previous


def _attention_backward(plan: _Plan, Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor,
                        deterministic: bool, doc_ids: Tensor | None, doc_span: Tensor | None,
                        scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """The autograd.Functions' backward (eager) after ``_attention_forward``: O and L are that forward's (fresh,
    contiguous), so only dO's layout is looked up."""
    if _INTERPRETED and Q.dtype == torch.bfloat16:
        return _backward(Q, K, V, O, L, dO, None, deterministic, plan.left, plan.right, doc_ids, doc_span, scale)
    if dO.dtype != Q.dtype:
        dO = dO.to(Q.dtype)
    # host-bound where small (_plan_backward)
    eager = _EAGER_FORMS[0] and not (Q.is_cuda and torch.cuda.is_current_stream_capturing())
    key = (dO.shape, dO.stride(), dO.device, _aligned(dO), deterministic, eager)
    bwd = plan.backward.get(key)
    if bwd is None:
        check_grad_output(dO, O)
        bwd = plan.backward[key] = _plan_backward(Q, K, V, O, L, dO, plan.config, deterministic, plan.left,
                                                  plan.right, doc_ids is not None, eager)
    return _launch_backward(bwd, Q, K, V, O, L, dO, doc_ids, doc_span, scale)


def _launch_backward(plan: tuple, Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor,
                     doc_ids: Tensor | None, doc_span: Tensor | None, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """A call allocates the gradients (and, for the three-kernel forms, D and the dQ accumulator) and launches."""
    mode, copy, launches, bh, n_q, d_pad, (fq, fkv), grads = plan
    if grads == "like":  # contiguous like Q, K and V (_plan_backward)
        dq, dk, dv = torch.empty_like(Q), torch.empty_like(K), torch.empty_like(V)
    else:
        dq, dk, dv = _side_empty(Q, fq), _side_empty(K, fkv), _side_empty(V, fkv)
    if mode is None:
        return dq, dk, dv
    if copy:
        Q, O, dO = (_side_rows(t, fq)[0] for t in (Q, O, dO))
        K, V = (_side_rows(t, fkv)[0] for t in (K, V))
    if not L.is_contiguous():
        L = L.contiguous()
    sides = (scale, scale * LOG2E)
    if mode == "single":
        ((launch, grid, scalars),) = launches
        doc, span = _doc_args(doc_ids, doc_span, L)
        launch(grid, (Q, K, V, O, dO, L, dq, dk, dv, doc, span), (*scalars, *sides))
        return dq, dk, dv
    # one int32 past D's end: the Gluon backward's work counter, zeroed by the preprocess kernel
    delta = Q.new_empty(bh * n_q + 1, dtype=torch.float32)[:-1].view(bh, n_q)
    doc, span = _doc_args(doc_ids, doc_span, delta)
    dq_acc = delta if mode == "deterministic" else Q.new_empty((bh, n_q, d_pad), dtype=torch.float32)
    (pre, pre_grid, pre_scalars), (dkdv, dkdv_grid, dkdv_scalars), (last, last_grid, last_scalars) = launches
    pre(pre_grid, (O, dO, delta, dq_acc), pre_scalars)
    dkdv(dkdv_grid, (Q, K, V, dO, L, delta, dk, dv, dq_acc, doc, span), (*dkdv_scalars, *sides))
    if mode == "deterministic":
        last(last_grid, (Q, K, V, dO, L, delta, dq, doc, span), (*last_scalars, *sides))
    else:
        last(last_grid, (dq_acc, dq), (*last_scalars, scale))
    return dq, dk, dv


def _plan_backward(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, config: FlashConfig | None,
                   deterministic: bool, left: int | None, right: int | None, has_docs: bool,
                   eager: bool = False) -> tuple:
    """(mode: "single", "atomic", "deterministic" or None for an empty batch; whether the inputs need a contiguous
    copy; the launches as (launch, grid, integer arguments); bh; Nq; the padded head dim; the sides' folds; how dQ,
    dK and dV are allocated: "like" Q, K and V by ``torch.empty_like`` where those are contiguous and no side
    is folded (about half the host time of ``new_empty``), else "side" (``_side_empty``)). ``eager``: an
    autograd.Function's call outside CUDA graph capture, which takes the single kernel up to the config's
    ``eager_single_max_pairs`` (the host's time is what such a call costs)."""
    check_grad_output(dO, O)
    fq, fkv = _folds(Q, K, V)
    rows = [_side_rows(t, f) for t, f in ((Q, fq), (K, fkv), (V, fkv), (O, fq), (dO, fq))]
    copy = any(r[0] is not t for r, t in zip(rows, (Q, K, V, O, dO), strict=True))
    sq, sk, sv, so, sdo = (r[1] for r in rows)
    n_q, d = Q.shape[-2:]
    n_k = K.shape[-2]
    bh = Q.numel() // (n_q * d)
    bh_kv = K.numel() // (n_k * d)
    d_pad = _d_pad(d)
    folds = dict(FOLD_Q=fq, FOLD_KV=fkv)
    grads = "like" if not fq and not fkv and Q.is_contiguous() and K.is_contiguous() and V.is_contiguous() else "side"
    if bh == 0:
        return None, copy, (), bh, n_q, d_pad, (fq, fkv), grads
    cfgs = config or _tuning.config_for(Q.device, n_q, d_pad, Q.dtype)
    group, heads = bh // bh_kv, Q.shape[-3] if Q.ndim >= 3 else 1
    prec = _input_precision(Q.dtype)
    common = dict(HEAD_DIM=d, D_PAD=d_pad, LIMIT_LEFT=_limit(left), LIMIT_RIGHT=_limit(right), HAS_DOCS=has_docs,
                  EVEN_D=d == d_pad, INPUT_PRECISION=prec, INTERPRET=_INTERPRETED, **folds)
    sides = (left or 0, right or 0)
    sg = (n_q * d * fq, d * fq, 1) if fq else (n_q * d, d, 1)  # dQ like Q, dK and dV like K and V (_side_empty)
    skv = (n_k * d * fkv, d * fkv, 1) if fkv else (n_k * d, d, 1)
    head_aligned = _heads_aligned((fq, fkv), d, Q.element_size())
    ptr = dict(zip("QKVOd", (r[0].data_ptr() for r in rows), strict=True))
    stride = dict(Q=sq, K=sk, V=sv, O=so, d=sdo)

    def tma_for(cfg: KernelConfig, inputs: str, outputs: tuple) -> bool:
        """Descriptors for every input the kernel reads (by letter; d is dO) and its fresh outputs."""
        return cfg.tma and head_aligned and _tma_fits(Q.device, Q.element_size(),
                                                      (*(ptr[c] for c in inputs), *(0,) * len(outputs)),
                                                      (*(stride[c] for c in inputs), *outputs))

    cfg = cfgs.dkdv
    if (max(_cdiv(n_k, cfg.block_n), _cdiv(n_q, cfg.block_m)) * bh_kv <= cfgs.single_max_programs
            or (eager and bh * n_q * n_k <= cfgs.eager_single_max_pairs)):
        cfg = cfgs.single or cfg
        tma = tma_for(cfg, "QKVOd", (sg, skv))
        grid = (_cdiv(n_k, cfg.block_n) + _cdiv(n_q, cfg.block_m), bh_kv, 1)
        launch = _Launch(_flash_bwd_single_kernel, dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TMA=tma, **common),
                         cfg)
        scalars = (*sq, *sk, *sv, *so, *sdo, *sg, *skv, *skv, n_q, n_k, group, heads // group, *sides)
        return "single", copy, ((launch, grid, scalars),), bh, n_q, d_pad, (fq, fkv), grads
    hopper = cfgs.hopper_bwd
    hopper = (hopper is not None and not deterministic and _in_hopper_scope(Q, left, right, has_docs) and head_aligned
              and _tma_fits(Q.device, Q.element_size(), (ptr["Q"], ptr["K"], ptr["V"], ptr["d"], 0),
                            (sq, sk, sv, sdo, skv)))
    # the atomic-free kernels where they are faster than Triton's atomic dQ (not than the Gluon kernel's)
    deterministic = deterministic or (not cfgs.atomic_dq and not hopper)
    row_block = 16 if _INTERPRETED else 64
    rows_cfg = KernelConfig(row_block, row_block, 4, 1)
    row_grid = (_cdiv(n_q, row_block), bh, 1)
    pre = (_Launch(_flash_bwd_preprocess, dict(HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=row_block,
                                               ZERO_DQ=not deterministic, FOLD_Q=fq), rows_cfg),
           row_grid, (*so, *sdo, n_q))
    # a program per key tile and key/value head: the heads per batch on that axis are the key/value heads
    dkdv_scalars = (*sq, *sk, *sv, *sdo, *skv, *skv, n_q, n_k, group, heads // group, *sides)
    if hopper:
        cfg = cfgs.hopper_bwd
        if cfg.warp_specialize and cfg.persistent:
            raise ValueError("the warp-specialised Gluon backward runs a program per item: a hopper_bwd config with "
                             f"warp_specialize=True needs persistent=False, got {cfg.short()}")
        # the warp-specialised kernel's dV product after dQ's (DQ_EARLY) where that measured faster: full attention at
        # head dim 128 (flash_hopper_bwd's docstring); its ring releases without Gluon's warpgroup barrier at the head
        # dims of ``flash_hopper_bwd.LEAN_RELEASE``
        early = dict(DQ_EARLY=right is None and d == 128, LEAN=ptx_release.lean(d in flash_hopper_bwd.LEAN_RELEASE)) \
            if cfg.warp_specialize else {}
        descs = flash_hopper_bwd.backward_descs(bh_kv, group, n_q, n_k, sq, sk, sv, sdo, skv, d, cfg.block_m,
                                                cfg.block_n, Q.dtype, fq, fkv, cfg.warp_specialize, cfg.tma)
        launch = _Launch(flash_hopper_bwd._hopper_bwd_ws_kernel if cfg.warp_specialize else
                         flash_hopper_bwd._hopper_bwd_dkdv_kernel,
                         dict(HEAD_DIM=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=right == 0,
                              STAGES=cfg.num_stages, DQ_TMA=cfg.tma, PERSISTENT=cfg.persistent, **folds, **early),
                         cfg, descs)
        # work items (key tile, batch x key/value head): the total of those heads where the Triton kernel takes
        # the heads per batch; persistent programs take the items from a counter, in groups of heads whose Q, dO and
        # dQ accumulator rows fit the cache (the left side's slot: no window here)
        order = _tuning.interleave_for(cfg, "bwd", right == 0, bh_kv, group * n_q * d * (2 * Q.element_size() + 4),
                                       _l2_bytes(Q.device)) if cfg.persistent else 1
        dkdv_scalars = (*sq, *sk, *sv, *sdo, *skv, *skv, n_q, n_k, group, bh_kv, order, sides[1])
        grid = (_cdiv(n_k, cfg.block_n) * bh_kv, 1, 1) if cfg.persistent else (_cdiv(n_k, cfg.block_n), bh_kv, 1)
        dkdv = (launch, grid, dkdv_scalars)
    else:
        cfg = cfgs.dkdv if deterministic else cfgs.bwd
        launch = _Launch(_flash_bwd_dkdv_kernel, dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                                      TMA=tma_for(cfg, "QKVd", (skv,)), ATOMIC_DQ=not deterministic,
                                                      **common), cfg)
        dkdv = (launch, (_cdiv(n_k, cfg.block_n), bh_kv, 1), dkdv_scalars)
    if deterministic:
        cfg = cfgs.dq
        tma = tma_for(cfg, "QKVd", (sg,))
        last = (_Launch(_flash_bwd_dq_kernel, dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TMA=tma, **common), cfg),
                (_cdiv(n_q, cfg.block_m), bh, 1), (*sq, *sk, *sv, *sdo, *sg, n_q, n_k, group, heads, *sides))
    else:
        last = (_Launch(_flash_bwd_dq_postprocess, dict(HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=row_block, FOLD_Q=fq),
                        rows_cfg), row_grid, (*sg, n_q))
    return "deterministic" if deterministic else "atomic", copy, (pre, dkdv, last), bh, n_q, d_pad, (fq, fkv), grads


# ------------------------------------------------------------- custom ops (opaque to torch.compile)
# Only used while torch.compile traces (eager calls launch directly: a Python custom op costs tens of
# microseconds per call, which is most of a small attention call). The autograd.Functions check the inputs
# first. A window side of -1 is no limit.
@torch.library.custom_op("cs336_systems::flash_fwd", mutates_args=())
def _flash_fwd_op(Q: Tensor, K: Tensor, V: Tensor, doc_ids: Tensor | None, doc_span: Tensor | None, left: int,
                  right: int, scale: float) -> tuple[Tensor, Tensor]:
    _check_runnable(Q)
    return _forward(Q, K, V, None, _side(left), _side(right), doc_ids, doc_span, scale)


@_flash_fwd_op.register_fake
def _(Q, K, V, doc_ids, doc_span, left, right, scale):  # O in the layout _launch_forward gives it
    return _side_empty(Q, _fold(Q)), Q.new_empty(Q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("cs336_systems::flash_bwd", mutates_args=())
def _flash_bwd_op(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, doc_ids: Tensor | None,
                  doc_span: Tensor | None, left: int, right: int, scale: float,
                  deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    check_grad_output(dO, O)
    return _backward(Q, K, V, O, L, dO, None, deterministic, _side(left), _side(right), doc_ids, doc_span, scale)


@_flash_bwd_op.register_fake
def _(Q, K, V, O, L, dO, doc_ids, doc_span, left, right, scale, deterministic):  # as _launch_backward allocates
    fq, fkv = _folds(Q, K, V)
    return _side_empty(Q, fq), _side_empty(K, fkv), _side_empty(V, fkv)


def _side(limit: int | None) -> int | None:
    """A window side between the op encoding (-1: no limit) and the launchers' (None: no limit)."""
    if limit is None:
        return -1
    return None if limit < 0 else limit


def _run_forward(ctx, Q: Tensor, K: Tensor, V: Tensor, mask: tuple, doc_ids: Tensor | None,
                 scale: float | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """The Functions' forward: O, L and the documents' spans. Eagerly through the call's plan, under torch.compile
    the full checks and the opaque custom op; the inputs are checked before anything runs on them. Keeps in ctx
    what the backward needs besides the saved tensors."""
    if torch.compiler.is_compiling():
        left, right = _checked_mask(Q, K, V, mask, doc_ids)
        scale = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else scale
        doc_span = _doc_span(doc_ids)
        O, L = _flash_fwd_op(Q, K, V, doc_ids, doc_span, _side(left), _side(right), scale)
        ctx.plan, ctx.mask = None, (left, right, scale)
        return O, L, doc_span
    plan = _plan_for(Q, K, V, mask, doc_ids, None)
    ctx.plan = plan
    eager = plan.eager
    if eager is not None and scale is None:  # the common call in the fewest host steps (_eager_forward)
        launch, grid, scalars, shape, strides, persistent = eager
        O = torch.empty_like(Q)
        L = torch.empty_strided(shape, strides, dtype=torch.float32, device=Q.device)
        launch(grid, (Q, K, V, O, L, _work_counter(Q.device) if persistent else L, L), scalars)
        ctx.mask = plan.mask
        return O, L, None
    scale = plan.scale if scale is None else scale
    doc_span = _doc_span(doc_ids)
    O, L = _attention_forward(plan, Q, K, V, doc_ids, doc_span, scale)
    ctx.mask = (plan.left, plan.right, scale)
    return O, L, doc_span


def _run_backward(ctx, dO: Tensor, L: Tensor, Q: Tensor, K: Tensor, V: Tensor, O: Tensor, doc_ids: Tensor | None,
                  doc_span: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    deterministic = ctx.deterministic or torch.are_deterministic_algorithms_enabled()
    left, right, scale = ctx.mask
    if ctx.plan is None or torch.compiler.is_compiling():
        return _flash_bwd_op(Q, K, V, O, L, dO, doc_ids, doc_span, _side(left), _side(right), scale, deterministic)
    return _attention_backward(ctx.plan, Q, K, V, O, L, dO, deterministic, doc_ids, doc_span, scale)


def _check_deterministic(deterministic) -> None:
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be a bool (True or False), got {deterministic!r}")


# ----------------------------------------------------------------------------------- autograd.Functions
_FUNCTION_APPLY = torch.autograd.Function.apply.__func__
_transforms_active = torch._C._are_functorch_transforms_active
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


class _DirectApply(torch.autograd.Function):
    """``apply`` without ``Function.apply``'s Python wrapper (issue 18: a small call's time is the host's). That
    wrapper binds default arguments only for Functions with a ``setup_context`` (ours have none), routes functorch
    transforms (vmap, grad) and unwraps dead functorch wrappers; this does the same checks in C calls and goes
    straight to the C ``apply``. Keyword arguments and active transforms take the wrapper; Dynamo traces
    ``apply`` by name, so what it compiles is unchanged."""

    @classmethod
    def apply(cls, *args, **kwargs):
        if torch.compiler.is_dynamo_compiling():  # Dynamo only traces this: ``cls.apply`` is the call it knows
            return cls.apply(*args, **kwargs)
        if kwargs or _transforms_active():
            return _FUNCTION_APPLY(cls, *args, **kwargs)
        return cls._c_apply(*[_unwrap_if_dead(a) if isinstance(a, Tensor) else a for a in args])

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._c_apply = super(torch.autograd.Function, cls).apply  # the C apply, bound to this class


class FlashAttention2Triton(_DirectApply):
    """FlashAttention-2 with Triton kernels. ``apply(Q, K, V, is_causal=False, deterministic=False) -> O``;
    causal masking is top-left aligned (query i sees keys 0..i). Saves L (``Q.shape[:-1]``, natural-log
    logsumexp), Q, K, V, O for the backward. ``deterministic`` (or
    ``torch.use_deterministic_algorithms(True)``) selects the atomic-free backward. The course's interface:
    grouped heads, windows and documents go through :func:`flash_attention`. Inputs are checked once per layout
    (``_plan_for``), before any kernel."""

    @staticmethod
    def forward(ctx, Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False, deterministic: bool = False) -> Tensor:
        if type(is_causal) is not bool:
            check_is_causal(is_causal)
        if type(deterministic) is not bool:
            _check_deterministic(deterministic)
        O, L, _ = _run_forward(ctx, Q, K, V, ("apply", is_causal), None, None)
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.deterministic = deterministic
        return O

    @staticmethod
    def backward(ctx, dO: Tensor):
        L, Q, K, V, O = ctx.saved_tensors
        return *_run_backward(ctx, dO, L, Q, K, V, O, None, None), None, None


class FlashAttentionTriton(_DirectApply):
    """:func:`flash_attention`'s autograd.Function: ``apply(Q, K, V, doc_ids, is_causal, window, scale,
    deterministic)`` with the scalar arguments checked (the tensors are checked once per layout). Saves L, Q, K,
    V, O, doc_ids and their spans."""

    @staticmethod
    def forward(ctx, Q: Tensor, K: Tensor, V: Tensor, doc_ids: Tensor | None, is_causal: bool,
                window: tuple[int, int] | None, scale: float | None, deterministic: bool) -> Tensor:
        O, L, doc_span = _run_forward(ctx, Q, K, V, ("attn", is_causal, window), doc_ids, scale)
        ctx.save_for_backward(L, Q, K, V, O, doc_ids, doc_span)
        ctx.deterministic = deterministic
        return O

    @staticmethod
    def backward(ctx, dO: Tensor):
        L, Q, K, V, O, doc_ids, doc_span = ctx.saved_tensors
        return *_run_backward(ctx, dO, L, Q, K, V, O, doc_ids, doc_span), None, None, None, None, None


def flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, *,
                    window: tuple[int, int] | None = None, doc_ids: Tensor | None = None, scale: float | None = None,
                    deterministic: bool = False) -> Tensor:
    """softmax(scale * q k^T + mask) v with Triton forward and backward kernels, differentiable.

    - ``q`` (..., Hq, Nq, d), ``k`` and ``v`` (..., Hkv, Nk, d) with Hq a multiple of Hkv: query head h reads
      key/value head h // (Hq // Hkv) (grouped-query; Hkv = 1 is multi-query); dK and dV sum over each group.
      (..., N, d) inputs with equal leading dims behave as ``FlashAttention2Triton``.
    - ``is_causal``: query i sees keys j <= i (top-left aligned).
    - ``window=(left, right)``: query i sees keys i - left <= j <= i + right (with ``is_causal`` the right side
      is 0); None: no limit.
    - ``doc_ids`` (batch, N) integers (needs Nq == Nk): query i sees key j only where their ids are equal.
      Tiles are skipped where the ids of a sequence are sorted (packed documents); any ids are correct.
    - ``scale``: default 1/sqrt(d). ``deterministic``: the atomic-free, bitwise-reproducible backward.
    Tiles with no visible pair are never loaded. A query row that sees no key (a window with Nq > Nk) gets
    output 0, L = -inf and zero gradients.
    """
    check_is_causal(is_causal)
    check_window(window)
    check_scale(scale)
    _check_deterministic(deterministic)
    window = None if window is None else (int(window[0]), int(window[1]))
    return FlashAttentionTriton.apply(q, k, v, doc_ids, is_causal, window, None if scale is None else float(scale),
                                      deterministic)


def flash_attention_triton(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False, *,
                           deterministic: bool = False) -> Tensor:
    """``FlashAttention2Triton.apply`` with the backward's mode as a keyword."""
    return FlashAttention2Triton.apply(Q, K, V, is_causal, deterministic)


@register_attention_backend("flash_triton")
def flash_triton_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, *,
                           window: tuple[int, int] | None = None, doc_ids: Tensor | None = None) -> Tensor:
    """Attention backend ``flash_triton``: q (B, Hq, T, d), k and v (B, Hkv, T, d); :func:`flash_attention`."""
    return flash_attention(q, k, v, is_causal, window=window, doc_ids=doc_ids)


__all__ = ["FlashAttention2Triton", "FlashAttentionTriton", "flash_attention", "flash_attention_triton",
           "flash_backward", "flash_forward", "flash_triton_attention"]
