"""Attention backend ``flash_auto``: the fastest measured of our Triton kernel and SDPA's backends, per shape.

The choice comes from ``auto_choice.json`` next to this module, written by ``cs336-systems flash-bench
--only shapes --auto-table PATH`` from the same-run measurements of ours and the SDPA backends (forward +
backward, the training case; the calls' kernel time where recorded, which is what a CUDA-graph or compiled step
pays). The file holds one table per GPU model, ``{"tables": [{"device": NAME, "records": PATH, "shapes": [...]},
...]}`` (the older single table ``{"device": ..., "shapes": ...}`` reads as a list of one): which kernel wins
differs between GPU models, so each is measured on its own and writing one keeps the others. A call on a CUDA GPU
looks up the table of its model (``torch.cuda.get_device_name``) and in it the nearest measured
shape (same head dim, dtype and causality; nearest in sequence length, then in batch x heads, on a log scale)
and runs what was fastest there: our kernel, or SDPA with that backend first in its priority order (cuDNN,
flash or memory-efficient). SDPA's own dispatch varies with the torch version and GPU (torch 2.11 on an H100
already picks cuDNN, the fastest of its backends there at every model shape, ``results/flash_leaderboard/``,
although the priority order it reports puts flash first), so the measured choice is pinned rather than assumed.
Without a measurement (CPU, an unmeasured GPU model, Nq != Nk, a table without backends) it calls
``F.scaled_dot_product_attention`` as PyTorch dispatches it. Decisions are
cached per (shape, dtype, causality, device) and are constants to ``torch.compile`` (no graph break). Windows
and packed documents (``window=``, ``doc_ids=``) run ours on a CUDA GPU and SDPA with an explicit mask
elsewhere; grouped-query heads follow the table. Registered through the ``cs336_basics.attention_backends``
entry points, so ``BasicsTransformerLM(attention_backend="flash_auto")`` works without importing this package.

``choose(..., sdpa_only=True)`` is the same lookup among SDPA's backends only: ``bench`` pins its answer in the
plain-PyTorch peer, so that both sides of a comparison run the fastest SDPA backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_basics.attention import register_attention_backend, sdpa_attention

AUTO_TABLE = Path(__file__).with_name("auto_choice.json")

# flash-bench's implementation names of SDPA's backends, and PyTorch's own priority order (sdp_utils.cpp)
SDPA_BACKENDS = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
_DEFAULT_ORDER = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
                  SDPBackend.CUDNN_ATTENTION)
_loaded: dict | None = None


def _table() -> dict:
    """The committed table file (no tables where there is none)."""
    global _loaded
    if _loaded is None:
        try:
            _loaded = json.loads(AUTO_TABLE.read_text())
        except FileNotFoundError:
            _loaded = {"tables": []}
    return _loaded


def auto_tables(data: dict) -> list[dict]:
    """The per-GPU-model tables of a table file: ``{"tables": [...]}``, or one table (``{"device": ...,
    "shapes": [...]}``) as a list of one. ValueError for anything else."""
    tables = data.get("tables") if isinstance(data, dict) and "device" not in data else [data]
    if not isinstance(tables, list) or not all(
            isinstance(t, dict) and isinstance(t.get("device"), str) and isinstance(t.get("shapes"), list)
            for t in tables):
        raise ValueError('not a flash_auto table file (expected {"tables": [{"device": NAME, "shapes": [...]}, ...]} '
                         'or one {"device": NAME, "shapes": [...]})')
    return tables


def device_table(device_name: str, table: dict | None = None) -> dict | None:
    """The table measured on GPU model ``device_name`` in ``table`` (a table file or one table; default: the
    committed file), or None."""
    tables = auto_tables(_table() if table is None else table)
    return next((t for t in tables if t["device"] == device_name), None)


def choose(batch_heads: int, seq_len: int, head_dim: int, dtype: torch.dtype, causal: bool, device_name: str,
           table: dict | None = None, sdpa_only: bool = False) -> str:
    """What ran fastest at the nearest measured shape on GPU model ``device_name``: ``"flash_triton"``, an SDPA
    backend (``"sdpa_cudnn"``, ``"sdpa_flash"``, ``"sdpa_efficient"``) or ``"sdpa"`` (PyTorch's own dispatch:
    nothing measured on that model, or a table that names no backend). ``table``: a table file or one table
    (default: the committed file). ``sdpa_only``: among SDPA's backends."""
    table = device_table(device_name, table)
    if table is None:
        return "sdpa"
    dtype_name = str(dtype).removeprefix("torch.")
    rows = [r for r in table["shapes"] if r["head_dim"] == head_dim and r["dtype"] == dtype_name
            and r["causal"] == causal]
    if not rows:
        return "sdpa"
    nearest = min(rows, key=lambda r: (abs(math.log2(r["seq_len"] / seq_len)),
                                       abs(math.log2(r["batch_heads"] / batch_heads))))
    if not sdpa_only and nearest["ours_ms"] <= nearest["sdpa_ms"]:
        return "flash_triton"
    return nearest.get("sdpa_backend", "sdpa")


def sdpa_priority(choice: str) -> list[SDPBackend] | None:
    """SDPA's backends with ``choice`` first and the rest in PyTorch's order (for ``sdpa_kernel(...,
    set_priority=True)``: a backend that cannot run the call falls through to the next); None for ``"sdpa"``."""
    first = SDPA_BACKENDS.get(choice)
    return None if first is None else [first, *(b for b in _DEFAULT_ORDER if b != first)]


_choices: dict[tuple, str] = {}


def _constant_under_compile(fn):
    """``torch.compiler.assume_constant_result`` (Dynamo calls ``fn`` while tracing and bakes in its result) without
    importing ``torch._dynamo`` at import time: that imports Triton, which must come after ``TRITON_INTERPRET`` is
    decided. The attribute is what the decorator sets (a test checks that it still does)."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_under_compile
def _decide(q_shape: tuple[int, ...], k_shape: tuple[int, ...], dtype: torch.dtype, is_causal: bool,
            device: torch.device, sdpa_only: bool) -> str:
    """The cached choice for one call's shapes (a constant under ``torch.compile``: shapes, dtype and device
    are fixed within one compiled graph)."""
    key = (q_shape, k_shape, dtype, is_causal, device, sdpa_only)
    choice = _choices.get(key)
    if choice is None:
        choice = "sdpa"
        if device.type == "cuda" and q_shape[-2] == k_shape[-2]:
            choice = choose(math.prod(q_shape[:-2]), q_shape[-2], q_shape[-1], dtype, is_causal,
                            torch.cuda.get_device_name(device), sdpa_only=sdpa_only)
        _choices[key] = choice
    return choice


@register_attention_backend("flash_auto")
def flash_auto_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, *, window=None,
                         doc_ids: Tensor | None = None) -> Tensor:
    """Backend ``flash_auto``: q (B, Hq, T, d), k and v (B, Hkv, T, d); ours or an SDPA backend by the measured
    table. On a CUDA GPU a call with a window or documents always runs ours (it skips the tiles no query sees;
    SDPA would take a dense mask); grouped heads alone are chosen by the table as B x Hq heads. Off CUDA: SDPA
    (``enable_gqa`` and an explicit mask, through cs336_basics' ``sdpa`` backend)."""
    extras = {name: x for name, x in (("window", window), ("doc_ids", doc_ids)) if x is not None}
    if extras and q.device.type == "cuda":
        choice = "flash_triton"
    else:
        # off CUDA, a window or documents go to SDPA with a mask (sdpa_only: never our kernel there)
        choice = _decide(tuple(q.shape), tuple(k.shape), q.dtype, is_causal, q.device, bool(extras))
    if choice == "flash_triton":
        from cs336_systems.attention.flash_triton import flash_attention

        return flash_attention(q, k, v, is_causal, **extras)
    priority = sdpa_priority(choice)
    if priority is None:
        return sdpa_attention(q, k, v, is_causal, **extras)
    with sdpa_kernel(priority, set_priority=True):
        return sdpa_attention(q, k, v, is_causal, **extras)
