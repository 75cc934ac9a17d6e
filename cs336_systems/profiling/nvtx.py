"""Named ranges visible to both Nsight Systems (NVTX) and ``torch.profiler`` (``record_function``),
and an instrumented copy of the reference attention registered as the backend ``reference_nvtx``.

``nsys profile --capture-range=nvtx --nvtx-capture=measured ...`` keeps only the measured steps;
inside them ``forward`` / ``backward`` / ``optimizer`` separate the phases, and inside each attention
call ``attention/scores``, ``attention/softmax`` and ``attention/final_matmul`` separate the score
matmul, the softmax and the PV matmul. The model itself stays free of profiling code: the
instrumented attention is chosen by name (``attention_backend="reference_nvtx"``).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import Tensor

from cs336_basics.attention import register_attention_backend
from cs336_basics.nn_utils import softmax

ATTENTION_RANGES = ("attention/scores", "attention/softmax", "attention/final_matmul")


@contextmanager
def annotate(name: str):
    """An NVTX range (on CUDA) and a ``torch.profiler.record_function`` range of the same name."""
    use_nvtx = torch.cuda.is_available()
    if use_nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(name):
            yield
    finally:
        if use_nvtx:
            torch.cuda.nvtx.range_pop()


@register_attention_backend("reference_nvtx")
def annotated_reference_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    """The same arithmetic as ``cs336_basics.model.scaled_dot_product_attention``, in annotated pieces."""
    with annotate("attention"):
        with annotate(ATTENTION_RANGES[0]):
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
            if is_causal:
                allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
                scores = scores.masked_fill(~allowed, float("-inf"))
        with annotate(ATTENTION_RANGES[1]):
            probs = softmax(scores, dim=-1)
        with annotate(ATTENTION_RANGES[2]):
            return probs @ v
