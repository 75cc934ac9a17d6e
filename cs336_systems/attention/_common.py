# ruff: noqa: E741  (O, the attention output, is the handout's name)
"""Input checks shared by the FlashAttention-2 implementations (the launchers call them, so a bad
input becomes a ``ValueError`` that names the problem before any kernel runs)."""

from __future__ import annotations

import torch
from torch import Tensor

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def check_attention_inputs(Q: Tensor, K: Tensor, V: Tensor, *, extra_dtypes: tuple[torch.dtype, ...] = ()) -> None:
    """Q ``(..., Nq, d)``, K and V ``(..., Nk, d)``: same leading dims, dtype and device; d in [16, 256]."""
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., seq_len, head_dim), got {tuple(t.shape)}")
    if not (Q.ndim == K.ndim == V.ndim) or not (Q.shape[:-2] == K.shape[:-2] == V.shape[:-2]):
        raise ValueError(
            f"Q, K and V must have the same leading (batch/head) dims, got {tuple(Q.shape)}, {tuple(K.shape)}, "
            f"{tuple(V.shape)}"
        )
    if not (Q.shape[-1] == K.shape[-1] == V.shape[-1]):
        raise ValueError(f"head dims differ: Q {Q.shape[-1]}, K {K.shape[-1]}, V {V.shape[-1]}")
    if K.shape[-2] != V.shape[-2]:
        raise ValueError(f"K and V must have the same sequence length, got {K.shape[-2]} and {V.shape[-2]}")
    if Q.shape[-2] < 1 or K.shape[-2] < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Nq={Q.shape[-2]}, Nk={K.shape[-2]}")
    if not (Q.dtype == K.dtype == V.dtype):
        raise ValueError(f"Q, K and V must share a dtype, got {Q.dtype}, {K.dtype}, {V.dtype}")
    if Q.dtype not in SUPPORTED_DTYPES + extra_dtypes:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES + extra_dtypes)
        raise ValueError(f"unsupported dtype {Q.dtype}; supported: {names}")
    if not (Q.device == K.device == V.device):
        raise ValueError(f"Q, K and V must be on one device, got {Q.device}, {K.device}, {V.device}")
    d = Q.shape[-1]
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {d} unsupported: must be between {MIN_HEAD_DIM} and {MAX_HEAD_DIM}")


def check_is_causal(is_causal) -> None:
    """``is_causal`` must be a bool: a string such as ``"no"`` would otherwise be truthy and run causal."""
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be a bool (True or False), got {is_causal!r} ({type(is_causal).__name__})")


def check_grad_output(dO: Tensor, O: Tensor) -> None:
    if dO.shape != O.shape:
        raise ValueError(f"dO shape {tuple(dO.shape)} differs from O shape {tuple(O.shape)}")
    if dO.device != O.device:
        raise ValueError(f"dO is on {dO.device}, O on {O.device}")


def attention_flops(batch_heads: int, n_q: int, n_k: int, head_dim: int, is_causal: bool, mode: str) -> float:
    """Matmul FLOPs of attention (the flash-attention convention): 4 * BH * Nq * Nk * d for the forward
    (two matmuls), halved when causal, x2.5 for the backward (five matmuls), x3.5 for both."""
    fwd = 4.0 * batch_heads * n_q * n_k * head_dim * (0.5 if is_causal else 1.0)
    return fwd * {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}[mode]
