"""A pre-norm decoder-only Transformer LM (CS336 A1 architecture), written from scratch.

    x = Embedding(tokens)
    for each block:  x = x + Attn(RMSNorm(x)) ;  x = x + SwiGLU(RMSNorm(x))
    logits = Linear(RMSNorm(x))            # untied LM head

Attention is causal multi-head self-attention with RoPE on the queries and keys of every head, optionally
with fewer key/value heads (``num_kv_heads``), a sliding window (``attention_window``) and packed documents
(``forward(tokens, doc_ids)``); the attention kernel is picked by name (see ``cs336_basics.attention``).
Shapes in comments: B batch, T sequence, D d_model, H heads, Hkv key/value heads, Dh head dim, V vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from einops import rearrange
from torch import Tensor

# scaled_dot_product_attention: the course's fixed name here; defined beside the backends, re-exported
from cs336_basics.attention import AttentionFn, get_attention_backend, supports_attention_extras
from cs336_basics.attention import scaled_dot_product_attention as scaled_dot_product_attention


class Linear(nn.Module):
    """y = x W^T, no bias; W is ``(d_out, d_in)``, truncated-normal init with std sqrt(2/(d_in+d_out)) cut at 3 std."""

    def __init__(self, d_in: int, d_out: int, device=None, dtype=None):
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        self.weight = nn.Parameter(torch.empty(d_out, d_in, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = math.sqrt(2.0 / (self.d_in + self.d_out))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}"


class Embedding(nn.Module):
    """Lookup table ``(vocab_size, d_model)``, truncated-normal init (std 1, cut at 3)."""

    def __init__(self, vocab_size: int, d_model: int, device=None, dtype=None):
        super().__init__()
        self.vocab_size, self.d_model = vocab_size, d_model
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: Tensor) -> Tensor:
        return self.weight[token_ids]

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, d_model={self.d_model}"


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g, computed in fp32 and cast back to the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x = x.float()
        rms_inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x * rms_inv * self.weight.float()).to(in_dtype)


def silu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


class SwiGLU(nn.Module):
    """W2(SiLU(W1 x) * W3 x); W1, W3: d_model -> d_ff, W2: d_ff -> d_model.

    ``kernel``: None, or a function ``(x, w1, w2, w3) -> y`` of the three weights with the same arithmetic that
    computes the layer instead (a fused kernel, e.g. ``cs336_systems.fused.swiglu.swiglu_ffn``)."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.kernel = None

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel is not None:
            return self.kernel(x, self.w1.weight, self.w2.weight, self.w3.weight)
        return self.w2(silu(self.w1(x)) * self.w3(x))


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Each pair (x[2k], x[2k+1]) of ``x`` (..., dim) rotated by the angle whose cos / sin are ``cos`` / ``sin``
    (..., dim/2, broadcast against x), in fp32, rounded once to ``x``'s dtype."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al., 2021): rotate each pair (x[2k], x[2k+1]) at position i by i * theta^(-2k/dim).

    cos/sin tables ``(context_length, dim/2)`` are non-persistent buffers (they follow ``.to()``
    but are not in the state dict). ``kernel``: None, or a function ``(x, cos, sin) -> rotated x`` with the same
    arithmetic that rotates instead (a fused kernel, e.g. ``cs336_systems.fused.rope.rotate``).
    """

    def __init__(self, context_length: int, dim: int, theta: float = 10000.0, device=None):
        super().__init__()
        if dim % 2:
            raise ValueError(f"RotaryEmbedding: dim must be even, got {dim}")
        self.context_length, self.dim, self.theta = context_length, dim, theta
        inv_freq = theta ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)  # (dim/2,)
        angles = torch.outer(torch.arange(context_length, device=device, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        self.kernel = None

    def forward(self, x: Tensor, token_positions: Tensor) -> Tensor:
        """x: (..., dim); token_positions: integer positions broadcastable to ``x.shape[:-1]`` (for x of
        (..., T, dim), positions of (..., T); for (B, T, H, dim), (B, T, 1)). Returns x rotated, same dtype."""
        cos, sin = self.cos[token_positions], self.sin[token_positions]  # (..., dim/2), broadcast against x
        return (self.kernel or rotate_pairs)(x, cos, sin)


def _check_heads_and_window(d_model: int, num_heads: int, num_kv_heads: int | None,
                            attention_window: int | None) -> int:
    """Validate the attention shape; returns the number of key/value heads."""
    if not isinstance(num_heads, int) or num_heads < 1 or d_model % num_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    kv = num_heads if num_kv_heads is None else num_kv_heads
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or num_heads % kv:
        raise ValueError(f"num_kv_heads must be a positive divisor of num_heads ({num_heads}) or None, "
                         f"got {num_kv_heads!r}")
    if attention_window is not None and (isinstance(attention_window, bool) or not isinstance(attention_window, int)
                                         or attention_window < 1):
        raise ValueError(f"attention_window must be a positive integer (keys per query, itself included) or None, "
                         f"got {attention_window!r}")
    return kv


class CausalMultiHeadSelfAttention(nn.Module):
    """Causal multi-head self-attention with RoPE on q and k; the kernel is ``attention_backend`` (a registered
    name, or a function ``(q, k, v, is_causal, *, window=None, doc_ids=None) -> out``: ``cs336_basics.attention``).

    ``num_kv_heads`` (default ``num_heads``) key/value heads of ``head_dim`` each, shared by groups of
    ``num_heads // num_kv_heads`` query heads (grouped-query attention, Ainslie et al. 2023; 1 is multi-query).
    ``attention_window`` W: each query sees the W most recent keys, itself included (keys i-W+1..i, the
    convention of Hugging Face transformers' sliding-window mask for Mistral, ``kv_idx > q_idx - W``);
    ``None``: all earlier keys.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        positional_encoder: RotaryEmbedding | None = None,
        attention_backend: str | AttentionFn = "reference",
        device=None,
        dtype=None,
        *,
        num_kv_heads: int | None = None,
        attention_window: int | None = None,
    ):
        super().__init__()
        kv = _check_heads_and_window(d_model, num_heads, num_kv_heads, attention_window)
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.num_kv_heads, self.attention_window = kv, attention_window
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, kv * self.head_dim, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, kv * self.head_dim, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.positional_encoder = positional_encoder
        self.attention_backend_name = (
            attention_backend
            if isinstance(attention_backend, str)
            else getattr(attention_backend, "__name__", "custom")
        )
        self.attention_fn: AttentionFn = (
            get_attention_backend(attention_backend) if isinstance(attention_backend, str) else attention_backend
        )
        self.takes_extras = supports_attention_extras(self.attention_fn)
        if (kv != num_heads or attention_window is not None) and not self.takes_extras:
            raise ValueError(
                f"attention backend {self.attention_backend_name!r} takes only (q, k, v, is_causal): it cannot run "
                f"num_kv_heads={kv} (of {num_heads} heads) or attention_window={attention_window}; use one that "
                "takes window= and doc_ids= (reference, sdpa)"
            )

    def forward(self, x: Tensor, token_positions: Tensor | None = None, doc_ids: Tensor | None = None) -> Tensor:
        """x: (..., T, D); doc_ids: optional (B, T) ints, attention stays within equal ids (packed documents)."""
        T = x.shape[-2]
        # RoPE rotates q and k in the projections' own (..., T, H, Dh) layout (reads and writes contiguous; in the
        # (..., H, T, Dh) views they are strided, which made the compiled rotation and its backward half as fast
        # and added layout copies); the attention kernel then takes (..., H, T, Dh) views
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))  # (B, T, H, Dh)
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))  # (B, T, Hkv, Dh)
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.positional_encoder is not None:
            if token_positions is None:
                token_positions = torch.arange(T, device=x.device)
            pos = token_positions.unsqueeze(-1)  # (..., T, 1): one position for all heads of a token
            q, k = self.positional_encoder(q, pos), self.positional_encoder(k, pos)
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # (B, H, T, Dh) views
        extras = {}
        if self.attention_window is not None and self.attention_window < T:  # a wider window hides nothing
            extras["window"] = (self.attention_window - 1, 0)
        if doc_ids is not None:
            if not self.takes_extras:
                raise ValueError(f"attention backend {self.attention_backend_name!r} takes only (q, k, v, "
                                 "is_causal): it cannot run doc_ids; use one that takes window= and doc_ids= "
                                 "(reference, sdpa)")
            extras["doc_ids"] = doc_ids
        out = self.attention_fn(q, k, v, True, **extras)  # (..., H, T, Dh)
        return self.output_proj(rearrange(out, "... h t d -> ... t (h d)"))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then + ffn(ln2(x)); ``num_kv_heads`` and ``attention_window`` as in
    :class:`CausalMultiHeadSelfAttention`."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        positional_encoder: RotaryEmbedding | None = None,
        attention_backend: str | AttentionFn = "reference",
        device=None,
        dtype=None,
        *,
        num_kv_heads: int | None = None,
        attention_window: int | None = None,
    ):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = CausalMultiHeadSelfAttention(
            d_model, num_heads, positional_encoder, attention_backend, device=device, dtype=dtype,
            num_kv_heads=num_kv_heads, attention_window=attention_window,
        )
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor, token_positions: Tensor | None = None, doc_ids: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.ln1(x), token_positions, doc_ids)
        return x + self.ffn(self.ln2(x))


class BasicsTransformerLM(nn.Module):
    """Token ids ``(B, T)`` -> logits ``(B, T, V)``.

    ``check_inputs`` validates token ids against the vocabulary (one device->host sync per forward;
    turn it off for benchmarks once the data is known to be good). ``num_kv_heads`` (grouped-query
    attention) and ``attention_window`` (sliding window of W keys, itself included) as in
    :class:`CausalMultiHeadSelfAttention`; their defaults build the handout's model, parameter for parameter.
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        rope_theta: float = 10000.0,
        attention_backend: str | AttentionFn = "reference",
        check_inputs: bool = True,
        device=None,
        dtype=None,
        *,
        num_kv_heads: int | None = None,
        attention_window: int | None = None,
    ):
        super().__init__()
        for name, value in dict(
            vocab_size=vocab_size,
            context_length=context_length,
            d_model=d_model,
            num_layers=num_layers,
            num_heads=num_heads,
            d_ff=d_ff,
        ).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        _check_heads_and_window(d_model, num_heads, num_kv_heads, attention_window)
        self.vocab_size, self.context_length = vocab_size, context_length
        self.d_model, self.num_layers, self.num_heads, self.d_ff = d_model, num_layers, num_heads, d_ff
        self.num_kv_heads, self.attention_window = num_kv_heads, attention_window
        self.check_inputs = check_inputs
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        rope = RotaryEmbedding(context_length, d_model // num_heads, rope_theta, device=device)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, rope, attention_backend, device=device, dtype=dtype,
                             num_kv_heads=num_kv_heads, attention_window=attention_window)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)

    def _validate(self, token_ids: Tensor) -> None:
        if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
            raise ValueError(f"token ids must be an integer tensor, got {token_ids.dtype}")
        if token_ids.dim() == 0 or token_ids.shape[-1] == 0:
            raise ValueError(f"token ids must have at least one position, got shape {tuple(token_ids.shape)}")
        if token_ids.shape[-1] > self.context_length:
            raise ValueError(f"sequence length {token_ids.shape[-1]} exceeds context_length {self.context_length}")
        if self.check_inputs and token_ids.numel() and not torch.compiler.is_compiling():
            lo, hi = int(token_ids.min()), int(token_ids.max())  # host sync
            if lo < 0 or hi >= self.vocab_size:
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got values in [{lo}, {hi}]")

    def _validate_doc_ids(self, token_ids: Tensor, doc_ids: Tensor) -> None:
        if not isinstance(doc_ids, Tensor) or doc_ids.dtype.is_floating_point or doc_ids.dtype.is_complex \
                or doc_ids.dtype == torch.bool:
            raise ValueError(f"doc_ids must be an integer tensor, got "
                             f"{doc_ids.dtype if isinstance(doc_ids, Tensor) else type(doc_ids).__name__}")
        if token_ids.dim() != 2 or doc_ids.shape != token_ids.shape:
            raise ValueError(f"doc_ids must have the shape (batch, T) of the token ids, got doc_ids "
                             f"{tuple(doc_ids.shape)} for token ids {tuple(token_ids.shape)}")

    def forward(self, token_ids: Tensor, doc_ids: Tensor | None = None) -> Tensor:
        """``doc_ids`` ``(B, T)`` ints: attention never crosses from one id to another (documents packed in a
        sequence; positions are not restarted per document, RoPE scores depend only on the offset anyway)."""
        self._validate(token_ids)
        if doc_ids is not None:
            self._validate_doc_ids(token_ids, doc_ids)
        x = self.token_embeddings(token_ids)  # (B, T, D)
        positions = torch.arange(token_ids.shape[-1], device=token_ids.device)
        for layer in self.layers:  # doc_ids only when given: blocks wrapped by others may take two arguments
            x = layer(x, positions) if doc_ids is None else layer(x, positions, doc_ids)
        return self.lm_head(self.ln_final(x))  # (B, T, V)
