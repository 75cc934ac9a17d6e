"""Attention backends, chosen by name when a model is built.

A backend is a function ``attn(q, k, v, is_causal) -> out`` on tensors of shape
``(batch, heads, seq, head_dim)``; causal masking is top-left aligned (query i sees keys 0..i).

Two backends live here: ``reference`` (our own ``scaled_dot_product_attention``, materialising the
score matrix; defined here so that the model imports this module and not the reverse, and
re-exported by ``cs336_basics.model`` under the course's name) and ``sdpa``
(``torch.nn.functional.scaled_dot_product_attention``, which dispatches to flash / cuDNN /
memory-efficient kernels). Other packages add theirs either by calling
:func:`register_attention_backend` or, so that a name works before anything imported them, through
the ``cs336_basics.attention_backends`` entry-point group (``name = "module:function"``), which is
how ``cs336_systems`` provides ``flash_torch`` and ``flash_triton`` without this package importing it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from importlib.metadata import entry_points

import torch
import torch.nn.functional as F
from torch import Tensor

from cs336_basics.nn_utils import softmax

AttentionFn = Callable[[Tensor, Tensor, Tensor, bool], Tensor]

ENTRY_POINT_GROUP = "cs336_basics.attention_backends"
_BACKENDS: dict[str, AttentionFn] = {}


def register_attention_backend(name: str, fn: AttentionFn | None = None):
    """Register ``fn`` under ``name``; usable as a decorator (``@register_attention_backend("x")``)."""

    def _register(f: AttentionFn) -> AttentionFn:
        _BACKENDS[name] = f
        return f

    return _register if fn is None else _register(fn)


def _entry_point_backends() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_attention_backends() -> list[str]:
    """Names that :func:`get_attention_backend` accepts (registered or advertised by entry points)."""
    return sorted(set(_BACKENDS) | set(_entry_point_backends()))


def get_attention_backend(name: str) -> AttentionFn:
    """Return the backend registered as ``name``; ``ValueError`` naming the choices if there is none."""
    if name not in _BACKENDS:
        ep = _entry_point_backends().get(name)
        if ep is not None:
            _BACKENDS[name] = ep.load()
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join(available_attention_backends())}")
    return _BACKENDS[name]


def scaled_dot_product_attention(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d)) V (re-exported as ``cs336_basics.model.scaled_dot_product_attention``).

    ``mask``: boolean, broadcastable to ``(..., Tq, Tk)``, True where attention is allowed.
    """
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return softmax(scores, dim=-1) @ V


def _causal_mask(n_queries: int, n_keys: int, device: torch.device) -> Tensor:
    # True where attention is allowed; top-left aligned: query i sees keys 0..i.
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril()


@register_attention_backend("reference")
def reference_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    mask = _causal_mask(q.shape[-2], k.shape[-2], q.device) if is_causal else None
    return scaled_dot_product_attention(q, k, v, mask)


@register_attention_backend("sdpa")
def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    if is_causal and q.shape[-2] != k.shape[-2]:
        # torch's is_causal is top-left aligned too, but only documented for square masks: be explicit.
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_mask(q.shape[-2], k.shape[-2], q.device))
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
