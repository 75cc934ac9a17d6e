"""Numerically stable softmax / log-softmax / cross-entropy, and gradient clipping."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """softmax along ``dim``; subtracting the max keeps exp() from overflowing."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    shifted = x - x.amax(dim=dim, keepdim=True)
    return shifted - shifted.exp().sum(dim=dim, keepdim=True).log()


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean negative log-likelihood of ``targets`` (``(...)``, int) under ``logits`` (``(..., vocab)``).

    Computed as logsumexp(logits) - logits[target] after subtracting the row max, so logits of
    magnitude 1e4 are fine. fp16/bf16 logits are upcast to fp32 first; the loss is fp32 then.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    log_z = shifted.exp().sum(dim=-1).log()
    target_logit = shifted.gather(-1, targets.unsqueeze(-1).long()).squeeze(-1)
    return (log_z - target_logit).mean()


@torch.no_grad()
def clip_gradient(parameters: Iterable[torch.nn.Parameter], max_l2_norm: float, eps: float = 1e-6) -> Tensor:
    """Scale all gradients in place so that their joint L2 norm is at most ``max_l2_norm``.

    Returns the norm before clipping. Multi-tensor norms accumulated in fp32 (low-precision gradients are read
    as they are, not copied to fp32 first), no host sync.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32)))
    scale = (max_l2_norm / (total + eps)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale.to(grads[0].device))
    return total
