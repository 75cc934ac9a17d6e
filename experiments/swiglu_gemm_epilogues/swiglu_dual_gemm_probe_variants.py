# Snapshot of scripts/device/swiglu_dual_gemm_probe.py at 152f6b9 (session 29): see README.md here.
"""Probe (issue 19): can SwiGLU's elementwise pass live in the epilogue of its matmuls at cuBLAS's speed?

At xl/2048 the captured step is at the H100's power cap and its non-matmul time is memory traffic; SwiGLU's
elementwise kernels are 13 ms of a 227 ms step (docs/training_step.md, session 25). The forward writes a = x W1^T
and b = x W3^T, then reads both to write h = silu(a) * b. A "dual GEMM" (CUTLASS's name for it) computes a tile of a
and the same tile of b in one program (x's tile loaded once for both) and writes h from registers; with ``SAVE_AB``
it also writes a and b, which the backward needs (or recomputes). This times, at the model's shapes:

- ``cublas``: ``x @ w1.T``, ``x @ w3.T`` (cuBLAS) and ``silu(a) * b`` compiled (what the model runs today);
- ``cublas-packed``: one cuBLAS GEMM against the stacked ``[w1; w3]`` and the same elementwise pass;
- ``dual``: the Triton kernel below, for each tile configuration in ``CONFIGS``, with and without ``SAVE_AB``;

and the backward's counterpart: dh = dy W2 (the product that feeds SwiGLU's backward) with an epilogue that reads
a and b and writes da = dh * b * silu'(a) and db = dh * silu(a) (``bwd``), against cuBLAS and the compiled
elementwise pass (``cublas-bwd``). Timed with ``triton.testing.do_bench`` (L2 flushed, medians); every output is
checked against an fp32 reference with the 2x rule (our error at most twice the cuBLAS path's plus one bf16 rounding
of the reference's magnitude).

    python scripts/device/swiglu_dual_gemm_probe.py [--shapes xl_2048 xl_512] [--out DIR]
    TRITON_INTERPRET=1 python scripts/device/swiglu_dual_gemm_probe.py --check   # CPU: numerics at small sizes
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# the Gluon kernels of cs336_systems.fused.swiglu_gemm: (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, num_warps, GROUP_M)
WS_ONLY = True  # the software-pipelined Gluon kernels measured 1.1-1.4x slower (session 29)
GLUON_FWD = ((128, 128, 64, 3, 8, 8),)
GLUON_BWD = ((128, 128, 64, 5, 8, 8),)
# warp-specialised: (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, -, GROUP_M); the forward's ring takes 48 KiB a stage, the
# backward's 32 KiB a stage plus 64 KiB for a and b
# a seventh entry: the consumer warpgroups' registers (the producer warp gets 264 minus that)
GLUON_WS = ((128, 128, 64, 4, 4, 8), (128, 128, 32, 8, 4, 8), (128, 128, 32, 6, 4, 8))
GLUON_WS_BWD = ((128, 128, 64, 5, 4, 8), (128, 128, 32, 10, 4, 8), (128, 128, 32, 8, 4, 8))
SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400), "small_512": (2048, 768, 3072)}  # M, K, N
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): BLOCK_N columns of a and of b each
CONFIGS = ((128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (128, 128, 64, 8, 4), (64, 128, 64, 4, 4), (128, 256, 64, 8, 3))
BWD_CONFIGS = ((128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4))
# the persistent TMA variants (one program per SM, tiles strided over them, loads of the next tile's first K slices
# issued under this tile's epilogue by the flattened loop)
TMA_CONFIGS = ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (128, 256, 64, 8, 3),
               (128, 128, 128, 8, 3))


@triton.jit
def _grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid``, tiles in groups of GROUP_M row tiles, so that the programs in
    flight share their rows and weight columns in L2 (the Triton matmul tutorial's order)."""
    n_m, n_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(n_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % rows, (pid % per_group) // rows


@triton.jit
def _k_step(acc_a, acc_b, x_blk, w1_blk, w3_blk, BLOCK_K: tl.constexpr):
    """One BLOCK_K slice of both products: x's tile loaded once for the two."""
    x = tl.load(x_blk, boundary_check=(0, 1), padding_option="zero")
    acc_a = tl.dot(x, tl.load(w1_blk, boundary_check=(0, 1), padding_option="zero"), acc_a)
    acc_b = tl.dot(x, tl.load(w3_blk, boundary_check=(0, 1), padding_option="zero"), acc_b)
    return (acc_a, acc_b, tl.advance(x_blk, (0, BLOCK_K)), tl.advance(w1_blk, (BLOCK_K, 0)),
            tl.advance(w3_blk, (BLOCK_K, 0)))


@triton.jit
def _dual_gemm_swiglu(X, W1, W3, H, A, B, M, N, K, stride_xm, stride_wn, stride_hm,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      SAVE_AB: tl.constexpr, INTERPRET: tl.constexpr):
    """h[m, n] = silu(x[m] . w1[n]) * (x[m] . w3[n]) for one (BLOCK_M, BLOCK_N) tile; x (M, K), w1 and w3 (N, K)
    row-major with unit stride along K; tiles in ``_grouped_tile``'s order."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    x_blk = tl.make_block_ptr(X, (M, K), (stride_xm, 1), (pid_m * BLOCK_M, 0), (BLOCK_M, BLOCK_K), (1, 0))
    w1_blk = tl.make_block_ptr(W1, (K, N), (1, stride_wn), (0, pid_n * BLOCK_N), (BLOCK_K, BLOCK_N), (0, 1))
    w3_blk = tl.make_block_ptr(W3, (K, N), (1, stride_wn), (0, pid_n * BLOCK_N), (BLOCK_K, BLOCK_N), (0, 1))
    acc_a = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if INTERPRET:  # the interpreter's range cannot take a run-time bound under numpy >= 2.4
        k0 = 0
        while k0 < K:
            acc_a, acc_b, x_blk, w1_blk, w3_blk = _k_step(acc_a, acc_b, x_blk, w1_blk, w3_blk, BLOCK_K)
            k0 += BLOCK_K
    else:
        for _ in range(0, K, BLOCK_K):
            acc_a, acc_b, x_blk, w1_blk, w3_blk = _k_step(acc_a, acc_b, x_blk, w1_blk, w3_blk, BLOCK_K)
    # a and b rounded to the input dtype first, as the unfused path stores them, so that h matches it
    a = acc_a.to(H.dtype.element_ty).to(tl.float32)
    b = acc_b.to(H.dtype.element_ty).to(tl.float32)
    h = a * tl.sigmoid(a) * b
    out = (pid_m * BLOCK_M, pid_n * BLOCK_N)
    h_blk = tl.make_block_ptr(H, (M, N), (stride_hm, 1), out, (BLOCK_M, BLOCK_N), (1, 0))
    tl.store(h_blk, h.to(H.dtype.element_ty), boundary_check=(0, 1))
    if SAVE_AB:
        a_blk = tl.make_block_ptr(A, (M, N), (stride_hm, 1), out, (BLOCK_M, BLOCK_N), (1, 0))
        b_blk = tl.make_block_ptr(B, (M, N), (stride_hm, 1), out, (BLOCK_M, BLOCK_N), (1, 0))
        tl.store(a_blk, acc_a.to(A.dtype.element_ty), boundary_check=(0, 1))
        tl.store(b_blk, acc_b.to(B.dtype.element_ty), boundary_check=(0, 1))


def dual_gemm_swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, cfg: tuple, save_ab: bool):
    """h (and a, b with ``save_ab``) for x (M, K), w1 and w3 (N, K)."""
    block_m, block_n, block_k, warps, stages = cfg
    (m, k), n = x.shape, w1.shape[0]
    h = x.new_empty(m, n)
    a, b = (x.new_empty(m, n), x.new_empty(m, n)) if save_ab else (h, h)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _dual_gemm_swiglu[grid](x, w1, w3, h, a, b, m, n, k, x.stride(0), w1.stride(0), h.stride(0),
                            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, SAVE_AB=save_ab,
                            INTERPRET=bool(os.environ.get("TRITON_INTERPRET")),
                            num_warps=warps, num_stages=stages)
    return h, a, b


@triton.jit
def _dot_step(acc, x_blk, w_blk, BLOCK_K: tl.constexpr):
    acc = tl.dot(tl.load(x_blk, boundary_check=(0, 1), padding_option="zero"),
                 tl.load(w_blk, boundary_check=(0, 1), padding_option="zero"), acc)
    return acc, tl.advance(x_blk, (0, BLOCK_K)), tl.advance(w_blk, (BLOCK_K, 0))


@triton.jit
def _gemm_swiglu_bwd(DY, W2, A, B, DA, DB, M, N, K, stride_dym, stride_w2k, stride_am,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     INTERPRET: tl.constexpr):
    """dh = dy W2 for one (BLOCK_M, BLOCK_N) tile (dy (M, K), W2 (K, N) row-major: the Linear's (d_model, d_ff)
    weight), then da = dh * b * silu'(a) and db = dh * silu(a) from the forward's a and b (M, N)."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    dy_blk = tl.make_block_ptr(DY, (M, K), (stride_dym, 1), (pid_m * BLOCK_M, 0), (BLOCK_M, BLOCK_K), (1, 0))
    w_blk = tl.make_block_ptr(W2, (K, N), (stride_w2k, 1), (0, pid_n * BLOCK_N), (BLOCK_K, BLOCK_N), (1, 0))
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if INTERPRET:  # as in _dual_gemm_swiglu
        k0 = 0
        while k0 < K:
            acc, dy_blk, w_blk = _dot_step(acc, dy_blk, w_blk, BLOCK_K)
            k0 += BLOCK_K
    else:
        for _ in range(0, K, BLOCK_K):
            acc, dy_blk, w_blk = _dot_step(acc, dy_blk, w_blk, BLOCK_K)
    out = (pid_m * BLOCK_M, pid_n * BLOCK_N)
    a = tl.load(tl.make_block_ptr(A, (M, N), (stride_am, 1), out, (BLOCK_M, BLOCK_N), (1, 0)),
                boundary_check=(0, 1)).to(tl.float32)
    b = tl.load(tl.make_block_ptr(B, (M, N), (stride_am, 1), out, (BLOCK_M, BLOCK_N), (1, 0)),
                boundary_check=(0, 1)).to(tl.float32)
    dh = acc.to(DA.dtype.element_ty).to(tl.float32)  # rounded as the unfused path stores dh
    sig = tl.sigmoid(a)
    da = dh * b * sig * (1.0 + a * (1.0 - sig))
    db = dh * a * sig
    tl.store(tl.make_block_ptr(DA, (M, N), (stride_am, 1), out, (BLOCK_M, BLOCK_N), (1, 0)),
             da.to(DA.dtype.element_ty), boundary_check=(0, 1))
    tl.store(tl.make_block_ptr(DB, (M, N), (stride_am, 1), out, (BLOCK_M, BLOCK_N), (1, 0)),
             db.to(DB.dtype.element_ty), boundary_check=(0, 1))


def gemm_swiglu_bwd(dy: torch.Tensor, w2: torch.Tensor, a: torch.Tensor, b: torch.Tensor, cfg: tuple):
    """da, db for dy (M, d_model), w2 (d_model, d_ff), a and b (M, d_ff)."""
    block_m, block_n, block_k, warps, stages = cfg
    (m, k), n = dy.shape, w2.shape[1]
    da, db = torch.empty_like(a), torch.empty_like(b)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _gemm_swiglu_bwd[grid](dy, w2, a, b, da, db, m, n, k, dy.stride(0), w2.stride(0), a.stride(0),
                           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
                           INTERPRET=bool(os.environ.get("TRITON_INTERPRET")), num_warps=warps, num_stages=stages)
    return da, db


@triton.jit
def _dual_k_step(x_desc, w1_desc, w3_desc, om, on, ok, acc_a, acc_b):
    x = x_desc.load([om, ok])
    return tl.dot(x, w1_desc.load([on, ok]).T, acc_a), tl.dot(x, w3_desc.load([on, ok]).T, acc_b)


@triton.jit
def _dual_epilogue(acc_a, acc_b, h_desc, a_desc, b_desc, om, on, SAVE_AB: tl.constexpr):
    a = acc_a.to(h_desc.dtype)
    b = acc_b.to(h_desc.dtype)
    af = a.to(tl.float32)
    h_desc.store([om, on], (af * tl.sigmoid(af) * b.to(tl.float32)).to(h_desc.dtype))
    if SAVE_AB:
        a_desc.store([om, on], a)
        b_desc.store([om, on], b)


@triton.jit
def _dual_gemm_swiglu_tma(x_desc, w1_desc, w3_desc, h_desc, a_desc, b_desc, M, N, K,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                          SAVE_AB: tl.constexpr, NUM_PROGRAMS: tl.constexpr, INTERPRET: tl.constexpr):
    """``_dual_gemm_swiglu`` as persistent programs over host TMA descriptors (x (M, K), w1 and w3 (N, K)); the
    flattened loop lets the next tile's first loads go out under this tile's epilogue."""
    n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if INTERPRET:  # the same loops as while loops (see _dual_gemm_swiglu)
        tile = tl.program_id(0)
        while tile < n_tiles:
            pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc_a = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            acc_b = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            ok = 0
            while ok < K:
                acc_a, acc_b = _dual_k_step(x_desc, w1_desc, w3_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, ok,
                                            acc_a, acc_b)
                ok += BLOCK_K
            _dual_epilogue(acc_a, acc_b, h_desc, a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, SAVE_AB)
            tile += NUM_PROGRAMS
    else:
        for tile in tl.range(tl.program_id(0), n_tiles, NUM_PROGRAMS, flatten=True):
            pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc_a = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            acc_b = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for kk in range(tl.cdiv(K, BLOCK_K)):
                acc_a, acc_b = _dual_k_step(x_desc, w1_desc, w3_desc, pid_m * BLOCK_M, pid_n * BLOCK_N,
                                            kk * BLOCK_K, acc_a, acc_b)
            _dual_epilogue(acc_a, acc_b, h_desc, a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, SAVE_AB)


def dual_gemm_swiglu_tma(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, cfg: tuple, save_ab: bool):
    """h (and a, b) as ``dual_gemm_swiglu``, by the persistent TMA kernel."""
    block_m, block_n, block_k, warps, stages = cfg
    (m, k), n = x.shape, w1.shape[0]
    h = x.new_empty(m, n)
    a, b = (x.new_empty(m, n), x.new_empty(m, n)) if save_ab else (h, h)
    mk, nk, mn = [block_m, block_k], [block_n, block_k], [block_m, block_n]
    programs = min(_sm_count(x.device), triton.cdiv(m, block_m) * triton.cdiv(n, block_n))
    _dual_gemm_swiglu_tma[(programs,)](
        TensorDescriptor.from_tensor(x, mk), TensorDescriptor.from_tensor(w1, nk), TensorDescriptor.from_tensor(w3, nk),
        *(TensorDescriptor.from_tensor(t, mn) for t in (h, a, b)), m, n, k,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, SAVE_AB=save_ab, NUM_PROGRAMS=programs,
        INTERPRET=bool(os.environ.get("TRITON_INTERPRET")),
        num_warps=warps, num_stages=stages)
    return h, a, b


@triton.jit
def _bwd_epilogue(acc, a_desc, b_desc, da_desc, db_desc, om, on):
    a = a_desc.load([om, on]).to(tl.float32)
    b = b_desc.load([om, on]).to(tl.float32)
    dh = acc.to(da_desc.dtype).to(tl.float32)
    sig = tl.sigmoid(a)
    da_desc.store([om, on], (dh * b * sig * (1.0 + a * (1.0 - sig))).to(da_desc.dtype))
    db_desc.store([om, on], (dh * a * sig).to(db_desc.dtype))


@triton.jit
def _gemm_swiglu_bwd_tma(dy_desc, w2_desc, a_desc, b_desc, da_desc, db_desc, M, N, K,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                         NUM_PROGRAMS: tl.constexpr, INTERPRET: tl.constexpr):
    """``_gemm_swiglu_bwd`` as persistent programs over host TMA descriptors (dy (M, K), W2 (K, N))."""
    n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if INTERPRET:
        tile = tl.program_id(0)
        while tile < n_tiles:
            pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            ok = 0
            while ok < K:
                acc = tl.dot(dy_desc.load([pid_m * BLOCK_M, ok]), w2_desc.load([ok, pid_n * BLOCK_N]), acc)
                ok += BLOCK_K
            _bwd_epilogue(acc, a_desc, b_desc, da_desc, db_desc, pid_m * BLOCK_M, pid_n * BLOCK_N)
            tile += NUM_PROGRAMS
    else:
        for tile in tl.range(tl.program_id(0), n_tiles, NUM_PROGRAMS, flatten=True):
            pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for kk in range(tl.cdiv(K, BLOCK_K)):
                acc = tl.dot(dy_desc.load([pid_m * BLOCK_M, kk * BLOCK_K]),
                             w2_desc.load([kk * BLOCK_K, pid_n * BLOCK_N]), acc)
            _bwd_epilogue(acc, a_desc, b_desc, da_desc, db_desc, pid_m * BLOCK_M, pid_n * BLOCK_N)


def gemm_swiglu_bwd_tma(dy: torch.Tensor, w2: torch.Tensor, a: torch.Tensor, b: torch.Tensor, cfg: tuple):
    """da, db as ``gemm_swiglu_bwd``, by the persistent TMA kernel."""
    block_m, block_n, block_k, warps, stages = cfg
    (m, k), n = dy.shape, w2.shape[1]
    da, db = torch.empty_like(a), torch.empty_like(b)
    mn = [block_m, block_n]
    programs = min(_sm_count(dy.device), triton.cdiv(m, block_m) * triton.cdiv(n, block_n))
    _gemm_swiglu_bwd_tma[(programs,)](
        TensorDescriptor.from_tensor(dy, [block_m, block_k]), TensorDescriptor.from_tensor(w2, [block_k, block_n]),
        *(TensorDescriptor.from_tensor(t, mn) for t in (a, b, da, db)), m, n, k,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, NUM_PROGRAMS=programs,
        INTERPRET=bool(os.environ.get("TRITON_INTERPRET")),
        num_warps=warps, num_stages=stages)
    return da, db


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _swiglu_bwd(dh: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """da, db of h = silu(a) * b, as autograd computes them from stored a, b and dh."""
    sig = torch.sigmoid(a.float())
    da = dh.float() * b.float() * sig * (1 + a.float() * (1 - sig))
    return da.to(a.dtype), (dh.float() * a.float() * sig).to(b.dtype)


def _swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(a) * b


def _errors(got: torch.Tensor, ref: torch.Tensor, base: torch.Tensor) -> tuple[float, float, bool]:
    err, base_err = (got.float() - ref).abs().max().item(), (base.float() - ref).abs().max().item()
    return err, base_err, err <= 2 * base_err + ref.abs().max().item() * 2**-8


def check(device: str) -> None:
    """Odd sizes against an fp32 reference (the interpreter on a CPU, in fp16: small tiles)."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float16  # the interpreter (numpy) has no bf16
    for m, k, n in ((37, 56, 72), (128, 96, 64)):  # TMA: row strides of 16 bytes; K and N not whole tiles
        x = torch.randn(m, k, device=device, dtype=dtype)
        w1, w3 = (torch.randn(n, k, device=device, dtype=dtype) / k**0.5 for _ in range(2))
        a_ref, b_ref = x.float() @ w1.float().T, x.float() @ w3.float().T
        base_a, base_b = x @ w1.T, x @ w3.T
        for save_ab in (False, True):
            for kind, fn in (("", dual_gemm_swiglu), (" tma", dual_gemm_swiglu_tma)):
                h, a, b = fn(x, w1, w3, (32, 32, 32, 4, 2), save_ab)
                results = [("h", *_errors(h, _swiglu(a_ref, b_ref), _swiglu(base_a, base_b)))]
                if save_ab:
                    results += [("a", *_errors(a, a_ref, base_a)), ("b", *_errors(b, b_ref, base_b))]
                _report(f"{m}x{k}x{n}{kind} save_ab={save_ab}", results)
        # the backward: dy (M, K) against w2 (K, N), with the forward's a and b
        dy, w2 = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype) / k**0.5
        a, b = base_a, base_b
        dh_ref = dy.float() @ w2.float()
        sig = torch.sigmoid(a.float())
        da_ref = dh_ref * b.float() * sig * (1 + a.float() * (1 - sig))
        db_ref = dh_ref * a.float() * sig
        base_da, base_db = _swiglu_bwd(dy @ w2, a, b)
        for kind, fn in (("", gemm_swiglu_bwd), (" tma", gemm_swiglu_bwd_tma)):
            da, db = fn(dy, w2, a, b, (32, 32, 32, 4, 2))
            _report(f"{m}x{k}x{n}{kind} bwd",
                    [("da", *_errors(da, da_ref, base_da)), ("db", *_errors(db, db_ref, base_db))])


def _report(label: str, results: list) -> None:
    for name, err, base_err, ok in results:
        print(f"{label} {name}: err {err:.2e} (cuBLAS path {base_err:.2e}) {'ok' if ok else 'FAIL'}")
        if not ok:
            raise SystemExit(1)


def time_shape(name: str, elementwise, do_bench, gluon_kernels=None) -> list[dict]:
    """Each variant at one shape: median ms, TFLOP/s of the products, error against the fp32 reference."""
    m, k, n = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w1, w3 = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5 for _ in range(2))
    w13 = torch.cat((w1, w3))
    ref = _swiglu(x.float() @ w1.float().T, x.float() @ w3.float().T)
    base = elementwise(x @ w1.T, x @ w3.T)
    flops = 2 * 2 * m * n * k
    variants = {"cublas": lambda: elementwise(x @ w1.T, x @ w3.T),
                "cublas-packed": lambda: elementwise(*(x @ w13.T).chunk(2, dim=-1)),
                "cublas-mm-only": lambda: x @ w13.T}  # the matmuls' own time: what a fused kernel has to match
    for cfg in CONFIGS:
        for save_ab in (False, True):
            variants[f"dual {'x'.join(map(str, cfg))}{' +ab' if save_ab else ''}"] = (
                lambda cfg=cfg, save_ab=save_ab: dual_gemm_swiglu(x, w1, w3, cfg, save_ab)[0])
    for cfg in TMA_CONFIGS:
        for save_ab in (False, True):
            variants[f"tma {'x'.join(map(str, cfg))}{' +ab' if save_ab else ''}"] = (
                lambda cfg=cfg, save_ab=save_ab: dual_gemm_swiglu_tma(x, w1, w3, cfg, save_ab)[0])
    if gluon_kernels is not None:
        for cfg in GLUON_FWD if not WS_ONLY else ():
            for save_ab in (False, True):
                variants[f"gluon {'x'.join(map(str, cfg))}{' +ab' if save_ab else ''}"] = (
                    lambda cfg=cfg, save_ab=save_ab: gluon_kernels.dual_swiglu(x, w1, w3, save_ab, cfg)[0])
        for cfg in GLUON_WS:
            variants[f"gluon ws {'x'.join(map(str, cfg))} +ab"] = lambda cfg=cfg: gluon_kernels.dual_swiglu(
                x, w1, w3, True, cfg[:6], ws=True, regs=cfg[6] if len(cfg) > 6 else 240)[0]
    # the backward at the same shape: dy (M, d_model = k) against w2 (d_model, d_ff = n)
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w2 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
    a, b = x @ w1.T, x @ w3.T
    sig = torch.sigmoid(a.float())
    dh_ref = dy.float() @ w2.float()
    bwd_ref = dh_ref * b.float() * sig * (1 + a.float() * (1 - sig))  # da: the output checked
    bwd_elementwise = torch.compile(_swiglu_bwd)
    bwd_base = bwd_elementwise(dy @ w2, a, b)[0]
    bwd = {"cublas-bwd": lambda: bwd_elementwise(dy @ w2, a, b)[0], "cublas-bwd-mm-only": lambda: dy @ w2}
    for cfg in BWD_CONFIGS:
        bwd[f"bwd {'x'.join(map(str, cfg))}"] = lambda cfg=cfg: gemm_swiglu_bwd(dy, w2, a, b, cfg)[0]
    for cfg in TMA_CONFIGS:
        bwd[f"bwd tma {'x'.join(map(str, cfg))}"] = lambda cfg=cfg: gemm_swiglu_bwd_tma(dy, w2, a, b, cfg)[0]
    if gluon_kernels is not None:
        for cfg in GLUON_BWD if not WS_ONLY else ():
            bwd[f"bwd gluon {'x'.join(map(str, cfg))}"] = (
                lambda cfg=cfg: gluon_kernels.swiglu_backward(dy, w2, a, b, cfg)[0])
        for cfg in GLUON_WS_BWD:
            bwd[f"bwd gluon ws {'x'.join(map(str, cfg))}"] = lambda cfg=cfg: gluon_kernels.swiglu_backward(
                dy, w2, a, b, cfg[:6], ws=True, regs=cfg[6] if len(cfg) > 6 else 240)[0]
    rows = []
    for label, fn, want, base_out, fl in [*((lab, f, ref, base, flops) for lab, f in variants.items()),
                                          *((lab, f, bwd_ref, bwd_base, flops // 2) for lab, f in bwd.items())]:
        try:
            h = fn()
            err, base_err, ok = (float("nan"),) * 2 + (True,) if "mm-only" in label else _errors(h, want, base_out)
            ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
        except Exception as e:  # a tile configuration that does not fit (shared memory, registers)
            print(f"{name:<9} {label:<28} {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
            continue
        rows.append(dict(shape=name, variant=label, ms=ms, tflops=fl / ms / 1e9, err=err, ok=ok))
        print(f"{name:<9} {label:<28} {ms:.4f} ms  {fl / ms / 1e9:6.1f} TFLOP/s  err {err:.2e} "
              f"(cuBLAS path {base_err:.2e}) {'ok' if ok else 'FAIL'}", flush=True)
    return rows


def ncu_calls(name: str) -> None:
    """A few calls of each kernel at one shape, for ``ncu`` (cuBLAS's GEMMs, the Triton and Gluon kernels)."""
    import swiglu_gemm_variants as swiglu_gemm  # beside this script (main() puts its folder on the path)

    m, k, n = SHAPES[name]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w13 = torch.randn(2 * n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    w1, w3 = w13[:n], w13[n:]
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w2 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, b = x @ w1.T, x @ w3.T
    torch.cuda.synchronize()
    for label, fn in (("cublas packed", lambda: x @ w13.T), ("cublas dh", lambda: dy @ w2),
                      ("triton tma +ab", lambda: dual_gemm_swiglu_tma(x, w1, w3, (128, 128, 64, 8, 4), True)),
                      ("gluon +ab", lambda: swiglu_gemm.dual_swiglu(x, w1, w3, True)),
                      ("gluon ws +ab", lambda: swiglu_gemm.dual_swiglu(x, w1, w3, True, GLUON_WS[0], ws=True)),
                      ("gluon bwd", lambda: swiglu_gemm.swiglu_backward(dy, w2, a, b)),
                      ("gluon ws bwd", lambda: swiglu_gemm.swiglu_backward(dy, w2, a, b, GLUON_WS_BWD[0], ws=True))):
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        print(label, "done", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["xl_2048", "xl_512"], choices=list(SHAPES))
    p.add_argument("--check", action="store_true", help="numerics only, at small odd sizes (CPU interpreter)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--only-gluon", action="store_true", help="time the cuBLAS paths and the Gluon kernels only")
    p.add_argument("--ncu", action="store_true", help="two calls of each kernel at the first shape, for ncu")
    args = p.parse_args()
    if args.ncu:
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        ncu_calls(args.shapes[0])
        return
    if args.check:
        check("cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu")
        return
    from triton.testing import do_bench

    check("cuda")
    elementwise = torch.compile(_swiglu)
    try:  # the package module as it was at 152f6b9, kept beside this script
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import swiglu_gemm_variants as gluon_kernels
    except ImportError as e:  # a Triton without Gluon's Hopper modules
        print(f"no Gluon kernels: {e}")
        gluon_kernels = None
    if args.only_gluon:
        global CONFIGS, BWD_CONFIGS, TMA_CONFIGS
        CONFIGS, BWD_CONFIGS, TMA_CONFIGS = (), (), ()
    rows = [row for name in args.shapes for row in time_shape(name, elementwise, do_bench, gluon_kernels)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "swiglu_dual_gemm.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
