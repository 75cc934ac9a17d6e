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
reproducible).

Causal (top-left aligned: query i sees keys 0..i, also when Nq != Nk): tiles entirely above the diagonal
are never visited; tiles entirely below it run a loop with no index comparisons; only tiles crossing the
diagonal (or the end of the sequence) are masked. Causal programs are launched heaviest first.

One kernel per pass, two ways to address memory (``TMA`` constexpr, chosen per launch): tensor
descriptors (``tl.make_tensor_descriptor``, built on the device per program and batch-head: loads and
stores through Hopper's TMA unit, out-of-bounds rows zero-filled and clipped) where the tensors allow it
(unit stride along d, 16-byte aligned bases and strides, sm_90+), else block pointers (any strides; any
GPU; the CPU interpreter). ``_tile_src`` / ``_load_rows`` / ``_store_rows`` hide the difference.

Supported: Q ``(..., Nq, d)``, K and V ``(..., Nk, d)`` with any leading dims (flattened into one
batch x heads grid axis); any Nq, Nk >= 1; head dim 16..256, non-powers of two padded to the next power
of two inside the kernel; fp16, bf16, fp32 (fp32 dots use TF32 unless
``torch.get_float32_matmul_precision() == "highest"``, PyTorch's default, in which case they are IEEE
fp32); non-contiguous inputs and gradients. Not supported (``ValueError``): mismatched head dims, K and V
of different lengths, mixed dtypes or devices, head dims outside 16..256, other dtypes, a non-bool
``is_causal``. CPU tensors run through the Triton interpreter, which needs ``TRITON_INTERPRET=1`` in the
environment before this module is imported.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from cs336_basics.attention import register_attention_backend
from cs336_systems.attention import _tuning
from cs336_systems.attention._common import check_attention_inputs, check_grad_output, check_is_causal
from cs336_systems.attention._tuning import FlashConfig, KernelConfig

LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------- kernels
@triton.jit
def _tile_src(base, n_rows, stride_row, stride_d, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
              D_PAD: tl.constexpr, TMA: tl.constexpr):
    """Rows of one batch-head's ``(n_rows, HEAD_DIM)`` matrix, ``BLOCK`` at a time: a tensor descriptor
    (TMA) or a block pointer at row 0. Blocks are ``D_PAD`` wide; columns past HEAD_DIM read as zero."""
    if TMA:
        src = tl.make_tensor_descriptor(base, shape=[n_rows, HEAD_DIM], strides=[stride_row, 1],
                                        block_shape=[BLOCK, D_PAD])
    else:
        src = tl.make_block_ptr(base, shape=(n_rows, HEAD_DIM), strides=(stride_row, stride_d), offsets=(0, 0),
                                block_shape=(BLOCK, D_PAD), order=(1, 0))
    return src


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
def _query_tile_bounds(start_m, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """For a query tile at start_m: key tiles [0, full_hi) need no mask, [full_hi, mask_hi) are masked
    (causal: crossing the diagonal; or running past N_K); later ones are never visited."""
    if IS_CAUSAL:
        full_hi = tl.minimum((start_m + 1) // BLOCK_N, N_K // BLOCK_N) * BLOCK_N
        mask_hi = tl.minimum(start_m + BLOCK_M, N_K)
    else:
        full_hi = (N_K // BLOCK_N) * BLOCK_N
        mask_hi = N_K
    return full_hi, mask_hi


@triton.jit
def _key_tile_bounds(start_n, N_Q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """For a key tile at start_n: query tiles [lo, mid) are masked (crossing the diagonal), [mid, full_end)
    unmasked, [tail, end) masked (past N_Q); earlier query tiles see none of these keys."""
    end = tl.cdiv(N_Q, BLOCK_M) * BLOCK_M
    full_end = (N_Q // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, end)
    else:
        lo = 0
        mid = 0
    tail = tl.maximum(mid, full_end)
    return lo, mid, full_end, tail, end


# Forward ------------------------------------------------------------------------------------------------
@triton.jit
def _fwd_step(acc, l_i, m_i, q, k_src, v_src, offs_m, start_n, N_K, qk_scale, BLOCK_N: tl.constexpr,
              EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, TMA: tl.constexpr,
              INPUT_PRECISION: tl.constexpr):
    """One key tile of the online softmax (Algorithm 1, lines 8-13)."""
    k = _load_rows(k_src, start_n, MASKED, not EVEN_D, TMA)
    qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # (BLOCK_M, BLOCK_N), fp32
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = offs_n[None, :] < N_K
        if IS_CAUSAL:
            visible = visible & (offs_m[:, None] >= offs_n[None, :])
        qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # finite: every row sees key 0 in its first tile
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load_rows(v_src, start_n, MASKED, not EVEN_D, TMA)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, lo, hi, N_K, qk_scale, BLOCK_N: tl.constexpr,
              EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, TMA: tl.constexpr,
              INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Key tiles [lo, hi). A pipelined ``for`` when compiled; a ``while`` in the interpreter, whose
    ``range`` cannot take run-time bounds under numpy >= 2.4."""
    if INTERPRET:
        start_n = lo
        while start_n < hi:
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, offs_m, start_n, N_K, qk_scale, BLOCK_N,
                                      EVEN_D, MASKED, IS_CAUSAL, TMA, INPUT_PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, k_src, v_src, offs_m, start_n, N_K, qk_scale, BLOCK_N,
                                      EVEN_D, MASKED, IS_CAUSAL, TMA, INPUT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, L, stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                      stride_vb, stride_vn, stride_vd, stride_ob, stride_om, stride_od, N_Q, N_K, qk_scale,
                      HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, TMA: tl.constexpr,
                      INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    pid_m = tl.program_id(0)
    if IS_CAUSAL:  # the last query tiles see the most keys: launch them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    q_src = _tile_src(Q + bh * stride_qb, N_Q, stride_qm, stride_qd, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    k_src = _tile_src(K + bh * stride_kb, N_K, stride_kn, stride_kd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    v_src = _tile_src(V + bh * stride_vb, N_K, stride_vn, stride_vd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    q = _load_rows(q_src, start_m, True, not EVEN_D, TMA)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    full_hi, mask_hi = _query_tile_bounds(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, 0, full_hi, N_K, qk_scale, BLOCK_N, EVEN_D,
                              False, IS_CAUSAL, TMA, INPUT_PRECISION, INTERPRET)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, k_src, v_src, offs_m, full_hi, mask_hi, N_K, qk_scale, BLOCK_N,
                              EVEN_D, True, IS_CAUSAL, TMA, INPUT_PRECISION, INTERPRET)
    acc = acc / l_i[:, None]  # Algorithm 1 line 15
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # line 16, back to natural log
    o_dst = _tile_src(O + bh * stride_ob, N_Q, stride_om, stride_od, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    _store_rows(o_dst, start_m, acc.to(O.dtype.element_ty), TMA)
    tl.store(L + bh * N_Q + offs_m, lse, mask=offs_m < N_Q)


# Backward -----------------------------------------------------------------------------------------------
@triton.jit
def _flash_bwd_preprocess(O, DO, Delta, DQ_ACC, stride_ob, stride_om, stride_od, stride_dob, stride_dom,
                          stride_dod, N_Q, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                          ZERO_DQ: tl.constexpr):
    """D = rowsum(O * dO) in fp32 ``(BH, Nq)``; with ZERO_DQ also zeroes the fp32 dQ accumulator
    ``(BH, Nq, D_PAD)`` (one launch instead of a memset)."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + bh * stride_ob + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=mask,
                other=0.0)
    do = tl.load(DO + bh * stride_dob + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod, mask=mask,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + bh * N_Q + offs_m, delta, mask=offs_m < N_Q)
    if ZERO_DQ:
        tl.store(DQ_ACC + (bh * N_Q + offs_m[:, None]) * D_PAD + offs_d[None, :],
                 tl.zeros((BLOCK_M, D_PAD), tl.float32), mask=offs_m[:, None] < N_Q)


@triton.jit
def _row_stats(L, Delta, offs_m, N_Q, MASKED: tl.constexpr):
    """log2-unit logsumexp and D of the query rows offs_m (L and Delta already offset to the batch-head)."""
    if MASKED:
        lse2 = tl.load(L + offs_m, mask=offs_m < N_Q, other=0.0) * 1.4426950408889634
        delta = tl.load(Delta + offs_m, mask=offs_m < N_Q, other=0.0)
    else:
        lse2 = tl.load(L + offs_m) * 1.4426950408889634
        delta = tl.load(Delta + offs_m)
    return lse2, delta


@triton.jit
def _dkdv_step(dk, dv, k, v, q_src, do_src, dq_dst, L, Delta, offs_n, start_m, N_Q, qk_scale,
               BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr,
               IS_CAUSAL: tl.constexpr, TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr,
               INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """One query tile's contribution to dK, dV of a key tile on transposed score tiles; with ATOMIC_DQ
    also its dS K added to the query tile's rows of the fp32 dQ accumulator (the fifth matmul)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_rows(q_src, start_m, MASKED, not EVEN_D, TMA)
    lse2, delta = _row_stats(L, Delta, offs_m, N_Q, MASKED)
    sT = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_M) = S^T, eq. 13
    pT = tl.math.exp2(sT * qk_scale - lse2[None, :])  # eq. 14 in log2 units
    if MASKED:
        visible = offs_m[None, :] < N_Q
        if IS_CAUSAL:
            visible = visible & (offs_m[None, :] >= offs_n[:, None])
        pT = tl.where(visible, pT, 0.0)
    do = _load_rows(do_src, start_m, MASKED, not EVEN_D, TMA)
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)  # eq. 15
    dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # eq. 16, transposed
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
def _dkdv_loop(dk, dv, k, v, q_src, do_src, dq_dst, L, Delta, offs_n, lo, hi, N_Q, qk_scale,
               BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr,
               IS_CAUSAL: tl.constexpr, TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr,
               INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Query tiles [lo, hi) (see _fwd_loop for the two loop forms)."""
    if INTERPRET:
        start_m = lo
        while start_m < hi:
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, dq_dst, L, Delta, offs_n, start_m, N_Q, qk_scale,
                                BLOCK_M, D_PAD, EVEN_D, MASKED, IS_CAUSAL, TMA, ATOMIC_DQ, INPUT_PRECISION,
                                INTERPRET)
            start_m += BLOCK_M
    else:
        for start_m in range(lo, hi, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, q_src, do_src, dq_dst, L, Delta, offs_n, start_m, N_Q, qk_scale,
                                BLOCK_M, D_PAD, EVEN_D, MASKED, IS_CAUSAL, TMA, ATOMIC_DQ, INPUT_PRECISION,
                                INTERPRET)
    return dk, dv


@triton.jit
def _flash_bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV, DQ_ACC,
                           stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                           stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod,
                           stride_dkb, stride_dkn, stride_dkd, stride_dvb, stride_dvn, stride_dvd,
                           N_Q, N_K, sm_scale, qk_scale,
                           HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                           TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                           INTERPRET: tl.constexpr):
    """A program per key tile: dK, dV of its keys (and, with ATOMIC_DQ, every dQ contribution)."""
    start_n = tl.program_id(0) * BLOCK_N  # causal: the first key tiles, seen by the most queries, go first
    bh = tl.program_id(1).to(tl.int64)
    L += bh * N_Q
    Delta += bh * N_Q
    q_src = _tile_src(Q + bh * stride_qb, N_Q, stride_qm, stride_qd, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    do_src = _tile_src(DO + bh * stride_dob, N_Q, stride_dom, stride_dod, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    k_src = _tile_src(K + bh * stride_kb, N_K, stride_kn, stride_kd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    v_src = _tile_src(V + bh * stride_vb, N_K, stride_vn, stride_vd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    if ATOMIC_DQ and TMA and not INTERPRET:
        dq_dst = tl.make_tensor_descriptor(DQ_ACC + bh * N_Q * D_PAD, shape=[N_Q, D_PAD], strides=[D_PAD, 1],
                                           block_shape=[BLOCK_M, D_PAD])
    else:
        dq_dst = DQ_ACC + bh * N_Q * D_PAD
    # Key rows past N_K are zero and their dK/dV rows are never stored: no key mask is needed here.
    k = _load_rows(k_src, start_n, True, not EVEN_D, TMA)
    v = _load_rows(v_src, start_n, True, not EVEN_D, TMA)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    dk = tl.zeros((BLOCK_N, D_PAD), tl.float32)
    dv = tl.zeros((BLOCK_N, D_PAD), tl.float32)
    lo, mid, full_end, tail, end = _key_tile_bounds(start_n, N_Q, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dk, dv = _dkdv_loop(dk, dv, k, v, q_src, do_src, dq_dst, L, Delta, offs_n, lo, mid, N_Q, qk_scale, BLOCK_M,
                        D_PAD, EVEN_D, True, IS_CAUSAL, TMA, ATOMIC_DQ, INPUT_PRECISION, INTERPRET)
    dk, dv = _dkdv_loop(dk, dv, k, v, q_src, do_src, dq_dst, L, Delta, offs_n, mid, full_end, N_Q, qk_scale,
                        BLOCK_M, D_PAD, EVEN_D, False, IS_CAUSAL, TMA, ATOMIC_DQ, INPUT_PRECISION, INTERPRET)
    dk, dv = _dkdv_loop(dk, dv, k, v, q_src, do_src, dq_dst, L, Delta, offs_n, tail, end, N_Q, qk_scale,
                        BLOCK_M, D_PAD, EVEN_D, True, IS_CAUSAL, TMA, ATOMIC_DQ, INPUT_PRECISION, INTERPRET)
    dk_dst = _tile_src(DK + bh * stride_dkb, N_K, stride_dkn, stride_dkd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    dv_dst = _tile_src(DV + bh * stride_dvb, N_K, stride_dvn, stride_dvd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    _store_rows(dk_dst, start_n, (dk * sm_scale).to(DK.dtype.element_ty), TMA)
    _store_rows(dv_dst, start_n, dv.to(DV.dtype.element_ty), TMA)


@triton.jit
def _flash_bwd_dq_postprocess(DQ_ACC, DQ, stride_dqb, stride_dqm, stride_dqd, N_Q, sm_scale,
                              HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """dQ = sm_scale * accumulator, cast to the input dtype."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    acc = tl.load(DQ_ACC + (bh * N_Q + offs_m[:, None]) * D_PAD + offs_d[None, :], mask=offs_m[:, None] < N_Q,
                  other=0.0)
    tl.store(DQ + bh * stride_dqb + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd,
             (acc * sm_scale).to(DQ.dtype.element_ty), mask=(offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _dq_step(dq, q, do, lse2, delta, k_src, v_src, offs_m, start_n, N_K, qk_scale, BLOCK_N: tl.constexpr,
             EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, TMA: tl.constexpr,
             INPUT_PRECISION: tl.constexpr):
    """One key tile's contribution to dQ of a query tile (eqs. 13-18), recomputing P (deterministic mode)."""
    k = _load_rows(k_src, start_n, MASKED, not EVEN_D, TMA)
    v = _load_rows(v_src, start_n, MASKED, not EVEN_D, TMA)
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # eq. 13
    p = tl.math.exp2(s * qk_scale - lse2[:, None])  # eq. 14
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = offs_n[None, :] < N_K
        if IS_CAUSAL:
            visible = visible & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)  # eq. 16
    ds = p * (dp - delta[:, None])  # eq. 17
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)  # eq. 18 (unscaled)


@triton.jit
def _dq_loop(dq, q, do, lse2, delta, k_src, v_src, offs_m, lo, hi, N_K, qk_scale, BLOCK_N: tl.constexpr,
             EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, TMA: tl.constexpr,
             INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Key tiles [lo, hi) (see _fwd_loop for the two loop forms)."""
    if INTERPRET:
        start_n = lo
        while start_n < hi:
            dq = _dq_step(dq, q, do, lse2, delta, k_src, v_src, offs_m, start_n, N_K, qk_scale, BLOCK_N, EVEN_D,
                          MASKED, IS_CAUSAL, TMA, INPUT_PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_step(dq, q, do, lse2, delta, k_src, v_src, offs_m, start_n, N_K, qk_scale, BLOCK_N, EVEN_D,
                          MASKED, IS_CAUSAL, TMA, INPUT_PRECISION)
    return dq


@triton.jit
def _flash_bwd_dq_kernel(Q, K, V, DO, L, Delta, DQ,
                         stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                         stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod,
                         stride_dqb, stride_dqm, stride_dqd, N_Q, N_K, sm_scale, qk_scale,
                         HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                         TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Deterministic mode: a program per query tile walks its key tiles and writes its dQ rows once."""
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    q_src = _tile_src(Q + bh * stride_qb, N_Q, stride_qm, stride_qd, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    do_src = _tile_src(DO + bh * stride_dob, N_Q, stride_dom, stride_dod, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    k_src = _tile_src(K + bh * stride_kb, N_K, stride_kn, stride_kd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    v_src = _tile_src(V + bh * stride_vb, N_K, stride_vn, stride_vd, HEAD_DIM, BLOCK_N, D_PAD, TMA)
    q = _load_rows(q_src, start_m, True, not EVEN_D, TMA)
    do = _load_rows(do_src, start_m, True, not EVEN_D, TMA)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    lse2, delta = _row_stats(L + bh * N_Q, Delta + bh * N_Q, offs_m, N_Q, True)
    dq = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    full_hi, mask_hi = _query_tile_bounds(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq = _dq_loop(dq, q, do, lse2, delta, k_src, v_src, offs_m, 0, full_hi, N_K, qk_scale, BLOCK_N, EVEN_D, False,
                  IS_CAUSAL, TMA, INPUT_PRECISION, INTERPRET)
    dq = _dq_loop(dq, q, do, lse2, delta, k_src, v_src, offs_m, full_hi, mask_hi, N_K, qk_scale, BLOCK_N, EVEN_D,
                  True, IS_CAUSAL, TMA, INPUT_PRECISION, INTERPRET)
    dq_dst = _tile_src(DQ + bh * stride_dqb, N_Q, stride_dqm, stride_dqd, HEAD_DIM, BLOCK_M, D_PAD, TMA)
    _store_rows(dq_dst, start_m, (dq * sm_scale).to(DQ.dtype.element_ty), TMA)


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


def _as_3d(t: Tensor) -> Tensor:
    """(..., N, d) -> (BH, N, d); a view where the strides allow, and unit stride along d."""
    t3 = t if t.ndim == 3 else t.reshape(-1, t.shape[-2], t.shape[-1])
    return t3 if t3.stride(-1) == 1 or t3.shape[-1] == 1 else t3.contiguous()


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


def _tma_ready(*tensors: Tensor) -> bool:
    """Whether per-batch-head 2-D descriptors can describe these (BH, N, d) tensors: unit stride along d,
    16-byte aligned bases, row strides and batch-head strides."""
    if not _has_tma(tensors[0].device):
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(2) != 1 or (t.data_ptr() % 16) or (t.stride(1) * size) % 16 or (t.stride(0) * size) % 16:
            return False
    return True


_WORKSPACES: dict[tuple[int, int], Tensor] = {}


def _tma_workspace(size: int, alignment: int, stream: int) -> Tensor:
    """Global memory in which the kernels build their tensor descriptors (one per program and tensor).
    One buffer per (device, stream), grown when too small: kernels on one stream run one after another,
    so they can share it, and a call allocates nothing."""
    key = (torch.cuda.current_device(), stream)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < size:
        buf = _WORKSPACES[key] = torch.empty(max(size, 1 << 16), dtype=torch.int8, device="cuda")
    return buf


def _use_tma(cfg: KernelConfig, *tensors: Tensor) -> bool:
    if not (cfg.tma and _tma_ready(*tensors)):
        return False
    if not _INTERPRETED:
        # Triton keeps the allocator in a ContextVar: set it in the thread that launches (autograd runs the
        # backward in its own thread).
        triton.set_allocator(_tma_workspace)
    return True


_LAUNCHES: dict[tuple, tuple] = {}


def _layout(*tensors: Tensor) -> tuple:
    """What Triton specialises a launch on for these tensors (plus shapes and strides, which fix the
    integer arguments): a cache key for ``_launch``."""
    return tuple((t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0) for t in tensors)


def _launch(kernel, key: tuple, grid: tuple[int, int, int], args: tuple, constexprs: dict, cfg: KernelConfig) -> None:
    """``kernel[grid](*args, **constexprs)``. ``key`` must determine everything Triton specialises the
    launch on (dtypes, 16-byte alignment of pointers, integer arguments, constexprs, warps and stages):
    the first launch of a key goes through Triton's JIT (compiling if needed) and keeps the compiled
    kernel; later ones call it directly, skipping the JIT's per-call binding and specialisation of ~30
    arguments (most of a small call's host time)."""
    hit = _LAUNCHES.get(key)
    if hit is not None:
        compiled, tail = hit
        compiled[grid](*args, *tail)
        return
    compiled = kernel[grid](*args, **constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if not _INTERPRETED and compiled is not None:
        if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
            compiled = compiled.result()
        names = kernel.arg_names[len(args):]  # the constexprs, in signature order, follow the run-time args
        _LAUNCHES[key] = (compiled, tuple(constexprs[n] for n in names))


def flash_forward(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False,
                  config: FlashConfig | None = None) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel: returns O (like Q) and the logsumexp L (fp32, ``Q.shape[:-1]``)."""
    check_is_causal(is_causal)
    check_attention_inputs(Q, K, V)
    _check_runnable(Q)
    return _forward(Q, K, V, is_causal, config)


def _forward(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool, config: FlashConfig | None) -> tuple[Tensor, Tensor]:
    """flash_forward on validated inputs."""
    if _INTERPRETED and Q.dtype == torch.bfloat16:  # see _interpreter_upcast
        o, lse = _forward(*_interpreter_upcast(Q, K, V), is_causal, config)
        return o.to(Q.dtype), lse
    q, k, v = _as_3d(Q), _as_3d(K), _as_3d(V)
    bh, n_q, d = q.shape
    n_k = k.shape[1]
    d_pad = _d_pad(d)
    cfg = (config or _tuning.config_for(Q.device, n_q, d_pad, Q.dtype)).fwd
    o = torch.empty((bh, n_q, d), device=Q.device, dtype=Q.dtype)
    lse = torch.empty((bh, n_q), device=Q.device, dtype=torch.float32)
    if bh == 0:  # an empty batch: nothing to launch (a grid axis of 0 is not a valid launch)
        return o.view(Q.shape), lse.view(Q.shape[:-1])
    tma = _use_tma(cfg, q, k, v, o)
    prec = _input_precision(Q.dtype)
    _launch(_flash_fwd_kernel, ("fwd", _layout(q, k, v), Q.device, is_causal, cfg, tma, prec),
            (_cdiv(n_q, cfg.block_m), bh, 1),
            (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), n_q, n_k, LOG2E / math.sqrt(d)),
            dict(HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=is_causal,
                 EVEN_D=d == d_pad, TMA=tma, INPUT_PRECISION=prec, INTERPRET=_INTERPRETED), cfg)
    return o.view(Q.shape), lse.view(Q.shape[:-1])


def flash_backward(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, is_causal: bool = False,
                   config: FlashConfig | None = None, *, deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the backward; returns (dQ, dK, dV). Default: D preprocessing, the fused dK/dV/dQ-atomic kernel
    and the dQ postprocessing (five matmuls per tile pair). ``deterministic=True``: the atomic-free dK/dV
    and dQ kernels (seven matmuls), bitwise reproducible."""
    check_is_causal(is_causal)
    check_attention_inputs(Q, K, V)
    check_grad_output(dO, O)
    _check_runnable(Q)
    return _backward(Q, K, V, O, L, dO, is_causal, config, bool(deterministic))


def _backward(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, is_causal: bool,
              config: FlashConfig | None, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """flash_backward on validated inputs (dO is only checked against O here)."""
    if _INTERPRETED and Q.dtype == torch.bfloat16:  # see _interpreter_upcast
        grads = _backward(*_interpreter_upcast(Q, K, V, O), L, dO.float(), is_causal, config, deterministic)
        return tuple(g.to(t.dtype) for g, t in zip(grads, (Q, K, V), strict=True))
    if dO.dtype != Q.dtype:
        dO = dO.to(Q.dtype)
    q, k, v, o, do = _as_3d(Q), _as_3d(K), _as_3d(V), _as_3d(O), _as_3d(dO)
    bh, n_q, d = q.shape
    n_k = k.shape[1]
    d_pad = _d_pad(d)
    cfgs = config or _tuning.config_for(Q.device, n_q, d_pad, Q.dtype)
    lse = L.reshape(bh, n_q)
    if not lse.is_contiguous():
        lse = lse.contiguous()
    dev = Q.device
    delta = torch.empty((bh, n_q), device=dev, dtype=torch.float32)
    dq = torch.empty((bh, n_q, d), device=dev, dtype=Q.dtype)
    dk = torch.empty((bh, n_k, d), device=dev, dtype=K.dtype)
    dv = torch.empty((bh, n_k, d), device=dev, dtype=V.dtype)
    if bh == 0:
        return dq.view(Q.shape), dk.view(K.shape), dv.view(V.shape)
    dq_acc = delta if deterministic else torch.empty((bh, n_q, d_pad), device=dev, dtype=torch.float32)
    sm_scale = 1.0 / math.sqrt(d)
    prec = _input_precision(Q.dtype)
    plan = (_layout(q, k, v, o, do, lse), dev, is_causal, cfgs, deterministic, prec)
    common = dict(HEAD_DIM=d, D_PAD=d_pad, IS_CAUSAL=is_causal, EVEN_D=d == d_pad, INPUT_PRECISION=prec,
                  INTERPRET=_INTERPRETED)
    row_block = 16 if _INTERPRETED else 64
    rows_cfg = KernelConfig(row_block, row_block, 4, 1)
    _launch(_flash_bwd_preprocess, ("pre", plan), (_cdiv(n_q, row_block), bh, 1),
            (o, do, delta, dq_acc, *o.stride(), *do.stride(), n_q),
            dict(HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=row_block, ZERO_DQ=not deterministic), rows_cfg)
    cfg = cfgs.dkdv if deterministic else cfgs.bwd
    tma = _use_tma(cfg, q, k, v, do, dk, dv)
    _launch(_flash_bwd_dkdv_kernel, ("dkdv", plan, tma), (_cdiv(n_k, cfg.block_n), bh, 1),
            (q, k, v, do, lse, delta, dk, dv, dq_acc, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
             *dk.stride(), *dv.stride(), n_q, n_k, sm_scale, sm_scale * LOG2E),
            dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TMA=tma, ATOMIC_DQ=not deterministic, **common), cfg)
    if deterministic:
        cfg = cfgs.dq
        tma = _use_tma(cfg, q, k, v, do, dq)
        _launch(_flash_bwd_dq_kernel, ("dq", plan, tma), (_cdiv(n_q, cfg.block_m), bh, 1),
                (q, k, v, do, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
                 n_q, n_k, sm_scale, sm_scale * LOG2E),
                dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TMA=tma, **common), cfg)
    else:
        _launch(_flash_bwd_dq_postprocess, ("post", plan), (_cdiv(n_q, row_block), bh, 1),
                (dq_acc, dq, *dq.stride(), n_q, sm_scale), dict(HEAD_DIM=d, D_PAD=d_pad, BLOCK_M=row_block),
                rows_cfg)
    return dq.view(Q.shape), dk.view(K.shape), dv.view(V.shape)


# ------------------------------------------------------------- custom ops (opaque to torch.compile)
# Only used while torch.compile traces (eager calls launch directly: a Python custom op costs tens of
# microseconds per call, which is most of a small attention call). The autograd.Function validates.
@torch.library.custom_op("cs336_systems::flash_fwd", mutates_args=())
def _flash_fwd_op(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    _check_runnable(Q)
    return _forward(Q, K, V, is_causal, None)


@_flash_fwd_op.register_fake
def _(Q, K, V, is_causal):
    return Q.new_empty(Q.shape), Q.new_empty(Q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("cs336_systems::flash_bwd", mutates_args=())
def _flash_bwd_op(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, is_causal: bool,
                  deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    check_grad_output(dO, O)
    return _backward(Q, K, V, O, L, dO, is_causal, None, deterministic)


@_flash_bwd_op.register_fake
def _(Q, K, V, O, L, dO, is_causal, deterministic):
    return Q.new_empty(Q.shape), K.new_empty(K.shape), V.new_empty(V.shape)


# ----------------------------------------------------------------------------------- autograd.Function
class FlashAttention2Triton(torch.autograd.Function):
    """FlashAttention-2 with Triton kernels. ``apply(Q, K, V, is_causal=False, deterministic=False) -> O``;
    causal masking is top-left aligned (query i sees keys 0..i). Saves L (``Q.shape[:-1]``, natural-log
    logsumexp), Q, K, V, O for the backward. ``deterministic`` (or
    ``torch.use_deterministic_algorithms(True)``) selects the atomic-free backward."""

    @staticmethod
    def forward(ctx, Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False, deterministic: bool = False) -> Tensor:
        check_is_causal(is_causal)
        if not isinstance(deterministic, bool):
            raise ValueError(f"deterministic must be a bool (True or False), got {deterministic!r}")
        check_attention_inputs(Q, K, V)  # fail before any kernel, also under torch.compile
        if torch.compiler.is_compiling():
            O, L = _flash_fwd_op(Q, K, V, is_causal)
        else:
            _check_runnable(Q)
            O, L = _forward(Q, K, V, is_causal, None)
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.is_causal = is_causal
        ctx.deterministic = deterministic
        return O

    @staticmethod
    def backward(ctx, dO: Tensor):
        L, Q, K, V, O = ctx.saved_tensors
        deterministic = ctx.deterministic or torch.are_deterministic_algorithms_enabled()
        if torch.compiler.is_compiling():
            dQ, dK, dV = _flash_bwd_op(Q, K, V, O, L, dO, ctx.is_causal, deterministic)
        else:
            check_grad_output(dO, O)
            dQ, dK, dV = _backward(Q, K, V, O, L, dO, ctx.is_causal, None, deterministic)
        return dQ, dK, dV, None, None


def flash_attention_triton(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False, *,
                           deterministic: bool = False) -> Tensor:
    """``FlashAttention2Triton.apply`` with the backward's mode as a keyword."""
    return FlashAttention2Triton.apply(Q, K, V, is_causal, deterministic)


@register_attention_backend("flash_triton")
def flash_triton_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    """Attention backend ``flash_triton``: (B, H, T, d) tensors."""
    return FlashAttention2Triton.apply(q, k, v, is_causal)


__all__ = ["FlashAttention2Triton", "flash_attention_triton", "flash_backward", "flash_forward",
           "flash_triton_attention"]
