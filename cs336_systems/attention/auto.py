"""Attention backend ``flash_auto``: our Triton kernel where it was measured at least as fast as SDPA, else SDPA.

The choice comes from ``auto_choice.json`` next to this module, written by ``cs336-systems flash-bench
--only shapes --auto-table PATH`` from the same-run measurements of ours and the SDPA backends (forward +
backward, the training case) on one GPU model. A call uses our kernel when it runs on a CUDA GPU of that
model and the nearest measured shape (same head dim, dtype and causality; nearest in sequence length,
then in batch x heads, on a log scale) had ours no slower than the fastest SDPA backend; otherwise (CPU,
another GPU, no measurement, Nq != Nk) it calls ``F.scaled_dot_product_attention``. Decisions are cached
per (shape, dtype, causality, device). Windows and packed documents (``window=``, ``doc_ids=``) run ours on a
CUDA GPU and SDPA with an explicit mask elsewhere; grouped-query heads follow the table. Registered through the
``cs336_basics.attention_backends`` entry points, so ``BasicsTransformerLM(attention_backend="flash_auto")``
works without importing this package.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch
from torch import Tensor

from cs336_basics.attention import register_attention_backend, sdpa_attention

AUTO_TABLE = Path(__file__).with_name("auto_choice.json")


@functools.cache
def _table() -> dict:
    try:
        return json.loads(AUTO_TABLE.read_text())
    except FileNotFoundError:
        return {}


def choose(batch_heads: int, seq_len: int, head_dim: int, dtype: torch.dtype, causal: bool, device_name: str,
           table: dict | None = None) -> str:
    """``"flash_triton"`` or ``"sdpa"`` for this shape (see the module docstring)."""
    table = _table() if table is None else table
    if table.get("device") != device_name:
        return "sdpa"
    dtype_name = str(dtype).removeprefix("torch.")
    rows = [r for r in table.get("shapes", []) if r["head_dim"] == head_dim and r["dtype"] == dtype_name
            and r["causal"] == causal]
    if not rows:
        return "sdpa"
    nearest = min(rows, key=lambda r: (abs(math.log2(r["seq_len"] / seq_len)),
                                       abs(math.log2(r["batch_heads"] / batch_heads))))
    return "flash_triton" if nearest["ours_ms"] <= nearest["sdpa_ms"] else "sdpa"


_choices: dict[tuple, str] = {}


@register_attention_backend("flash_auto")
def flash_auto_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, *, window=None,
                         doc_ids: Tensor | None = None) -> Tensor:
    """Backend ``flash_auto``: q (B, Hq, T, d), k and v (B, Hkv, T, d); ours or SDPA by the measured table. On a
    CUDA GPU a call with a window or documents always runs ours (it skips the tiles no query sees; SDPA would
    take a dense mask); grouped heads alone are chosen by the table as B x Hq heads. Off CUDA: SDPA
    (``enable_gqa`` and an explicit mask, through cs336_basics' ``sdpa`` backend)."""
    extras = {name: x for name, x in (("window", window), ("doc_ids", doc_ids)) if x is not None}
    key = (q.shape, k.shape, q.dtype, is_causal, q.device)
    choice = _choices.get(key)
    if choice is None:
        choice = "sdpa"
        if q.device.type == "cuda" and q.shape[-2] == k.shape[-2]:
            bh = math.prod(q.shape[:-2])
            choice = choose(bh, q.shape[-2], q.shape[-1], q.dtype, is_causal, torch.cuda.get_device_name(q.device))
        _choices[key] = choice
    if choice == "flash_triton" or (extras and q.device.type == "cuda"):
        from cs336_systems.attention.flash_triton import flash_attention

        return flash_attention(q, k, v, is_causal, **extras)
    if extras or k.shape[:-2] != q.shape[:-2]:
        return sdpa_attention(q, k, v, is_causal, **extras)
    return sdpa_attention(q, k, v, is_causal)
