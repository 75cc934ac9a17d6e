# Snapshot of cs336_systems/attention/flash_rope.py at 159053a (session 31): see README.md here.
# ruff: noqa: E741  (O, the attention output, is the handout's name)
"""RoPE and our causal attention as one differentiable op, so that dQ's inverse rotation rides in the backward.

RoPE's backward rotates dQ and dK by minus the angles: at xl/2048 on an H100 each is a pass over 26 MB read and
written (RoPE's Triton kernel, 18 us a layer; docs/training_step.md, session 31). Our attention's backward already
makes one pass over dQ: its postprocess reads the fp32 accumulator the dK/dV kernel added dQ into and writes it
rounded. Here that postprocess applies the inverse rotation before rounding (``_flash_bwd_dq_postprocess_rope``),
so the step loses RoPE's backward pass over dQ. dK keeps RoPE's kernel (the dK/dV kernel stores dK from its own
registers). The forward is RoPE's kernel on q and k, then our forward kernel; the rotated q and k are what the
backward reads, as before.

``use_flash_rope(model)`` sets ``CausalMultiHeadSelfAttention.rope_attention`` on every attention module whose
backend is ``flash_triton``, or ``flash_auto`` where its measured table runs our kernel at the call's shape (the
choice is made per shape, as ``flash_auto`` makes it; elsewhere the module's RoPE and backend run as they would).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from cs336_basics.model import CausalMultiHeadSelfAttention
from cs336_systems.attention import flash_triton as ft
from cs336_systems.attention._common import check_grad_output
from cs336_systems.fused.rope import _launch as _rope_launch
from cs336_systems.fused.rope import _rope_rotate, rotate


@torch.library.custom_op("cs336_systems::flash_bwd_rope", mutates_args=())
def _flash_bwd_rope_op(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, L: Tensor, dO: Tensor, cos: Tensor,
                       sin: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """The causal backward for Q and K that RoPE rotated (tables ``cos``, ``sin`` (N, d / 2), fp32): dQ and dK of
    the unrotated tensors. Q, K, V (B, H, N, d) views of (B, N, H, d) buffers (as ``RopeFlashAttention`` makes
    them)."""
    check_grad_output(dO, O)
    dq, dk, dv = ft._backward(Q, K, V, O, L, dO, None, False, None, 0, None, None, scale, dq_rope=(cos, sin))
    heads = dk.shape[1]
    dk = _rope_launch(dk.transpose(1, 2), cos, sin, heads, True).transpose(1, 2)
    return dq, dk, dv


@_flash_bwd_rope_op.register_fake
def _(Q, K, V, O, L, dO, cos, sin, scale):
    fq, fkv = ft._folds(Q, K, V)
    return ft._side_empty(Q, fq), K.new_empty(K.transpose(1, 2).shape).transpose(1, 2), ft._side_empty(V, fkv)


def _check(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"RopeFlashAttention: q, k and v must be (batch, tokens, heads, head dim) of one shape, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    table = (q.shape[1], q.shape[3] // 2)
    if q.shape[3] % 2 or tuple(cos.shape) != table or tuple(sin.shape) != table:
        raise ValueError(f"RopeFlashAttention: cos and sin must be (tokens, head dim / 2) = {table} for an even head "
                         f"dim, got {tuple(cos.shape)}, {tuple(sin.shape)} (head dim {q.shape[3]})")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32 or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError("RopeFlashAttention: cos and sin must be contiguous float32 tables")


class RopeFlashAttention(torch.autograd.Function):
    """``apply(q, k, v, cos, sin) -> out``: q, k, v (B, N, H, d) as the projections give them (not yet rotated),
    ``cos``, ``sin`` (N, d / 2) fp32 contiguous, the angles of each position; causal attention of the rotated q and
    k with v, ``out`` (B, H, N, d) as the attention backends return it. Saves the rotated q and k."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        _check(q, k, v, cos, sin)
        heads = q.shape[-2]
        qr, kr = (_rope_rotate(t, cos, sin, heads, False) for t in (q, k))
        Q, K, V = (t.transpose(1, 2) for t in (qr, kr, v))
        scale = 1.0 / math.sqrt(q.shape[-1])
        O, L = ft._flash_fwd_op(Q, K, V, None, None, -1, 0, scale)
        ctx.save_for_backward(Q, K, V, O, L, cos, sin)
        ctx.scale = scale
        return O

    @staticmethod
    def backward(ctx, dO: Tensor):
        Q, K, V, O, L, cos, sin = ctx.saved_tensors
        dq, dk, dv = _flash_bwd_rope_op(Q, K, V, O, L, dO, cos, sin, ctx.scale)
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), None, None


def rope_attention(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, *, fallback=None) -> Tensor:
    """``CausalMultiHeadSelfAttention.rope_attention``: see :class:`RopeFlashAttention`. ``fallback``: the module's
    attention function where its backend is ``flash_auto``, run (after RoPE's kernel) where the measured table
    does not pick our kernel at this shape."""
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    if fallback is not None:
        from cs336_systems.attention.auto import _decide

        shape = (q.shape[0], q.shape[2], q.shape[1], q.shape[3])  # as (B, H, N, d)
        if _decide(shape, shape, q.dtype, True, q.device, False) != "flash_triton":
            q, k = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
            return fallback(*(t.transpose(1, 2) for t in (q, k, v)), True)
    return RopeFlashAttention.apply(q, k, v, cos, sin)


def use_flash_rope(model: nn.Module) -> int:
    """Install :func:`rope_attention` in every attention module of ``model`` whose backend is ``flash_triton`` or
    ``flash_auto``; returns how many."""
    found = 0
    for module in model.modules():
        if isinstance(module, CausalMultiHeadSelfAttention) and module.attention_backend_name in (
                "flash_triton", "flash_auto"):
            auto = module.attention_backend_name == "flash_auto"
            module.rope_attention = functools.partial(rope_attention, fallback=module.attention_fn if auto else None)
            found += 1
    return found
