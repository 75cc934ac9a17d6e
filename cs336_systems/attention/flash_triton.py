# ruff: noqa: E741  (O, the attention output, is the handout's name)
"""FlashAttention-2 in Triton: a fused forward kernel and a backward without atomics.

Layering (as in the flash-attention repo and the Triton tutorials): ``@triton.jit`` kernels ->
launchers that validate inputs (``ValueError``) and pick tiles -> ``torch.library`` custom ops (opaque
to ``torch.compile``) -> ``FlashAttention2Triton`` (``autograd.Function``) -> ``flash_attention_triton``.

Forward (handout Algorithm 1): grid (query tiles, batch x heads); each program keeps fp32 running max,
denominator and output tile on chip and makes one pass over key tiles. Scores are kept in log2 units:
log2(e) is folded into the softmax scale so the exponentials are ``exp2``; the saved logsumexp L is
converted back to natural log (the course tests compare it with ``logsumexp``).

Backward (equations 13-19): a preprocessing kernel computes D = rowsum(O * dO); one kernel owns a key tile
and walks query tiles to produce dK and dV; another owns a query tile and walks key tiles to produce dQ.
P is recomputed in both, so no program writes what another reads: no atomics, and the result is
bitwise deterministic.

Causal (top-left aligned: query i sees keys 0..i, also when Nq != Nk): tiles entirely above the diagonal
are never visited; tiles entirely below it run a loop with no index comparisons; only tiles crossing the
diagonal (or the end of the sequence) are masked. Causal programs are launched heaviest first.

Supported: Q ``(..., Nq, d)``, K and V ``(..., Nk, d)`` with any leading dims (flattened into one
batch x heads grid axis); any Nq, Nk >= 1 (boundary tiles are masked); head dim 16..256, non-powers of two
padded to the next power of two inside the kernel; fp16, bf16, fp32 (fp32 dots use TF32 unless
``torch.get_float32_matmul_precision() == "highest"``, PyTorch's default, in which case they are IEEE
fp32); non-contiguous inputs and gradients. Not supported (``ValueError``): mismatched head dims, K and V
of different lengths, mixed dtypes or devices, head dims outside 16..256, other dtypes. CPU tensors run
through the Triton interpreter, which needs ``TRITON_INTERPRET=1`` in the environment before this module
is imported.
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
from cs336_systems.attention._common import check_attention_inputs, check_grad_output
from cs336_systems.attention._tuning import FlashConfig, KernelConfig

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ----------------------------------------------------------------------------------------------- kernels
# Each kernel exists in two forms with the same arithmetic (the ``*_probs`` / ``*_accumulate`` helpers):
# - block pointers (``tl.make_block_ptr``; any strides): the default;
# - tensor descriptors (``tl.make_tensor_descriptor``, built on the device per program and batch-head, so
#   a tile never crosses a batch-head boundary): loads and stores go through the TMA unit on Hopper, and
#   the key/query loop can be warp-specialised (``WARP_SPEC``: a producer partition issues the TMA loads,
#   the consumer warps do the dots). Descriptors zero-fill out-of-bounds loads and clip stores, so ragged
#   lengths and padded head dims (block ``D_PAD``, shape ``HEAD_DIM``) need no masks on Q/K/V/dO/O.
#   Needs unit stride along d and 16-byte aligned rows and bases (the launcher checks; otherwise the
#   block-pointer form runs).
@triton.jit
def _load(block_ptr, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Load a block, zero-filling only the dimensions that can run past the tensor."""
    if CHECK_ROWS and CHECK_COLS:
        x = tl.load(block_ptr, boundary_check=(0, 1), padding_option="zero")
    elif CHECK_ROWS:
        x = tl.load(block_ptr, boundary_check=(0,), padding_option="zero")
    elif CHECK_COLS:
        x = tl.load(block_ptr, boundary_check=(1,), padding_option="zero")
    else:
        x = tl.load(block_ptr)
    return x


@triton.jit
def _fwd_probs(q, kT, m_i, offs_m, start_n, N_K, qk_scale, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
               IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Scores of one key tile (log2 units) -> unnormalised P, rescale factor alpha, new running max
    (Algorithm 1, lines 8-10)."""
    qk = tl.dot(q, kT, input_precision=INPUT_PRECISION)  # (BLOCK_M, BLOCK_N), fp32
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = offs_n[None, :] < N_K
        if IS_CAUSAL:
            visible = visible & (offs_m[:, None] >= offs_n[None, :])
        qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # finite: every row sees key 0 in its first tile
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, m_new


@triton.jit
def _fwd_step(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, start_n, N_K,
              qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
              EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
              INPUT_PRECISION: tl.constexpr):
    """One key tile of the online softmax (Algorithm 1, lines 8-13), block pointers."""
    kT_ptr = tl.make_block_ptr(K, shape=(HEAD_DIM, N_K), strides=(stride_kd, stride_kn), offsets=(0, start_n),
                               block_shape=(D_PAD, BLOCK_N), order=(0, 1))
    v_ptr = tl.make_block_ptr(V, shape=(N_K, HEAD_DIM), strides=(stride_vn, stride_vd), offsets=(start_n, 0),
                              block_shape=(BLOCK_N, D_PAD), order=(1, 0))
    kT = _load(kT_ptr, not EVEN_D, MASKED)
    p, alpha, m_new = _fwd_probs(q, kT, m_i, offs_m, start_n, N_K, qk_scale, BLOCK_N, MASKED, IS_CAUSAL,
                                 INPUT_PRECISION)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _load(v_ptr, MASKED, not EVEN_D)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _fwd_step_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, start_n, N_K, qk_scale, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One key tile of the online softmax, tensor descriptors."""
    kT = k_desc.load([start_n, 0]).T
    p, alpha, m_new = _fwd_probs(q, kT, m_i, offs_m, start_n, N_K, qk_scale, BLOCK_N, MASKED, IS_CAUSAL,
                                 INPUT_PRECISION)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = v_desc.load([start_n, 0])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=INPUT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _fwd_loop(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, lo, hi, N_K,
              qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
              EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
              INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Key tiles [lo, hi). A pipelined ``for`` when compiled; a ``while`` in the interpreter, whose
    ``range`` cannot take run-time bounds under numpy >= 2.4."""
    if INTERPRET:
        start_n = lo
        while start_n < hi:
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                                      start_n, N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, EVEN_D, MASKED,
                                      IS_CAUSAL, INPUT_PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                                      start_n, N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, EVEN_D, MASKED,
                                      IS_CAUSAL, INPUT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _fwd_loop_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, lo, hi, N_K, qk_scale, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                  INTERPRET: tl.constexpr, WARP_SPEC: tl.constexpr):
    if INTERPRET:
        start_n = lo
        while start_n < hi:
            acc, l_i, m_i = _fwd_step_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, start_n, N_K, qk_scale, BLOCK_N,
                                          MASKED, IS_CAUSAL, INPUT_PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
            acc, l_i, m_i = _fwd_step_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, start_n, N_K, qk_scale, BLOCK_N,
                                          MASKED, IS_CAUSAL, INPUT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _query_tile_bounds(start_m, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """For a query tile at start_m: key tiles [0, full_hi) need no mask, [full_hi, mask_hi) are masked
    (causal: crossing the diagonal; or running past N_K); later ones are never visited."""
    if IS_CAUSAL:
        # key tiles with every key <= start_m are visible to all rows; the rest up to the diagonal are masked
        full_hi = tl.minimum((start_m + 1) // BLOCK_N, N_K // BLOCK_N) * BLOCK_N
        mask_hi = tl.minimum(start_m + BLOCK_M, N_K)
    else:
        full_hi = (N_K // BLOCK_N) * BLOCK_N
        mask_hi = N_K
    return full_hi, mask_hi


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, L,
                      stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                      stride_vb, stride_vn, stride_vd, stride_ob, stride_om, stride_od, stride_lb, stride_lm,
                      N_Q, N_K, qk_scale,
                      HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                      INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    pid_m = tl.program_id(0)
    if IS_CAUSAL:  # the last query tiles see the most keys: launch them first
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    Q += bh * stride_qb
    K += bh * stride_kb
    V += bh * stride_vb
    q_ptr = tl.make_block_ptr(Q, shape=(N_Q, HEAD_DIM), strides=(stride_qm, stride_qd), offsets=(start_m, 0),
                              block_shape=(BLOCK_M, D_PAD), order=(1, 0))
    q = _load(q_ptr, True, not EVEN_D)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    full_hi, mask_hi = _query_tile_bounds(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                              0, full_hi, N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, EVEN_D, False, IS_CAUSAL,
                              INPUT_PRECISION, INTERPRET)
    acc, l_i, m_i = _fwd_loop(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                              full_hi, mask_hi, N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, EVEN_D, True,
                              IS_CAUSAL, INPUT_PRECISION, INTERPRET)
    acc = acc / l_i[:, None]  # Algorithm 1 line 15
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # line 16, back to natural log
    o_ptr = tl.make_block_ptr(O + bh * stride_ob, shape=(N_Q, HEAD_DIM), strides=(stride_om, stride_od),
                              offsets=(start_m, 0), block_shape=(BLOCK_M, D_PAD), order=(1, 0))
    tl.store(o_ptr, acc.to(O.dtype.element_ty), boundary_check=(0, 1))
    tl.store(L + bh * stride_lb + offs_m * stride_lm, lse, mask=offs_m < N_Q)


@triton.jit
def _flash_fwd_kernel_tma(Q, K, V, O, L, stride_qb, stride_qm, stride_kb, stride_kn, stride_vb, stride_vn,
                          stride_ob, stride_om, stride_lb, stride_lm, N_Q, N_K, qk_scale,
                          HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                          INTERPRET: tl.constexpr, WARP_SPEC: tl.constexpr):
    """The forward kernel on tensor descriptors (unit stride along d)."""
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    q_desc = tl.make_tensor_descriptor(Q + bh * stride_qb, shape=[N_Q, HEAD_DIM], strides=[stride_qm, 1],
                                       block_shape=[BLOCK_M, D_PAD])
    k_desc = tl.make_tensor_descriptor(K + bh * stride_kb, shape=[N_K, HEAD_DIM], strides=[stride_kn, 1],
                                       block_shape=[BLOCK_N, D_PAD])
    v_desc = tl.make_tensor_descriptor(V + bh * stride_vb, shape=[N_K, HEAD_DIM], strides=[stride_vn, 1],
                                       block_shape=[BLOCK_N, D_PAD])
    o_desc = tl.make_tensor_descriptor(O + bh * stride_ob, shape=[N_Q, HEAD_DIM], strides=[stride_om, 1],
                                       block_shape=[BLOCK_M, D_PAD])
    q = q_desc.load([start_m, 0])
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    full_hi, mask_hi = _query_tile_bounds(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    if WARP_SPEC:  # Triton 3.6 warp-specialises a kernel with a single loop only: every tile masked
        acc, l_i, m_i = _fwd_loop_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, 0, mask_hi, N_K, qk_scale, BLOCK_N,
                                      True, IS_CAUSAL, INPUT_PRECISION, INTERPRET, True)
    else:
        acc, l_i, m_i = _fwd_loop_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, 0, full_hi, N_K, qk_scale, BLOCK_N,
                                      False, IS_CAUSAL, INPUT_PRECISION, INTERPRET, False)
        acc, l_i, m_i = _fwd_loop_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, full_hi, mask_hi, N_K, qk_scale,
                                      BLOCK_N, True, IS_CAUSAL, INPUT_PRECISION, INTERPRET, False)
    acc = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    o_desc.store([start_m, 0], acc.to(O.dtype.element_ty))
    tl.store(L + bh * stride_lb + offs_m * stride_lm, lse, mask=offs_m < N_Q)


@triton.jit
def _flash_bwd_preprocess(O, DO, Delta, stride_ob, stride_om, stride_od, stride_dob, stride_dom, stride_dod,
                          N_Q, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """D = rowsum(O * dO), in fp32, shape (BH, Nq) contiguous."""
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
def _dkdv_probs(k, qT, lse2, offs_m, offs_n, N_Q, qk_scale, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
                INPUT_PRECISION: tl.constexpr):
    """P^T of one (key tile, query tile) pair, recomputed from the saved logsumexp (eqs. 13-14)."""
    sT = tl.dot(k, qT, input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_M) = S^T, eq. 13
    pT = tl.math.exp2(sT * qk_scale - lse2[None, :])  # eq. 14 in log2 units
    if MASKED:
        visible = offs_m[None, :] < N_Q
        if IS_CAUSAL:
            visible = visible & (offs_m[None, :] >= offs_n[:, None])
        pT = tl.where(visible, pT, 0.0)
    return pT


@triton.jit
def _dkdv_accumulate(dk, dv, v, qT, do, pT, delta, INPUT_PRECISION: tl.constexpr):
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)  # eq. 15
    dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # eq. 16, transposed
    dsT = pT * (dpT - delta[None, :])  # eq. 17
    dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk, input_precision=INPUT_PRECISION)  # eq. 19 (unscaled)
    return dk, dv


@triton.jit
def _dkdv_step(dk, dv, k, v, Q, DO, L, Delta, stride_qm, stride_qd, stride_dom, stride_dod, offs_n, start_m,
               N_Q, qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
               EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
               INPUT_PRECISION: tl.constexpr):
    """One query tile's contribution to dK, dV of a key tile, on transposed score tiles (block pointers)."""
    qT_ptr = tl.make_block_ptr(Q, shape=(HEAD_DIM, N_Q), strides=(stride_qd, stride_qm), offsets=(0, start_m),
                               block_shape=(D_PAD, BLOCK_M), order=(0, 1))
    do_ptr = tl.make_block_ptr(DO, shape=(N_Q, HEAD_DIM), strides=(stride_dom, stride_dod), offsets=(start_m, 0),
                               block_shape=(BLOCK_M, D_PAD), order=(1, 0))
    offs_m = start_m + tl.arange(0, BLOCK_M)
    qT = _load(qT_ptr, not EVEN_D, MASKED)
    lse2, delta = _row_stats(L, Delta, offs_m, N_Q, MASKED)
    pT = _dkdv_probs(k, qT, lse2, offs_m, offs_n, N_Q, qk_scale, MASKED, IS_CAUSAL, INPUT_PRECISION)
    do = _load(do_ptr, MASKED, not EVEN_D)
    return _dkdv_accumulate(dk, dv, v, qT, do, pT, delta, INPUT_PRECISION)


@triton.jit
def _dkdv_step_tma(dk, dv, k, v, q_desc, do_desc, L, Delta, offs_n, start_m, N_Q, qk_scale,
                   BLOCK_M: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   INPUT_PRECISION: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    qT = q_desc.load([start_m, 0]).T
    lse2, delta = _row_stats(L, Delta, offs_m, N_Q, MASKED)
    pT = _dkdv_probs(k, qT, lse2, offs_m, offs_n, N_Q, qk_scale, MASKED, IS_CAUSAL, INPUT_PRECISION)
    do = do_desc.load([start_m, 0])
    return _dkdv_accumulate(dk, dv, v, qT, do, pT, delta, INPUT_PRECISION)


@triton.jit
def _dkdv_loop(dk, dv, k, v, Q, DO, L, Delta, stride_qm, stride_qd, stride_dom, stride_dod, offs_n, lo, hi,
               N_Q, qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
               EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
               INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Query tiles [lo, hi) (see _fwd_loop for the two loop forms)."""
    if INTERPRET:
        start_m = lo
        while start_m < hi:
            dk, dv = _dkdv_step(dk, dv, k, v, Q, DO, L, Delta, stride_qm, stride_qd, stride_dom, stride_dod,
                                offs_n, start_m, N_Q, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, EVEN_D, MASKED,
                                IS_CAUSAL, INPUT_PRECISION)
            start_m += BLOCK_M
    else:
        for start_m in range(lo, hi, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, Q, DO, L, Delta, stride_qm, stride_qd, stride_dom, stride_dod,
                                offs_n, start_m, N_Q, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, EVEN_D, MASKED,
                                IS_CAUSAL, INPUT_PRECISION)
    return dk, dv


@triton.jit
def _dkdv_loop_tma(dk, dv, k, v, q_desc, do_desc, L, Delta, offs_n, lo, hi, N_Q, qk_scale, BLOCK_M: tl.constexpr,
                   MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                   INTERPRET: tl.constexpr, WARP_SPEC: tl.constexpr):
    if INTERPRET:
        start_m = lo
        while start_m < hi:
            dk, dv = _dkdv_step_tma(dk, dv, k, v, q_desc, do_desc, L, Delta, offs_n, start_m, N_Q, qk_scale, BLOCK_M,
                                    MASKED, IS_CAUSAL, INPUT_PRECISION)
            start_m += BLOCK_M
    else:
        for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=WARP_SPEC):
            dk, dv = _dkdv_step_tma(dk, dv, k, v, q_desc, do_desc, L, Delta, offs_n, start_m, N_Q, qk_scale, BLOCK_M,
                                    MASKED, IS_CAUSAL, INPUT_PRECISION)
    return dk, dv


@triton.jit
def _key_tile_bounds(start_n, N_Q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """For a key tile at start_n: query tiles [lo, mid) are masked (crossing the diagonal), [mid, full_end)
    unmasked, [tail, end) masked (past N_Q); earlier query tiles see none of these keys."""
    end = tl.cdiv(N_Q, BLOCK_M) * BLOCK_M
    full_end = (N_Q // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M  # earlier query tiles see none of these keys
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, end)  # from here all see all
    else:
        lo = 0
        mid = 0
    tail = tl.maximum(mid, full_end)
    return lo, mid, full_end, tail, end


@triton.jit
def _flash_bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV,
                           stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                           stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod,
                           stride_dkb, stride_dkn, stride_dkd, stride_dvb, stride_dvn, stride_dvd,
                           N_Q, N_K, sm_scale, qk_scale,
                           HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                           INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    Q += bh * stride_qb
    DO += bh * stride_dob
    L += bh * N_Q
    Delta += bh * N_Q
    k_ptr = tl.make_block_ptr(K + bh * stride_kb, shape=(N_K, HEAD_DIM), strides=(stride_kn, stride_kd),
                              offsets=(start_n, 0), block_shape=(BLOCK_N, D_PAD), order=(1, 0))
    v_ptr = tl.make_block_ptr(V + bh * stride_vb, shape=(N_K, HEAD_DIM), strides=(stride_vn, stride_vd),
                              offsets=(start_n, 0), block_shape=(BLOCK_N, D_PAD), order=(1, 0))
    # Key rows past N_K are zero and their dK/dV rows are never stored: no key mask is needed here.
    k = _load(k_ptr, True, not EVEN_D)
    v = _load(v_ptr, True, not EVEN_D)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    dk = tl.zeros((BLOCK_N, D_PAD), tl.float32)
    dv = tl.zeros((BLOCK_N, D_PAD), tl.float32)
    lo, mid, full_end, tail, end = _key_tile_bounds(start_n, N_Q, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dk, dv = _dkdv_loop(dk, dv, k, v, Q, DO, L, Delta, stride_qm, stride_qd, stride_dom, stride_dod, offs_n,
                        lo, mid, N_Q, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, EVEN_D, True, IS_CAUSAL,
                        INPUT_PRECISION, INTERPRET)
    dk, dv = _dkdv_loop(dk, dv, k, v, Q, DO, L, Delta, stride_qm, stride_qd, stride_dom, stride_dod, offs_n,
                        mid, full_end, N_Q, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, EVEN_D, False, IS_CAUSAL,
                        INPUT_PRECISION, INTERPRET)
    dk, dv = _dkdv_loop(dk, dv, k, v, Q, DO, L, Delta, stride_qm, stride_qd, stride_dom, stride_dod, offs_n,
                        tail, end, N_Q, qk_scale, HEAD_DIM, D_PAD, BLOCK_M, EVEN_D, True, IS_CAUSAL,
                        INPUT_PRECISION, INTERPRET)
    dk_ptr = tl.make_block_ptr(DK + bh * stride_dkb, shape=(N_K, HEAD_DIM), strides=(stride_dkn, stride_dkd),
                               offsets=(start_n, 0), block_shape=(BLOCK_N, D_PAD), order=(1, 0))
    dv_ptr = tl.make_block_ptr(DV + bh * stride_dvb, shape=(N_K, HEAD_DIM), strides=(stride_dvn, stride_dvd),
                               offsets=(start_n, 0), block_shape=(BLOCK_N, D_PAD), order=(1, 0))
    tl.store(dk_ptr, (dk * sm_scale).to(DK.dtype.element_ty), boundary_check=(0, 1))
    tl.store(dv_ptr, dv.to(DV.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _flash_bwd_dkdv_kernel_tma(Q, K, V, DO, L, Delta, DK, DV, stride_qb, stride_qm, stride_kb, stride_kn,
                               stride_vb, stride_vn, stride_dob, stride_dom, stride_dkb, stride_dkn, stride_dvb,
                               stride_dvn, N_Q, N_K, sm_scale, qk_scale,
                               HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                               INTERPRET: tl.constexpr, WARP_SPEC: tl.constexpr):
    """The dK/dV kernel on tensor descriptors (unit stride along d)."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    L += bh * N_Q
    Delta += bh * N_Q
    q_desc = tl.make_tensor_descriptor(Q + bh * stride_qb, shape=[N_Q, HEAD_DIM], strides=[stride_qm, 1],
                                       block_shape=[BLOCK_M, D_PAD])
    do_desc = tl.make_tensor_descriptor(DO + bh * stride_dob, shape=[N_Q, HEAD_DIM], strides=[stride_dom, 1],
                                        block_shape=[BLOCK_M, D_PAD])
    k_desc = tl.make_tensor_descriptor(K + bh * stride_kb, shape=[N_K, HEAD_DIM], strides=[stride_kn, 1],
                                       block_shape=[BLOCK_N, D_PAD])
    v_desc = tl.make_tensor_descriptor(V + bh * stride_vb, shape=[N_K, HEAD_DIM], strides=[stride_vn, 1],
                                       block_shape=[BLOCK_N, D_PAD])
    k = k_desc.load([start_n, 0])
    v = v_desc.load([start_n, 0])
    offs_n = start_n + tl.arange(0, BLOCK_N)
    dk = tl.zeros((BLOCK_N, D_PAD), tl.float32)
    dv = tl.zeros((BLOCK_N, D_PAD), tl.float32)
    lo, mid, full_end, tail, end = _key_tile_bounds(start_n, N_Q, BLOCK_M, BLOCK_N, IS_CAUSAL)
    if WARP_SPEC:  # one loop, every tile masked (see the forward)
        dk, dv = _dkdv_loop_tma(dk, dv, k, v, q_desc, do_desc, L, Delta, offs_n, lo, end, N_Q, qk_scale, BLOCK_M,
                                True, IS_CAUSAL, INPUT_PRECISION, INTERPRET, True)
    else:
        dk, dv = _dkdv_loop_tma(dk, dv, k, v, q_desc, do_desc, L, Delta, offs_n, lo, mid, N_Q, qk_scale, BLOCK_M,
                                True, IS_CAUSAL, INPUT_PRECISION, INTERPRET, False)
        dk, dv = _dkdv_loop_tma(dk, dv, k, v, q_desc, do_desc, L, Delta, offs_n, mid, full_end, N_Q, qk_scale,
                                BLOCK_M, False, IS_CAUSAL, INPUT_PRECISION, INTERPRET, False)
        dk, dv = _dkdv_loop_tma(dk, dv, k, v, q_desc, do_desc, L, Delta, offs_n, tail, end, N_Q, qk_scale, BLOCK_M,
                                True, IS_CAUSAL, INPUT_PRECISION, INTERPRET, False)
    dk_desc = tl.make_tensor_descriptor(DK + bh * stride_dkb, shape=[N_K, HEAD_DIM], strides=[stride_dkn, 1],
                                        block_shape=[BLOCK_N, D_PAD])
    dv_desc = tl.make_tensor_descriptor(DV + bh * stride_dvb, shape=[N_K, HEAD_DIM], strides=[stride_dvn, 1],
                                        block_shape=[BLOCK_N, D_PAD])
    dk_desc.store([start_n, 0], (dk * sm_scale).to(DK.dtype.element_ty))
    dv_desc.store([start_n, 0], dv.to(DV.dtype.element_ty))


@triton.jit
def _dq_accumulate(dq, q, do, lse2, delta, kT, vT, offs_m, start_n, N_K, qk_scale, BLOCK_N: tl.constexpr,
                   MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One key tile's contribution to dQ of a query tile (eqs. 13-18)."""
    s = tl.dot(q, kT, input_precision=INPUT_PRECISION)  # eq. 13
    p = tl.math.exp2(s * qk_scale - lse2[:, None])  # eq. 14
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = offs_n[None, :] < N_K
        if IS_CAUSAL:
            visible = visible & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, vT, input_precision=INPUT_PRECISION)  # eq. 16
    ds = p * (dp - delta[:, None])  # eq. 17
    return tl.dot(ds.to(kT.dtype), tl.trans(kT), dq, input_precision=INPUT_PRECISION)  # eq. 18 (unscaled)


@triton.jit
def _dq_step(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, start_n, N_K,
             qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
             EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
             INPUT_PRECISION: tl.constexpr):
    """One key tile's contribution to dQ of a query tile (block pointers)."""
    kT_ptr = tl.make_block_ptr(K, shape=(HEAD_DIM, N_K), strides=(stride_kd, stride_kn), offsets=(0, start_n),
                               block_shape=(D_PAD, BLOCK_N), order=(0, 1))
    vT_ptr = tl.make_block_ptr(V, shape=(HEAD_DIM, N_K), strides=(stride_vd, stride_vn), offsets=(0, start_n),
                               block_shape=(D_PAD, BLOCK_N), order=(0, 1))
    kT = _load(kT_ptr, not EVEN_D, MASKED)
    vT = _load(vT_ptr, not EVEN_D, MASKED)
    return _dq_accumulate(dq, q, do, lse2, delta, kT, vT, offs_m, start_n, N_K, qk_scale, BLOCK_N, MASKED,
                          IS_CAUSAL, INPUT_PRECISION)


@triton.jit
def _dq_loop(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, lo, hi, N_K,
             qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
             EVEN_D: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
             INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Key tiles [lo, hi) (see _fwd_loop for the two loop forms)."""
    if INTERPRET:
        start_n = lo
        while start_n < hi:
            dq = _dq_step(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                          start_n, N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, EVEN_D, MASKED, IS_CAUSAL,
                          INPUT_PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_step(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m,
                          start_n, N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, EVEN_D, MASKED, IS_CAUSAL,
                          INPUT_PRECISION)
    return dq


@triton.jit
def _dq_loop_tma(dq, q, do, lse2, delta, k_desc, v_desc, offs_m, lo, hi, N_K, qk_scale, BLOCK_N: tl.constexpr,
                 MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                 INTERPRET: tl.constexpr, WARP_SPEC: tl.constexpr):
    if INTERPRET:
        start_n = lo
        while start_n < hi:
            dq = _dq_accumulate(dq, q, do, lse2, delta, k_desc.load([start_n, 0]).T, v_desc.load([start_n, 0]).T,
                                offs_m, start_n, N_K, qk_scale, BLOCK_N, MASKED, IS_CAUSAL, INPUT_PRECISION)
            start_n += BLOCK_N
    else:
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
            dq = _dq_accumulate(dq, q, do, lse2, delta, k_desc.load([start_n, 0]).T, v_desc.load([start_n, 0]).T,
                                offs_m, start_n, N_K, qk_scale, BLOCK_N, MASKED, IS_CAUSAL, INPUT_PRECISION)
    return dq


@triton.jit
def _flash_bwd_dq_kernel(Q, K, V, DO, L, Delta, DQ,
                         stride_qb, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd,
                         stride_vb, stride_vn, stride_vd, stride_dob, stride_dom, stride_dod,
                         stride_dqb, stride_dqm, stride_dqd,
                         N_Q, N_K, sm_scale, qk_scale,
                         HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                         INPUT_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    q_ptr = tl.make_block_ptr(Q + bh * stride_qb, shape=(N_Q, HEAD_DIM), strides=(stride_qm, stride_qd),
                              offsets=(start_m, 0), block_shape=(BLOCK_M, D_PAD), order=(1, 0))
    do_ptr = tl.make_block_ptr(DO + bh * stride_dob, shape=(N_Q, HEAD_DIM), strides=(stride_dom, stride_dod),
                               offsets=(start_m, 0), block_shape=(BLOCK_M, D_PAD), order=(1, 0))
    q = _load(q_ptr, True, not EVEN_D)
    do = _load(do_ptr, True, not EVEN_D)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    lse2, delta = _row_stats(L + bh * N_Q, Delta + bh * N_Q, offs_m, N_Q, True)
    K += bh * stride_kb
    V += bh * stride_vb
    dq = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    full_hi, mask_hi = _query_tile_bounds(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq = _dq_loop(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, 0, full_hi,
                  N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, EVEN_D, False, IS_CAUSAL, INPUT_PRECISION, INTERPRET)
    dq = _dq_loop(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd, offs_m, full_hi,
                  mask_hi, N_K, qk_scale, HEAD_DIM, D_PAD, BLOCK_N, EVEN_D, True, IS_CAUSAL, INPUT_PRECISION,
                  INTERPRET)
    dq_ptr = tl.make_block_ptr(DQ + bh * stride_dqb, shape=(N_Q, HEAD_DIM), strides=(stride_dqm, stride_dqd),
                               offsets=(start_m, 0), block_shape=(BLOCK_M, D_PAD), order=(1, 0))
    tl.store(dq_ptr, (dq * sm_scale).to(DQ.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def _flash_bwd_dq_kernel_tma(Q, K, V, DO, L, Delta, DQ, stride_qb, stride_qm, stride_kb, stride_kn, stride_vb,
                             stride_vn, stride_dob, stride_dom, stride_dqb, stride_dqm, N_Q, N_K, sm_scale,
                             qk_scale, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                             INTERPRET: tl.constexpr, WARP_SPEC: tl.constexpr):
    """The dQ kernel on tensor descriptors (unit stride along d)."""
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    start_m = pid_m * BLOCK_M
    q_desc = tl.make_tensor_descriptor(Q + bh * stride_qb, shape=[N_Q, HEAD_DIM], strides=[stride_qm, 1],
                                       block_shape=[BLOCK_M, D_PAD])
    do_desc = tl.make_tensor_descriptor(DO + bh * stride_dob, shape=[N_Q, HEAD_DIM], strides=[stride_dom, 1],
                                        block_shape=[BLOCK_M, D_PAD])
    k_desc = tl.make_tensor_descriptor(K + bh * stride_kb, shape=[N_K, HEAD_DIM], strides=[stride_kn, 1],
                                       block_shape=[BLOCK_N, D_PAD])
    v_desc = tl.make_tensor_descriptor(V + bh * stride_vb, shape=[N_K, HEAD_DIM], strides=[stride_vn, 1],
                                       block_shape=[BLOCK_N, D_PAD])
    q = q_desc.load([start_m, 0])
    do = do_desc.load([start_m, 0])
    offs_m = start_m + tl.arange(0, BLOCK_M)
    lse2, delta = _row_stats(L + bh * N_Q, Delta + bh * N_Q, offs_m, N_Q, True)
    dq = tl.zeros((BLOCK_M, D_PAD), tl.float32)
    full_hi, mask_hi = _query_tile_bounds(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    if WARP_SPEC:  # one loop, every tile masked (see the forward)
        dq = _dq_loop_tma(dq, q, do, lse2, delta, k_desc, v_desc, offs_m, 0, mask_hi, N_K, qk_scale, BLOCK_N, True,
                          IS_CAUSAL, INPUT_PRECISION, INTERPRET, True)
    else:
        dq = _dq_loop_tma(dq, q, do, lse2, delta, k_desc, v_desc, offs_m, 0, full_hi, N_K, qk_scale, BLOCK_N, False,
                          IS_CAUSAL, INPUT_PRECISION, INTERPRET, False)
        dq = _dq_loop_tma(dq, q, do, lse2, delta, k_desc, v_desc, offs_m, full_hi, mask_hi, N_K, qk_scale, BLOCK_N,
                          True, IS_CAUSAL, INPUT_PRECISION, INTERPRET, False)
    dq_desc = tl.make_tensor_descriptor(DQ + bh * stride_dqb, shape=[N_Q, HEAD_DIM], strides=[stride_dqm, 1],
                                        block_shape=[BLOCK_M, D_PAD])
    dq_desc.store([start_m, 0], (dq * sm_scale).to(DQ.dtype.element_ty))


# --------------------------------------------------------------------------------------------- launchers
_INTERPRETED = not isinstance(_flash_fwd_kernel, triton.runtime.jit.JITFunction)


def _interpreted() -> bool:
    """Whether the kernels were decorated under TRITON_INTERPRET=1 (decided once, at import)."""
    return _INTERPRETED


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


def _as_3d(t: Tensor) -> Tensor:
    """(..., N, d) -> (BH, N, d); a view where the strides allow, and unit stride along d."""
    t3 = t if t.ndim == 3 else t.reshape(-1, t.shape[-2], t.shape[-1])
    return t3 if t3.stride(-1) == 1 or t3.shape[-1] == 1 else t3.contiguous()


def _input_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


def _head_dims(d: int) -> tuple[int, int]:
    return d, max(16, triton.next_power_of_2(d))


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


def _tma_workspace(size: int, alignment: int, stream) -> Tensor:
    """Global memory in which the kernels build their tensor descriptors (one per program and tensor)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _use_tma(cfg: KernelConfig, ready: bool) -> bool:
    if cfg.warp_spec and not _INTERPRETED:
        raise ValueError(
            f"{cfg.short()}: the warp-specialised kernel form is refused on GPUs: Triton 3.6 compiles it for sm_90 "
            "but it returns wrong results there (relative errors 0.2-1.4 and NaN, measured on an H100; "
            "docs/flash_tuning_notes.md). Use tma=True without warp_spec.")
    if not (cfg.tma and ready):
        return False
    if not _INTERPRETED:
        # Triton keeps the allocator in a ContextVar: set it in the thread that launches (autograd runs the
        # backward in its own thread).
        triton.set_allocator(_tma_workspace)
    return True


_config_cache: dict[tuple, FlashConfig] = {}


def _choose(kernel: str, n_q: int, n_k: int, d_pad: int, dtype: torch.dtype, causal: bool,
            device: torch.device, run) -> KernelConfig:
    """Pinned config (cached per length bucket, head dim, dtype and device), or (CS336_FLASH_TUNE=auto on
    CUDA) the fastest of a few candidates, cached."""
    if device.type != "cuda" or not _tuning.autotune_enabled():
        key = (_tuning.seq_bucket(n_q), d_pad, dtype, device)
        cfg = _config_cache.get(key)
        if cfg is None:
            cfg = _config_cache[key] = _tuning.pinned_config(device, d_pad, dtype, n_q)
        return getattr(cfg, kernel)
    pinned = getattr(_tuning.pinned_config(device, d_pad, dtype, n_q), kernel)
    key = _tuning.tune_key(kernel, n_q, n_k, d_pad, dtype, causal)
    hit = _tuning.cached(key)
    if hit is not None:
        return hit
    from triton.testing import do_bench

    best, best_ms = pinned, float("inf")
    for cfg in _tuning.candidates(kernel, d_pad, torch.finfo(dtype).bits // 8):
        try:
            ms = do_bench(lambda cfg=cfg: run(cfg), warmup=5, rep=20, return_mode="median")
        except (triton.runtime.errors.OutOfResources, triton.CompilationError, RuntimeError):
            continue  # a tile that does not fit, or a form this Triton cannot compile for this GPU
        if ms < best_ms:
            best, best_ms = cfg, ms
    _tuning.remember(key, best)
    return best


def flash_forward(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False,
                  config: FlashConfig | None = None) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel: returns O (like Q) and the logsumexp L (fp32, ``Q.shape[:-1]``)."""
    check_attention_inputs(Q, K, V)
    _check_runnable(Q)
    return _forward(Q, K, V, is_causal, config)


def _forward(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool, config: FlashConfig | None) -> tuple[Tensor, Tensor]:
    """flash_forward on validated inputs."""
    q, k, v = _as_3d(Q), _as_3d(K), _as_3d(V)
    bh, n_q, d = q.shape
    n_k = k.shape[1]
    head_dim, d_pad = _head_dims(d)
    o = torch.empty((bh, n_q, d), device=Q.device, dtype=Q.dtype)
    lse = torch.empty((bh, n_q), device=Q.device, dtype=torch.float32)
    qk_scale = LOG2E / math.sqrt(d)
    common = dict(HEAD_DIM=head_dim, D_PAD=d_pad, IS_CAUSAL=bool(is_causal), INPUT_PRECISION=_input_precision(Q.dtype),
                  INTERPRET=_INTERPRETED)
    tma_ready = _tma_ready(q, k, v, o)

    def run(cfg: KernelConfig) -> None:
        grid = (triton.cdiv(n_q, cfg.block_m), bh)
        if _use_tma(cfg, tma_ready):
            _flash_fwd_kernel_tma[grid](
                q, k, v, o, lse, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                o.stride(0), o.stride(1), lse.stride(0), lse.stride(1), n_q, n_k, qk_scale, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, WARP_SPEC=cfg.warp_spec, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                **common)
            return
        _flash_fwd_kernel[grid](
            q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
            n_q, n_k, qk_scale, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_D=head_dim == d_pad,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common)

    cfg = config.fwd if config is not None else _choose("fwd", n_q, n_k, d_pad, Q.dtype, is_causal, Q.device, run)
    run(cfg)
    return o.view(Q.shape), lse.view(Q.shape[:-1])


def flash_backward(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, is_causal: bool = False,
                   config: FlashConfig | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Launch D preprocessing, the dK/dV kernel and the dQ kernel; returns (dQ, dK, dV)."""
    check_attention_inputs(Q, K, V)
    check_grad_output(dO, O)
    _check_runnable(Q)
    return _backward(Q, K, V, O, L, dO, is_causal, config)


def _backward(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, is_causal: bool,
              config: FlashConfig | None) -> tuple[Tensor, Tensor, Tensor]:
    """flash_backward on validated inputs (dO is only checked against O here)."""
    if dO.dtype != Q.dtype:
        dO = dO.to(Q.dtype)
    q, k, v, o, do = _as_3d(Q), _as_3d(K), _as_3d(V), _as_3d(O), _as_3d(dO)
    bh, n_q, d = q.shape
    n_k = k.shape[1]
    head_dim, d_pad = _head_dims(d)
    lse = L.reshape(bh, n_q)
    if not lse.is_contiguous():
        lse = lse.contiguous()
    delta = torch.empty((bh, n_q), device=Q.device, dtype=torch.float32)
    dq = torch.empty((bh, n_q, d), device=Q.device, dtype=Q.dtype)
    dk = torch.empty((bh, n_k, d), device=Q.device, dtype=K.dtype)
    dv = torch.empty((bh, n_k, d), device=Q.device, dtype=V.dtype)
    sm_scale = 1.0 / math.sqrt(d)
    qk_scale = sm_scale * LOG2E
    common = dict(HEAD_DIM=head_dim, D_PAD=d_pad, IS_CAUSAL=bool(is_causal), INPUT_PRECISION=_input_precision(Q.dtype),
                  INTERPRET=_INTERPRETED)
    tma_ready = _tma_ready(q, k, v, do, dq, dk, dv)

    pre_block = 16 if Q.device.type != "cuda" else 64
    _flash_bwd_preprocess[(triton.cdiv(n_q, pre_block), bh)](
        o, do, delta, *o.stride(), *do.stride(), n_q, HEAD_DIM=head_dim, D_PAD=d_pad, BLOCK_M=pre_block)

    def run_dkdv(cfg: KernelConfig) -> None:
        grid = (triton.cdiv(n_k, cfg.block_n), bh)
        if _use_tma(cfg, tma_ready):
            _flash_bwd_dkdv_kernel_tma[grid](
                q, k, v, do, lse, delta, dk, dv, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                v.stride(1), do.stride(0), do.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
                n_q, n_k, sm_scale, qk_scale, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, WARP_SPEC=cfg.warp_spec,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common)
            return
        _flash_bwd_dkdv_kernel[grid](
            q, k, v, do, lse, delta, dk, dv, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(),
            *dv.stride(), n_q, n_k, sm_scale, qk_scale, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            EVEN_D=head_dim == d_pad, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common)

    def run_dq(cfg: KernelConfig) -> None:
        grid = (triton.cdiv(n_q, cfg.block_m), bh)
        if _use_tma(cfg, tma_ready):
            _flash_bwd_dq_kernel_tma[grid](
                q, k, v, do, lse, delta, dq, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                v.stride(1), do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), n_q, n_k, sm_scale, qk_scale,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, WARP_SPEC=cfg.warp_spec, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages, **common)
            return
        _flash_bwd_dq_kernel[grid](
            q, k, v, do, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
            n_q, n_k, sm_scale, qk_scale, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_D=head_dim == d_pad,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common)

    args = (n_q, n_k, d_pad, Q.dtype, is_causal, Q.device)
    run_dkdv(config.dkdv if config is not None else _choose("dkdv", *args, run_dkdv))
    run_dq(config.dq if config is not None else _choose("dq", *args, run_dq))
    return dq.view(Q.shape), dk.view(K.shape), dv.view(V.shape)


# ------------------------------------------------------------- custom ops (opaque to torch.compile)
# The autograd.Function validates (also while torch.compile traces it); the ops only check that the
# kernels can run on the tensors' device.
@torch.library.custom_op("cs336_systems::flash_fwd", mutates_args=())
def _flash_fwd_op(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    _check_runnable(Q)
    return _forward(Q, K, V, is_causal, None)


@_flash_fwd_op.register_fake
def _(Q, K, V, is_causal):
    return Q.new_empty(Q.shape), Q.new_empty(Q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("cs336_systems::flash_bwd", mutates_args=())
def _flash_bwd_op(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor,
                  is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    check_grad_output(dO, O)
    return _backward(Q, K, V, O, L, dO, is_causal, None)


@_flash_bwd_op.register_fake
def _(Q, K, V, O, L, dO, is_causal):
    return Q.new_empty(Q.shape), K.new_empty(K.shape), V.new_empty(V.shape)


# ----------------------------------------------------------------------------------- autograd.Function
class FlashAttention2Triton(torch.autograd.Function):
    """FlashAttention-2 with Triton kernels. ``apply(Q, K, V, is_causal=False) -> O``; causal masking is
    top-left aligned (query i sees keys 0..i). Saves L (``Q.shape[:-1]``, natural-log logsumexp), Q, K,
    V, O for the backward."""

    @staticmethod
    def forward(ctx, Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False) -> Tensor:
        check_attention_inputs(Q, K, V)  # fail before any kernel, also under torch.compile
        O, L = _flash_fwd_op(Q, K, V, bool(is_causal))
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.is_causal = bool(is_causal)
        return O

    @staticmethod
    def backward(ctx, dO: Tensor):
        L, Q, K, V, O = ctx.saved_tensors
        dQ, dK, dV = _flash_bwd_op(Q, K, V, O, L, dO, ctx.is_causal)
        return dQ, dK, dV, None


flash_attention_triton = FlashAttention2Triton.apply


@register_attention_backend("flash_triton")
def flash_triton_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    """Attention backend ``flash_triton``: (B, H, T, d) tensors."""
    return FlashAttention2Triton.apply(q, k, v, is_causal)


__all__ = ["FlashAttention2Triton", "flash_attention_triton", "flash_backward", "flash_forward",
           "flash_triton_attention"]
