"""The peer: what a PyTorch user gets for free, timed beside our step in the same run.

A plain Llama-style LM in about 60 lines, sized like our preset (``nn.RMSNorm``, separate q/k/v/o
projections, RoPE on q and k, ``F.scaled_dot_product_attention(is_causal=True)``, SwiGLU, untied head),
``torch.compile`` on the whole model, ``torch.optim.AdamW(fused=True)`` on CUDA, bf16 autocast, and
``F.cross_entropy`` on the logits. ``--impl peer-graphs`` is the same script compiled with
``mode="reduce-overhead"`` (CUDA graphs of forward and backward, which its best users reach for when the host
sets the pace); ratios are taken against the faster of the peers timed. ``bench --impl ours peer`` times both
with the same harness (forward incl. the loss, backward, optimizer; synchronised host clock and CUDA events) and
writes the ratio into our records. It uses nothing of ours but the preset's sizes and, like a user who measured
SDPA's backends (its own dispatch differs between torch builds and GPUs), the fastest SDPA backend at the model's shape
(``sdpa_backends``: a priority list for ``sdpa_kernel(..., set_priority=True)``, from the same table our
``flash_auto`` reads).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]  # (B, H, T, Dh/2) each
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).type_as(x)


class PeerBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, d_ff: int, sdpa_backends: list[SDPBackend] | None = None):
        super().__init__()
        self.n_heads, self.sdpa_backends = n_heads, sdpa_backends
        self.attn_norm, self.ffn_norm = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(d, d_ff, bias=False), nn.Linear(d, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        h = self.attn_norm(x)
        q, k, v = (w(h).view(B, T, self.n_heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if self.sdpa_backends is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            with sdpa_kernel(self.sdpa_backends, set_priority=True):
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(B, T, D)
        x = x + self.wo(a)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class PeerLM(nn.Module):
    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, rope_theta: float = 10000.0, sdpa_backends: list[SDPBackend] | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(PeerBlock(d_model, num_heads, d_ff, sdpa_backends) for _ in range(num_layers))
        self.norm = nn.RMSNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        dh = d_model // num_heads
        inv_freq = rope_theta ** (-torch.arange(0, dh, 2, dtype=torch.float32) / dh)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)  # (T, Dh/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        return self.head(self.norm(x))


def build_peer(model_kwargs: dict, device: torch.device, compile: bool = True, mode: str | None = None,
               sdpa_backends: list[SDPBackend] | None = None):
    """The peer's model (compiled as a whole, in torch.compile's ``mode``; SDPA in ``sdpa_backends``' priority
    order, None: PyTorch's), its optimizer and its loss function."""
    sizes = set(inspect.signature(PeerLM).parameters) - {"sdpa_backends"}
    unknown = sorted(set(model_kwargs) - sizes)
    if unknown:  # e.g. num_kv_heads, attention_window: the peer would time another model
        raise ValueError(f"peer: the plain-PyTorch peer has no {', '.join(unknown)}; compare it on a model without")
    model = PeerLM(**model_kwargs, sdpa_backends=sdpa_backends).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    step_model = torch.compile(model, mode=mode) if compile else model
    graphs = compile and mode == "reduce-overhead"

    def loss_fn(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if graphs:  # a new iteration: the last step's graph outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        logits = step_model(tokens)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return model, optimizer, loss_fn
