"""Model size presets and the arithmetic on them (parameter count, training FLOPs per token).

Presets ``small`` .. ``2.7B`` are Table 1 of the CS336 A2 handout (2025 edition; the 2026 table's
``xl`` row is our ``2.7B``): vocabulary 10,000, batch 4, context 512 unless a benchmark says
otherwise. ``8b`` is the 2026 leaderboard model. ``tiny`` is ours, sized for CPU tests and the
CPU default of ``make bench``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Hyperparameters of one ``BasicsTransformerLM`` plus the batch it is benchmarked with."""

    name: str = "custom"
    vocab_size: int = 10_000
    context_length: int = 512  # maximum sequence length (RoPE table size)
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    rope_theta: float = 10_000.0
    num_kv_heads: int | None = None  # key/value heads (grouped-query attention); None: num_heads
    attention_window: int | None = None  # sliding window: keys per query, itself included; None: all earlier
    batch_size: int = 4
    dtype: str = "fp32"  # parameter dtype the preset is meant to be trained in

    def __post_init__(self):
        for f in ("vocab_size", "context_length", "d_model", "d_ff", "num_layers", "num_heads", "batch_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelConfig.{f} must be a positive integer, got {v!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        kv = self.num_kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.num_heads % kv):
            raise ValueError(f"ModelConfig.num_kv_heads must be a positive divisor of num_heads ({self.num_heads}) "
                             f"or None, got {kv!r}")
        w = self.attention_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"ModelConfig.attention_window must be a positive integer or None, got {w!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose from {sorted(_DTYPES)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def model_kwargs(self) -> dict:
        """Keyword arguments for ``BasicsTransformerLM`` (``num_kv_heads`` / ``attention_window`` only when set, so
        the handout model's arguments stay as they were)."""
        kwargs = dict(
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            d_model=self.d_model,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            d_ff=self.d_ff,
            rope_theta=self.rope_theta,
        )
        for name in ("num_kv_heads", "attention_window"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        return kwargs


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        name="tiny", vocab_size=512, context_length=128, d_model=64, d_ff=192, num_layers=2, num_heads=4
    ),
    "small": ModelConfig(name="small", d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": ModelConfig(name="medium", d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": ModelConfig(name="large", d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": ModelConfig(name="xl", d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": ModelConfig(name="2.7B", d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    "8b": ModelConfig(
        name="8b",
        vocab_size=151_936,
        context_length=32_768,
        d_model=4096,
        d_ff=11_008,
        num_layers=34,
        num_heads=32,
        batch_size=2,
        dtype="bf16",
    ),
}
HANDOUT_PRESETS = ("small", "medium", "large", "xl", "2.7B")


def get_preset(name: str, **overrides) -> ModelConfig:
    """The preset called ``name`` (case-insensitive), with ``overrides`` applied; ``ValueError`` if unknown."""
    by_lower = {k.lower(): v for k, v in PRESETS.items()}
    if name.lower() not in by_lower:
        raise ValueError(f"unknown model preset {name!r}; choose from {', '.join(PRESETS)}")
    cfg = by_lower[name.lower()]
    return cfg.replace(**overrides) if overrides else cfg


def parse_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {sorted(_DTYPES)}")
    return _DTYPES[name]


# --- arithmetic ------------------------------------------------------------------------------


def count_parameters(cfg: ModelConfig) -> int:
    """Exact parameter count of ``BasicsTransformerLM(**cfg.model_kwargs())``.

    Embedding V*D; per block 2*D^2 + 2*D*(Hkv*Dh) (q and out projections, k and v over the key/value heads; 4*D^2
    without grouped-query attention; no bias) + 3*D*F (SwiGLU) + 2*D (two RMSNorm gains); final RMSNorm D;
    untied LM head D*V.
    """
    d, f, v, n = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers
    return v * d + n * (_attention_weights(cfg) + 3 * d * f + 2 * d) + d + d * v


def _attention_weights(cfg: ModelConfig) -> int:
    d = cfg.d_model
    return 2 * d * d + 2 * d * cfg.kv_heads * cfg.head_dim


def matmul_parameters(cfg: ModelConfig) -> int:
    """Parameters that take part in a matrix multiply (all but the embedding lookup and norm gains)."""
    d, f, v, n = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers
    return n * (_attention_weights(cfg) + 3 * d * f) + d * v


def forward_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = False) -> int:
    """Forward FLOPs per token: 2 per matmul parameter, plus attention's QK^T and PV (2 * 2 * T * D per
    layer, counted over the full T x T score matrix, as PaLM does). ``causal=True`` counts only the
    visible half of the scores (the convention of FlashAttention's benchmarks and of the 2026 leaderboard's
    4.74 PFLOP per step). Kaplan et al. 2020 (Scaling Laws, sec. 2.1) and Chowdhery et al. 2022 (PaLM, app. B).
    Grouped-query heads leave the score FLOPs as they are (every query head still scores every key); a sliding
    window or packed documents are not discounted (MFU then counts the scores as if all were visible).
    """
    attention = 4 * cfg.num_layers * seq_len * cfg.d_model
    return 2 * matmul_parameters(cfg) + (attention // 2 if causal else attention)


def training_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = False) -> int:
    """Forward + backward: the backward costs twice the forward (grads w.r.t. inputs and weights),
    so 3x forward = 6N + 12 L T D (PaLM, appendix B); ``causal`` as in :func:`forward_flops_per_token`."""
    return 3 * forward_flops_per_token(cfg, seq_len, causal)


def activation_lower_bound(cfg: ModelConfig, seq_len: int, batch: int, *, precision: str, attention: str | None,
                           loss: str = "unfused", activation_checkpointing: str = "none",
                           backward: bool = True) -> int:
    """Bytes of a step's activations at least: a little of every layer's (4 * B * T * d_model), the attention
    probabilities the reference backend materialises (B * H * T^2 a layer) and the logits (B * T * vocab, fp32 for
    the loss; none with the fused loss). One layer's at a time under group activation checkpointing (k, nested)
    or without a backward (``backward=False``: nothing is saved); selective checkpointing still saves each block's
    matmul and score outputs, which the per-layer term stays below. A lower bound: a step above it cannot fit."""
    elt = 2 if precision == "bf16" else 4
    per_layer = 4 * batch * seq_len * cfg.d_model * elt
    if attention in (None, "reference"):
        per_layer += batch * cfg.num_heads * seq_len * seq_len * elt
    # the loss takes the logits in fp32; a forward alone leaves them in the compute dtype
    logits = 0 if loss == "fused" else (4 if backward else elt) * batch * seq_len * cfg.vocab_size
    one_at_a_time = not backward or activation_checkpointing not in ("none", "selective")
    return int((1 if one_at_a_time else cfg.num_layers) * per_layer + logits)
