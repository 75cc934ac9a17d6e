"""Memory and communication arithmetic (handout problem ``communication_accounting``; DDP overhead model
of ``ddp_bucketed_benchmarking`` (b)). Every number the report quotes for these is computed here.

XXL model of the handout: ``num_blocks`` blocks of two bias-free linears ``d_model -> d_ff -> d_model``
(attention, embeddings and the output layer omitted). FP32 master weights, gradients and AdamW's two
moments; BF16 activations and gradient communication; no activation checkpointing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True, kw_only=True)
class FFNStack:
    d_model: int = 16_384
    d_ff: int = 53_248
    num_blocks: int = 126

    @property
    def params(self) -> int:
        return self.num_blocks * 2 * self.d_model * self.d_ff

    @property
    def fp32_state_bytes(self) -> int:
        """Master weights (4 B) + accumulated gradients (4 B) + AdamW m and v (8 B) per parameter."""
        return 16 * self.params

    @property
    def activation_bytes_per_token(self) -> int:
        """Saved for backward, per token, in BF16: the input of each linear (d_model for the first, d_ff for
        the second; with no nonlinearity nothing else is needed)."""
        return 2 * self.num_blocks * (self.d_model + self.d_ff)


def devices_for(nbytes: float, device_bytes: float) -> int:
    return math.ceil(nbytes / device_bytes)


def fsdp_bytes_per_device(m: FFNStack, n_fsdp: int, tokens: int) -> float:
    """(b): state and half of the activations sharded over ``n_fsdp`` devices, the other half replicated."""
    act = m.activation_bytes_per_token * tokens
    return m.fp32_state_bytes / n_fsdp + act / 2 + act / (2 * n_fsdp)


def min_fsdp_degree(m: FFNStack, device_bytes: float, tokens: int) -> int | None:
    """Smallest N_FSDP with ``fsdp_bytes_per_device <= device_bytes``; None if the replicated half of the
    activations alone does not fit."""
    act = m.activation_bytes_per_token * tokens
    room = device_bytes - act / 2
    if room <= 0:
        return None
    return max(1, math.ceil((m.fp32_state_bytes + act / 2) / room))


@dataclass(frozen=True, kw_only=True)
class Mesh:
    """TPU v5p numbers of the handout / Scaling Book: X-way FSDP, Y-way TP on a 3D torus slice."""

    x: int = 16  # FSDP
    y: int = 4  # TP
    m_x: int = 2  # mesh axes the FSDP dimension spans
    m_y: int = 1
    w_ici: float = 2 * 9e10  # bytes/s, bidirectional per link
    flops: float = 4.6e14  # bf16 FLOP/s per chip


def fsdp_tp_min_batch_per_device(m: FFNStack, mesh: Mesh) -> float:
    """(c): per-device tokens above which a forward through the FFN stack is compute bound.

    Per block and per device (Austin et al. 2025, Scaling Book part 5, mixed FSDP + TP), with b tokens per device
    and N = X * Y devices:  T_math = 4 b D F / C;  T_fsdp = 4 D F / (Y W M_X)  (all-gather of the weights over X);
    T_tp = 4 b Y D / (W M_Y)  (activation all-gather / reduce-scatter over Y, batch B = b N spread over X).
    Compute bound when T_math >= T_fsdp + T_tp:  b >= (F / (Y W M_X)) / (F / C - Y / (W M_Y)).
    """
    f = m.d_ff
    denom = f / mesh.flops - mesh.y / (mesh.w_ici * mesh.m_y)
    if denom <= 0:
        return math.inf  # TP communication alone outgrows compute at any batch
    return (f / (mesh.y * mesh.w_ici * mesh.m_x)) / denom


def ddp_overhead_s(total_bytes: float, bandwidth: float, per_call_s: float, n_buckets: int) -> float:
    """(ddp_bucketed_benchmarking b) Time after backward until gradients are averaged, with n_b equal buckets
    whose compute time equals their transfer time c = s / (n_b w): bucket i's transfer starts after its
    compute and after bucket i-1's transfer, so the communication stream finishes at
    n_b (o + c) + c while backward ends at n_b c:  overhead = s / (n_b w) + n_b o."""
    return total_bytes / (n_buckets * bandwidth) + n_buckets * per_call_s


def optimal_buckets(total_bytes: float, bandwidth: float, per_call_s: float) -> tuple[float, float]:
    """d/dn_b = 0  ->  n_b* = sqrt(s / (w o)); bucket size b* = s / n_b* = sqrt(s w o)."""
    n = math.sqrt(total_bytes / (bandwidth * per_call_s))
    return n, total_bytes / n


def fit_latency_model(sizes_bytes: list[float], latencies_s: list[float]) -> tuple[float, float]:
    """Least-squares fit of latency = o + bytes / w; returns (o seconds, w bytes/s)."""
    n = len(sizes_bytes)
    if n < 2:
        raise ValueError("fit_latency_model: need at least two sizes")
    mx, my = sum(sizes_bytes) / n, sum(latencies_s) / n
    sxx = sum((x - mx) ** 2 for x in sizes_bytes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes_bytes, latencies_s)) / sxx
    return max(my - slope * mx, 0.0), 1.0 / slope
