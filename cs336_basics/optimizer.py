"""AdamW (decoupled weight decay, bias-corrected moments) and the cosine learning-rate schedule."""

from __future__ import annotations

import math
from collections import defaultdict

import torch


def check_adamw_hyperparameters(lr: float, betas, eps: float, weight_decay: float) -> None:
    """``ValueError`` naming the first AdamW hyperparameter out of range (NaN included)."""
    if not (math.isfinite(lr) and lr >= 0.0):
        raise ValueError(f"invalid learning rate: {lr} (must be finite and >= 0)")
    if not all(0.0 <= b < 1.0 for b in betas) or len(betas) != 2:
        raise ValueError(f"invalid betas: {betas} (two values in [0, 1))")
    if not (math.isfinite(eps) and eps >= 0.0):
        raise ValueError(f"invalid eps: {eps} (must be finite and >= 0)")
    if not (math.isfinite(weight_decay) and weight_decay >= 0.0):
        raise ValueError(f"invalid weight_decay: {weight_decay} (must be finite and >= 0)")


class AdamW(torch.optim.Optimizer):
    """AdamW of Loshchilov & Hutter (2019), the same update as ``torch.optim.AdamW``:

        p <- p * (1 - lr * wd)
        m <- b1 m + (1 - b1) g ;   v <- b2 v + (1 - b2) g^2
        p <- p - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)

    State is kept in the parameter's dtype; the update is applied with multi-tensor (``_foreach``)
    kernels, so a step costs a handful of launches per group rather than several per parameter.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        check_adamw_hyperparameters(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            # Parameters that share (step count, device, dtype) are updated by one set of foreach calls.
            buckets: dict[tuple, list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                buckets[(state["step"], p.device, p.dtype)].append(p)
            for (step, _, _), params in buckets.items():
                adamw_foreach_update(params, [p.grad for p in params], [self.state[p]["exp_avg"] for p in params],
                                     [self.state[p]["exp_avg_sq"] for p in params], step, lr, beta1, beta2, eps, wd)
        return loss


def adamw_foreach_update(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                         exp_avg_sqs: list[torch.Tensor], step: int, lr: float, beta1: float, beta2: float,
                         eps: float, weight_decay: float) -> None:
    """One AdamW update of ``params`` in place with multi-tensor (``_foreach``) kernels (the class docstring's
    formula); every list holds tensors of one dtype and device, at the same ``step``."""
    if weight_decay != 0.0:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - beta2)
    bias_correction1 = 1.0 - beta1**step
    bias_correction2 = 1.0 - beta2**step
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, math.sqrt(bias_correction2))
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, -lr / bias_correction1)


def get_cosine_lr(
    it: int,
    max_learning_rate: float,
    min_learning_rate: float,
    warmup_iters: int,
    cosine_cycle_iters: int,
) -> float:
    """Linear warm-up to ``max_learning_rate``, cosine decay to ``min_learning_rate`` at
    ``cosine_cycle_iters``, constant after."""
    if it < warmup_iters:
        return it / warmup_iters * max_learning_rate
    if it <= cosine_cycle_iters:
        progress = (it - warmup_iters) / max(1, cosine_cycle_iters - warmup_iters)
        return min_learning_rate + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_learning_rate - min_learning_rate)
    return min_learning_rate
