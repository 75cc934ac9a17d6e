# Snapshot of cs336_systems/fused/qk_rope.py at e30b10e (session 30): see README.md here.
"""RoPE in the epilogue of the q/k projections (``--rope fused``; CUDA, Hopper).

``use_fused_qk_rope(model)`` makes every ``cs336_basics.model.CausalMultiHeadSelfAttention`` whose q and k have the
same heads compute its rotated q and k with :func:`qk_rope`: one warp-specialised Gluon dual GEMM writes
R(x Wq^T) and R(x Wk^T), rotating in its epilogue (``cs336_systems.fused.qk_rope_gemm``), so neither q nor k is read
and written again by a RoPE pass. The backward rotates dq and dk back by minus the angle with RoPE's Triton kernel
(``cs336_systems.fused.rope``) and leaves dx, dWq and dWk to cuBLAS. The forward is a ``torch.library`` custom op,
so ``torch.compile`` keeps it as a call in its graph and a captured step replays it.

Arithmetic: q and k are rounded to the input dtype as the unfused projections store them, rotated in fp32 and
rounded once, as ``RotaryEmbedding`` does. Where the kernel does not apply (not sm_90, fp32, misaligned rows,
``swiglu_gemm.supported``), the op runs that arithmetic with PyTorch: the CPU tests check the wiring with it, the
GPU tests the kernel against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cs336_basics.model import CausalMultiHeadSelfAttention, rotate_pairs
from cs336_systems.fused import install_kernel


def _gluon():
    """The Gluon kernel's module, or None where this Triton has no Gluon Hopper dialect."""
    try:
        from cs336_systems.fused import qk_rope_gemm
    except ImportError:  # pragma: no cover - Triton without triton.experimental.gluon
        return None
    return qk_rope_gemm


def _rotate_rows(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``t`` (M, N) with row r's (even, odd) column pairs rotated by row r % P of ``cos`` / ``sin`` (P, Dh/2),
    the pair's frequency its index within its head of Dh columns (``RotaryEmbedding``'s arithmetic)."""
    (m, n), (p, half) = t.shape, cos.shape
    heads = t.reshape(m // p, p, n // (2 * half), 2 * half)
    return rotate_pairs(heads, cos[:, None], sin[:, None]).reshape(m, n)


def _kernel_applies(x: Tensor, wq: Tensor, wk: Tensor, cos: Tensor) -> bool:
    kernels = _gluon()
    return (kernels is not None and kernels.supported(x, wq, wk) and wq.shape == wk.shape
            and cos.is_cuda and cos.dtype == torch.float32 and cos.is_contiguous())


@torch.library.custom_op("cs336_systems::qk_rope", mutates_args=())
def qk_rope_project(x: Tensor, wq: Tensor, wk: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """(q, k) = (R(x Wq^T), R(x Wk^T)) for x (M, d_model) and wq, wk (N, d_model); row r takes the angles of row
    r % P of cos / sin (P, head_dim / 2), fp32."""
    if _kernel_applies(x, wq, wk, cos):
        return _gluon().qk_rope(x, wq, wk, cos, sin.contiguous())
    return _rotate_rows(x @ wq.T, cos, sin), _rotate_rows(x @ wk.T, cos, sin)


@qk_rope_project.register_fake
def _(x: Tensor, wq: Tensor, wk: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape[0], wq.shape[0]), x.new_empty(x.shape[0], wk.shape[0])


def _unrotate(g: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The gradient through the rotation: ``g`` rotated by minus each angle (RoPE's Triton kernel on CUDA)."""
    if g.is_cuda:
        from cs336_systems.fused.rope import _rope_rotate

        return _rope_rotate(g.contiguous(), cos, sin.contiguous(), g.shape[1] // (2 * cos.shape[1]), True)
    return _rotate_rows(g, cos, -sin)


class _QKRope(torch.autograd.Function):
    """(R(x Wq^T), R(x Wk^T)) on 2-D x, saving x, the weights and the tables."""

    @staticmethod
    def forward(ctx, x: Tensor, wq: Tensor, wk: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        q, k = qk_rope_project(x, wq, wk, cos, sin)
        ctx.save_for_backward(x, wq, wk, cos, sin)
        return q, k

    @staticmethod
    def backward(ctx, dq: Tensor, dk: Tensor):
        x, wq, wk, cos, sin = ctx.saved_tensors
        dq, dk = _unrotate(dq, cos, sin), _unrotate(dk, cos, sin)
        return torch.addmm(dq @ wq, dk, wk), dq.T @ x, dk.T @ x, None, None


def qk_rope(x: Tensor, wq: Tensor, wk: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """``CausalMultiHeadSelfAttention``'s rotated q and k (..., T, N) for x (..., T, d_model), its projections'
    weights wq, wk (N, d_model) and the RoPE tables at the tokens' positions, cos / sin (..., T, head_dim / 2)
    (leading dims a suffix of x's: shared by the dims before). Under autocast the operands are cast to its dtype
    first, as the projections would cast them."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        x, wq, wk = (t.to(dtype) for t in (x, wq, wk))
    lead, table_lead, half = x.shape[:-1], cos.shape[:-1], cos.shape[-1]
    suffix = len(table_lead) <= len(lead) and tuple(lead[len(lead) - len(table_lead):]) == tuple(table_lead)
    if not suffix or cos.shape != sin.shape or wq.shape != wk.shape or wq.shape[0] % (2 * half):
        # tables that vary along x's leading dims some other way: the module's arithmetic
        heads = (*lead, wq.shape[0] // (2 * half), 2 * half)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return (rotate_pairs(F.linear(x, wq).reshape(heads), cos, sin).flatten(-2),
                rotate_pairs(F.linear(x, wk).reshape(heads), cos, sin).flatten(-2))
    table = lambda t: t.float().reshape(-1, half).contiguous()  # (P, Dh/2): a no-op for the model's tables
    q, k = _QKRope.apply(x.reshape(-1, x.shape[-1]).contiguous(), wq, wk, table(cos), table(sin))
    return q.reshape(*lead, wq.shape[0]), k.reshape(*lead, wk.shape[0])


def use_fused_qk_rope(model: nn.Module) -> int:
    """Make every ``CausalMultiHeadSelfAttention`` in ``model`` compute its rotated q and k with :func:`qk_rope`
    (where q and k have the same heads); returns how many it found."""
    return install_kernel(model, CausalMultiHeadSelfAttention, qk_rope, hook="qk_kernel")
