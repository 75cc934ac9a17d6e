# Snapshot of cs336_systems/fused/qkv.py at 3cd4fc5 (session 31): see README.md here.
"""q, k and v from one matmul, with RoPE and the gradients' packing in one pass each (``--qkv packed``; CUDA).

``use_packed_qkv(model)`` makes every ``cs336_basics.model.CausalMultiHeadSelfAttention`` whose q, k and v have the same
heads (and that has RoPE) compute them with :func:`qkv_rope`: one GEMM against the three weights stacked (``x [Wq; Wk;
Wv]^T``, 4,800 columns at xl instead of three products of 1,600, which cuBLAS runs 13-22% below its rate on the block's
widest shapes: docs/training_step.md, session 30), RoPE's Triton kernel reading q and k out of the packed output, and v
left a view of it. In the backward one pass rotates dq and dk back into a packed gradient and copies dv beside them, so
dx and the three weights' gradients are again one GEMM each (``dqkv [Wq; Wk; Wv]`` and ``dqkv^T x``, the weight
gradients row blocks of one result). Session 17 packed the projections as one parameter (Inductor's RoPE backward
writing into the gradients' concatenation) and measured no faster step (``experiments/fused_qkv/``); this form keeps the
three parameters and is not yet measured on a GPU (docs/pending_device_runs.md).

Arithmetic: the products and the rotation as the model's (q and k rounded to the input dtype, rotated in fp32,
rounded once); the stacked weight is copied once a step (15 MB a block at xl) and saved for the backward, and v's
view keeps the packed output alive until attention's backward (together about 3 GB more at xl/2048). Without CUDA
(or Triton's interpreter) the ops run the same arithmetic in PyTorch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cs336_basics.model import CausalMultiHeadSelfAttention, rotate_pairs
from cs336_systems.fused import install_kernel
from cs336_systems.fused.rope import _INTERPRETING, rotate_rows


def _kernels(t: Tensor) -> bool:
    return t.is_cuda or _INTERPRETING


def _rotated_reference(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``t`` (M, H * Dh) with token r's pairs rotated by table row r % P (``RotaryEmbedding``'s arithmetic)."""
    (m, n), (p, half) = t.shape, cos.shape
    return rotate_pairs(t.reshape(m // p, p, n // (2 * half), 2 * half), cos[:, None], sin[:, None]).reshape(m, n)


@torch.library.custom_op("cs336_systems::qkv_rope_split", mutates_args=())
def qkv_rope_split(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotated q and k (M, D), contiguous, from the first two thirds of the packed projections ``qkv`` (M, 3D);
    token r takes row r % P of ``cos`` / ``sin`` (P, Dh/2), fp32."""
    d = qkv.shape[1] // 3
    if not _kernels(qkv):
        return _rotated_reference(qkv[:, :d], cos, sin), _rotated_reference(qkv[:, d:2 * d], cos, sin)
    heads, cos, sin = d // (2 * cos.shape[1]), cos.contiguous(), sin.contiguous()
    q, k = qkv.new_empty(qkv.shape[0], d), qkv.new_empty(qkv.shape[0], d)
    for part, out in ((qkv[:, :d], q), (qkv[:, d:2 * d], k)):
        rotate_rows(part, out, cos, sin, heads, qkv.stride(0), d, inverse=False)
    return q, k


@qkv_rope_split.register_fake
def _(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    d = qkv.shape[1] // 3
    return qkv.new_empty(qkv.shape[0], d), qkv.new_empty(qkv.shape[0], d)


@torch.library.custom_op("cs336_systems::qkv_grad_pack", mutates_args=())
def qkv_grad_pack(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The packed projections' gradient (M, 3D): dq and dk (M, D) rotated back (by minus each angle), then dv."""
    m, d = dq.shape
    dqkv = dq.new_empty(m, 3 * d)
    if not _kernels(dq):
        dqkv[:, :d] = _rotated_reference(dq, cos, -sin)
        dqkv[:, d:2 * d] = _rotated_reference(dk, cos, -sin)
    else:
        heads, cos, sin = d // (2 * cos.shape[1]), cos.contiguous(), sin.contiguous()
        for g, lo in ((dq, 0), (dk, d)):
            rotate_rows(g.contiguous(), dqkv[:, lo:lo + d], cos, sin, heads, d, 3 * d, inverse=True)
    dqkv[:, 2 * d:] = dv
    return dqkv


@qkv_grad_pack.register_fake
def _(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return dq.new_empty(dq.shape[0], 3 * dq.shape[1])


class _PackedQKV(torch.autograd.Function):
    """(R(x Wq^T), R(x Wk^T), x Wv^T) on 2-D x through one product against the stacked weights; v is a view of the
    packed output."""

    @staticmethod
    def forward(ctx, x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, cos: Tensor, sin: Tensor):
        w = torch.cat((wq, wk, wv))
        qkv = x @ w.T
        q, k = qkv_rope_split(qkv, cos, sin)
        ctx.save_for_backward(x, w, cos, sin)
        return q, k, qkv[:, 2 * wq.shape[0]:]

    @staticmethod
    def backward(ctx, dq: Tensor, dk: Tensor, dv: Tensor):
        x, w, cos, sin = ctx.saved_tensors
        dqkv = qkv_grad_pack(dq, dk, dv, cos, sin)
        dw = dqkv.T @ x
        d = dq.shape[1]
        return dqkv @ w, dw[:d], dw[d:2 * d], dw[2 * d:], None, None


def qkv_rope(x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``CausalMultiHeadSelfAttention``'s rotated q, k and v (..., T, D) for x (..., T, d_model), its projections'
    weights (D, d_model) and the RoPE tables at the tokens' positions, cos / sin (..., T, head_dim / 2) (leading
    dims a suffix of x's: shared by the dims before). Under autocast the operands are cast to its dtype first, as the
    projections would cast them."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        x, wq, wk, wv = (t.to(dtype) for t in (x, wq, wk, wv))
    lead, table_lead, half = x.shape[:-1], cos.shape[:-1], cos.shape[-1]
    suffix = len(table_lead) <= len(lead) and tuple(lead[len(lead) - len(table_lead):]) == tuple(table_lead)
    if not suffix or cos.shape != sin.shape or not wq.shape == wk.shape == wv.shape or wq.shape[0] % (2 * half):
        # tables that vary along x's leading dims some other way: the module's arithmetic
        heads = (*lead, wq.shape[0] // (2 * half), 2 * half)
        c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return (rotate_pairs(F.linear(x, wq).reshape(heads), c, s).flatten(-2),
                rotate_pairs(F.linear(x, wk).reshape(heads), c, s).flatten(-2), F.linear(x, wv))
    table = lambda t: t.float().reshape(-1, half).contiguous()  # (P, Dh/2): a no-op for the model's tables
    q, k, v = _PackedQKV.apply(x.reshape(-1, x.shape[-1]).contiguous(), wq, wk, wv, table(cos), table(sin))
    return tuple(t.reshape(*lead, wq.shape[0]) for t in (q, k, v))


def use_packed_qkv(model: nn.Module) -> int:
    """Make every ``CausalMultiHeadSelfAttention`` in ``model`` compute q, k and v with :func:`qkv_rope` (where
    they have the same heads and there is RoPE); returns how many it found."""
    return install_kernel(model, CausalMultiHeadSelfAttention, qkv_rope, hook="qkv_kernel")
