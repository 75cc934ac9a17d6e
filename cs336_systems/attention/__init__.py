"""Attention implementations chosen by name (``BasicsTransformerLM(attention_backend=...)``).

- ``flash_torch``: :class:`~cs336_systems.attention.flash_torch.FlashAttention2Torch`, tiled FlashAttention-2
  in plain PyTorch (the reference for the kernels).
- ``flash_triton``: :func:`flash_attention` (Triton forward and backward kernels; the course's class is
  :class:`~cs336_systems.attention.flash_triton.FlashAttention2Triton`), with grouped-query heads, ``window`` and
  ``doc_ids``.
- ``flash_auto``: ``flash_triton`` at the shapes where it was measured at least as fast as SDPA on this GPU
  model, SDPA elsewhere (:mod:`cs336_systems.attention.auto`).

Both are registered as backends through the ``cs336_basics.attention_backends`` entry points, and also when
this package is imported. The Triton module is imported lazily (it needs Triton, and ``TRITON_INTERPRET``
must be decided before it is imported).
"""

from __future__ import annotations

from cs336_basics.attention import register_attention_backend
from cs336_systems.attention.flash_torch import FlashAttention2Torch, flash_torch_attention


def flash_attention(q, k, v, is_causal=False, *, window=None, doc_ids=None, scale=None, deterministic=False):
    """Attention with grouped-query heads, sliding windows and packed documents, Triton forward and backward:
    :func:`cs336_systems.attention.flash_triton.flash_attention` (imported on first use)."""
    from cs336_systems.attention.flash_triton import flash_attention as fn

    return fn(q, k, v, is_causal, window=window, doc_ids=doc_ids, scale=scale, deterministic=deterministic)


def flash_triton_attention(q, k, v, is_causal, *, window=None, doc_ids=None):
    """Backend ``flash_triton`` (imports the Triton module on first use)."""
    from cs336_systems.attention.flash_triton import flash_attention as fn

    return fn(q, k, v, is_causal, window=window, doc_ids=doc_ids)


def __getattr__(name):
    if name == "FlashAttention2Triton":
        from cs336_systems.attention.flash_triton import FlashAttention2Triton

        return FlashAttention2Triton
    raise AttributeError(name)


register_attention_backend("flash_triton", flash_triton_attention)
from cs336_systems.attention.auto import flash_auto_attention  # noqa: E402  (registers "flash_auto")

__all__ = ["FlashAttention2Torch", "FlashAttention2Triton", "flash_attention", "flash_auto_attention",
           "flash_torch_attention", "flash_triton_attention"]
