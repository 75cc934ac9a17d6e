"""Attention backends, chosen by name when a model is built.

A backend is a function ``attn(q, k, v, is_causal, *, window=None, doc_ids=None) -> out``:

- ``q`` is ``(batch, Hq, Nq, d)``, ``k`` and ``v`` are ``(batch, Hkv, Nk, d)`` with ``Hq`` a multiple of
  ``Hkv``: query head h reads key/value head ``h // (Hq // Hkv)`` (grouped-query; ``Hkv = 1`` is multi-query).
- ``is_causal``: query i sees keys 0..i (top-left aligned).
- ``window=(left, right)``, non-negative ints: query i sees keys i - left .. i + right (top-left aligned;
  with ``is_causal`` the right side is 0). ``None``: no limit.
- ``doc_ids``: integer ``(batch, N)`` (needs Nq == Nk): query i sees key j only where their ids are equal
  (documents packed into one sequence).

All masks combine (a key is visible where every one allows it); a query that sees no key has no defined
output. A backend that only takes ``(q, k, v, is_causal)`` (the first protocol) still works for models that
use none of the extras: the model passes ``window`` / ``doc_ids`` only when they are set, and refuses to
build grouped-query or windowed attention on a backend that does not take them
(:func:`supports_attention_extras`).

Two backends live here: ``reference`` (our own ``scaled_dot_product_attention`` on an explicit boolean mask,
materialising the score matrix; defined here so that the model imports this module and not the reverse,
and re-exported by ``cs336_basics.model`` under the course's name) and ``sdpa``
(``torch.nn.functional.scaled_dot_product_attention``, which dispatches to flash / cuDNN /
memory-efficient kernels). Other packages add theirs either by calling
:func:`register_attention_backend` or, so that a name works before anything imported them, through
the ``cs336_basics.attention_backends`` entry-point group (``name = "module:function"``), which is
how ``cs336_systems`` provides ``flash_torch`` and ``flash_triton`` without this package importing it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from importlib.metadata import entry_points

import torch
import torch.nn.functional as F
from torch import Tensor

from cs336_basics.nn_utils import softmax

# attn(q, k, v, is_causal) -> out, optionally with keywords window= and doc_ids= (see the module docstring)
AttentionFn = Callable[..., Tensor]
Window = tuple[int, int]

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


def supports_attention_extras(fn: AttentionFn) -> bool:
    """Whether ``fn`` takes the keywords ``window`` and ``doc_ids`` (and with them grouped-query k / v): the
    second protocol of the module docstring. Read from its signature; one that cannot be read counts as no."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return {"window", "doc_ids"} <= names or any(p.kind == p.VAR_KEYWORD for p in params)


def check_attention_args(q: Tensor, k: Tensor, v: Tensor, window: Window | None = None,
                         doc_ids: Tensor | None = None) -> None:
    """``ValueError`` naming the problem for heads that do not group, a malformed window or ``doc_ids``."""
    if k.shape != v.shape:
        raise ValueError(f"attention: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.dim() < 2 or k.dim() != q.dim() or q.shape[:-3] != k.shape[:-3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"attention: q (..., Hq, Nq, d) and k, v (..., Hkv, Nk, d) must agree in batch dims and d, "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    hq, hkv = _heads(q), _heads(k)
    if hkv < 1 or hq % hkv:
        raise ValueError(f"attention: query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    if window is not None and (not isinstance(window, (tuple, list)) or len(window) != 2
                               or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in window)):
        raise ValueError(f"attention: window must be (left, right), two non-negative ints, or None; got {window!r}")
    if doc_ids is not None:
        if not isinstance(doc_ids, Tensor) or doc_ids.dtype.is_floating_point or doc_ids.dtype.is_complex \
                or doc_ids.dtype == torch.bool:
            raise ValueError(f"attention: doc_ids must be an integer tensor, got "
                             f"{doc_ids.dtype if isinstance(doc_ids, Tensor) else type(doc_ids).__name__}")
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"attention: doc_ids needs as many queries as keys, got Nq={q.shape[-2]}, "
                             f"Nk={k.shape[-2]}")
        if q.dim() != 4 or doc_ids.shape != (q.shape[0], q.shape[-2]):
            raise ValueError(f"attention: doc_ids must have shape (batch, N) = ({q.shape[0]}, {q.shape[-2]}) for "
                             f"q of shape (batch, heads, N, d) = {tuple(q.shape)}, got {tuple(doc_ids.shape)}")


def _heads(t: Tensor) -> int:
    return t.shape[-3] if t.dim() >= 3 else 1


def attention_mask(n_queries: int, n_keys: int, *, is_causal: bool = False, window: Window | None = None,
                   doc_ids: Tensor | None = None, device: torch.device | str | None = None) -> Tensor | None:
    """Boolean mask, True where query i may attend key j: ``(Nq, Nk)``, or ``(batch, 1, N, N)`` with ``doc_ids``
    (broadcasts over heads); ``None`` when nothing is masked. Positions are top-left aligned."""
    if not is_causal and window is None and doc_ids is None:
        return None
    if doc_ids is not None:
        device = doc_ids.device
    offset = torch.arange(n_keys, device=device)[None, :] - torch.arange(n_queries, device=device)[:, None]  # j - i
    mask = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)
    if is_causal:
        mask &= offset <= 0
    if window is not None:
        mask &= (offset >= -window[0]) & (offset <= window[1])
    if doc_ids is not None:
        mask = mask & (doc_ids[:, None, :, None] == doc_ids[:, None, None, :])  # (B, 1, N, N)
    return mask


def expand_kv_heads(t: Tensor, n_heads: int) -> Tensor:
    """``(..., Hkv, N, d)`` -> ``(..., n_heads, N, d)``: query head h reads key/value head h // (n_heads // Hkv)."""
    if _heads(t) == n_heads:
        return t
    return t.repeat_interleave(n_heads // t.shape[-3], dim=-3)


def scaled_dot_product_attention(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d)) V (re-exported as ``cs336_basics.model.scaled_dot_product_attention``).

    ``mask``: boolean, broadcastable to ``(..., Tq, Tk)``, True where attention is allowed.
    """
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return softmax(scores, dim=-1) @ V


@register_attention_backend("reference")
def reference_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, *, window: Window | None = None,
                        doc_ids: Tensor | None = None) -> Tensor:
    """Explicit mask and key/value heads repeated to the query heads: the oracle for the other backends."""
    check_attention_args(q, k, v, window, doc_ids)
    mask = attention_mask(q.shape[-2], k.shape[-2], is_causal=is_causal, window=window, doc_ids=doc_ids,
                          device=q.device)
    hq = _heads(q)
    return scaled_dot_product_attention(q, expand_kv_heads(k, hq), expand_kv_heads(v, hq), mask)


@register_attention_backend("sdpa")
def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, *, window: Window | None = None,
                   doc_ids: Tensor | None = None) -> Tensor:
    """``F.scaled_dot_product_attention``; grouped heads through ``enable_gqa`` on the unmasked path. With a
    window or documents the mask is explicit and k / v are repeated to the query heads instead: SDPA with both
    ``enable_gqa`` and ``attn_mask`` takes its math path, which materialises the scores (the memory-efficient
    kernel takes a mask but not grouped heads; e.g. ComfyUI PR #15135, transformers' ``use_gqa_in_sdpa``)."""
    check_attention_args(q, k, v, window, doc_ids)
    hq, hkv = _heads(q), _heads(k)
    if window is None and doc_ids is None and not (is_causal and q.shape[-2] != k.shape[-2]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=hkv != hq)
    # torch's is_causal is top-left aligned too, but only documented for square masks: be explicit.
    mask = attention_mask(q.shape[-2], k.shape[-2], is_causal=is_causal, window=window, doc_ids=doc_ids,
                          device=q.device)
    return F.scaled_dot_product_attention(q, expand_kv_heads(k, hq), expand_kv_heads(v, hq), attn_mask=mask)
