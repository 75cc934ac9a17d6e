# ruff: noqa: E741  (O, the attention output, is the handout's name)
"""Input checks shared by the FlashAttention-2 implementations (the launchers call them, so a bad
input becomes a ``ValueError`` that names the problem before any kernel runs)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def check_attention_inputs(Q: Tensor, K: Tensor, V: Tensor, *, extra_dtypes: tuple[torch.dtype, ...] = (),
                           grouped: bool = False) -> None:
    """Q ``(..., Nq, d)``, K and V ``(..., Nk, d)``: same leading dims, dtype and device; d in [16, 256].
    ``grouped``: K and V may have fewer heads (dim -3) than Q, a divisor of Q's (grouped-query attention)."""
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., seq_len, head_dim), got {tuple(t.shape)}")
    shapes = f"{tuple(Q.shape)}, {tuple(K.shape)}, {tuple(V.shape)}"
    if grouped and Q.ndim >= 3 and Q.ndim == K.ndim == V.ndim and Q.shape[:-3] == K.shape[:-3] == V.shape[:-3]:
        if K.shape[-3] != V.shape[-3]:
            raise ValueError(f"K and V must have the same number of heads (dim -3), got Q, K, V shapes {shapes}")
        if K.shape[-3] < 1 or Q.shape[-3] % K.shape[-3]:
            raise ValueError(f"query heads ({Q.shape[-3]}) must be a multiple of key/value heads ({K.shape[-3]}) "
                             f"(grouped-query attention, dim -3 of Q, K, V shapes {shapes})")
    elif not (Q.ndim == K.ndim == V.ndim) or not (Q.shape[:-2] == K.shape[:-2] == V.shape[:-2]):
        what = "leading (batch/head) dims" if not grouped else "leading (batch) dims, and heads that group"
        raise ValueError(f"Q, K and V must have the same {what}, got {shapes}")
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


def check_window(window) -> None:
    """``window``: None or ``(left, right)``, two non-negative ints."""
    if window is None:
        return
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window)):
        raise ValueError(f"window must be None or (left, right), two non-negative ints, got {window!r}")
    if window[0] < 0 or window[1] < 0:
        raise ValueError(f"window sides must be non-negative (query i sees keys i - left .. i + right), got {window!r}")


def normalize_window(window, is_causal: bool, n_q: int, n_k: int) -> tuple[int | None, int | None]:
    """(left, right) limits of a validated window, None where a side sees everything: causal masking is a right
    side of 0, and a side that reaches past the sequence's end is no limit (query i sees keys from i - left, which
    is <= 0 for every row when left >= Nq - 1, and up to i + right, >= Nk - 1 for every row when right >= Nk - 1)."""
    left, right = (None, None) if window is None else (int(window[0]), int(window[1]))
    if is_causal:
        right = 0
    if left is not None and left >= n_q - 1:
        left = None
    if right is not None and right >= n_k - 1:
        right = None
    return left, right


INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def check_doc_ids(doc_ids, Q: Tensor, K: Tensor) -> None:
    """``doc_ids``: None or an integer tensor of shape ``Q.shape[:-3] + (N,)`` ((batch, N) for 4-D inputs), on Q's
    device, with as many queries as keys."""
    if doc_ids is None:
        return
    if not isinstance(doc_ids, Tensor):
        raise ValueError(f"doc_ids must be None or an integer torch.Tensor, got {type(doc_ids).__name__}")
    if doc_ids.dtype not in INTEGER_DTYPES:
        names = ", ".join(str(d) for d in INTEGER_DTYPES)
        raise ValueError(f"doc_ids must have an integer dtype ({names}), got {doc_ids.dtype}")
    if Q.shape[-2] != K.shape[-2]:
        raise ValueError(f"doc_ids needs as many queries as keys (packed sequences), got Nq={Q.shape[-2]}, "
                         f"Nk={K.shape[-2]}")
    want = (*Q.shape[:-3], Q.shape[-2])
    if tuple(doc_ids.shape) != want:
        raise ValueError(f"doc_ids must have shape (batch, N) = {want} for Q of shape {tuple(Q.shape)} "
                         f"(batch, heads, N, d), got {tuple(doc_ids.shape)}")
    if doc_ids.device != Q.device:
        raise ValueError(f"doc_ids is on {doc_ids.device}, Q on {Q.device}: they must be on one device")


def check_scale(scale) -> None:
    """``scale``: None (1/sqrt(d)) or a positive finite number."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be None (1/sqrt(head_dim)) or a positive finite number, got {scale!r}")


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
