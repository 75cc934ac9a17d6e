"""AdamW that owns fp32 master weights and writes the low-precision copy the forward computes with.

``FusedAdamW(params, ..., compute_dtype=torch.bfloat16, low_precision=is_matmul_weight)`` keeps an fp32
master of every parameter ``low_precision`` selects and turns the parameter itself into a bf16 tensor:
the model then runs its matmuls on bf16 weights (autocast's per-step weight casts find nothing to cast)
and its gradients arrive in bf16. Each step updates, per parameter, the master, both moments and the
bf16 copy in one pass:

* CUDA: one Triton kernel per parameter reads master, m, v (fp32) and the gradient (any dtype) and writes
  master, m, v and the bf16 copy: 28 bytes per bf16 parameter, the same as an fp32 fused AdamW, while
  the forward's cast (6 bytes) and the backward's bf16 -> fp32 gradient cast (6 bytes) disappear.
* CPU (and ``use_triton=False``): the same arithmetic with ``torch._foreach`` ops, then a copy.

Update and its order are ``cs336_basics.optimizer.AdamW``'s: decay, lerp of m, v, bias corrections,
``p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)``; the Triton kernel rounds as those ops do
(IEEE sqrt and division). Parameters not selected (embeddings, norm gains) stay fp32 and are their own
master. ``master_state_dict(model)`` returns the model's state with the fp32 masters in place of the bf16
copies (what a checkpoint should store).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency; CPU-only installs fall back to foreach
    triton = None

if triton is not None:
    @triton.jit
    def _adamw_kernel(master_ptr, m_ptr, v_ptr, g_ptr, out_ptr, n, decay, beta1c, beta2, beta2c, sqrt_bc2, eps,
                      step_size, HAS_OUT: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        p = tl.load(master_ptr + offs, mask=mask)
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask)
        v = tl.load(v_ptr + offs, mask=mask)
        p = p * decay
        m = m + beta1c * (g - m)  # torch.lerp(m, g, 1 - beta1) for weights below 0.5
        v = v * beta2 + beta2c * (g * g)
        denom = tl.div_rn(tl.sqrt_rn(v), sqrt_bc2) + eps
        p = p + step_size * tl.div_rn(m, denom)
        tl.store(master_ptr + offs, p, mask=mask)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        if HAS_OUT:
            tl.store(out_ptr + offs, p.to(out_ptr.dtype.element_ty), mask=mask)


def is_matmul_weight(module: nn.Module, name: str, param: nn.Parameter) -> bool:
    """The default selection: weights of ``Linear`` modules (the tensors autocast would cast every step)."""
    from cs336_basics.model import Linear

    return isinstance(module, (Linear, nn.Linear)) and name == "weight"


def low_precision_params(model: nn.Module, select: Callable = is_matmul_weight) -> set[nn.Parameter]:
    return {p for mod in model.modules() for name, p in mod.named_parameters(recurse=False) if select(mod, name, p)}


class FusedAdamW(torch.optim.Optimizer):
    """See the module docstring. ``low_precision``: the parameters to hold in ``compute_dtype`` (an fp32 master
    each); ``use_triton``: None picks Triton for CUDA tensors (or under ``TRITON_INTERPRET=1``), foreach otherwise."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 compute_dtype: torch.dtype | None = None, low_precision: Iterable[nn.Parameter] = (),
                 use_triton: bool | None = None):
        if lr < 0.0:
            raise ValueError(f"invalid learning rate: {lr}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"invalid betas: {betas}")
        if eps < 0.0:
            raise ValueError(f"invalid eps: {eps}")
        if weight_decay < 0.0:
            raise ValueError(f"invalid weight_decay: {weight_decay}")
        if compute_dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"FusedAdamW: compute_dtype must be None, float32, bfloat16 or float16, "
                             f"got {compute_dtype}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.use_triton = use_triton
        low = set(low_precision) if compute_dtype not in (None, torch.float32) else set()
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise ValueError(f"FusedAdamW: parameters must be fp32 when handed over, got {p.dtype}")
                state = self.state[p]
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
                if p in low:
                    state["master"] = p.detach().clone()
                    p.data = p.data.to(compute_dtype)

    def _triton_ok(self, p: Tensor) -> bool:
        if triton is None or not p.is_contiguous():
            return False
        if self.use_triton is not None:
            return self.use_triton
        return p.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            foreach: list[Tensor] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("FusedAdamW does not support sparse gradients")
                state = self.state[p]
                state["step"] += 1
                if self._triton_ok(p):
                    self._triton_update(p, state, lr, beta1, beta2, eps, wd)
                else:
                    foreach.append(p)
            by_step: dict[int, list[Tensor]] = {}
            for p in foreach:
                by_step.setdefault(self.state[p]["step"], []).append(p)
            for step, params in by_step.items():
                self._foreach_update(params, step, lr, beta1, beta2, eps, wd)
        return loss

    def _triton_update(self, p: Tensor, state: dict, lr, beta1, beta2, eps, wd) -> None:
        master = state.get("master", p)
        step, n, block = state["step"], p.numel(), 4096
        bc1, bc2 = 1.0 - beta1**step, 1.0 - beta2**step
        _adamw_kernel[(triton.cdiv(n, block),)](
            master, state["exp_avg"], state["exp_avg_sq"], p.grad, p, n, 1.0 - lr * wd, 1.0 - beta1, beta2,
            1.0 - beta2, math.sqrt(bc2), eps, -lr / bc1, HAS_OUT=master is not p, BLOCK=block, num_warps=8)

    def _foreach_update(self, params: list[Tensor], step: int, lr, beta1, beta2, eps, wd) -> None:
        masters = [self.state[p].get("master", p) for p in params]
        grads = [p.grad if p.grad.dtype == torch.float32 else p.grad.float() for p in params]
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
        if wd != 0.0:
            torch._foreach_mul_(masters, 1.0 - lr * wd)
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - beta2)
        bc1, bc2 = 1.0 - beta1**step, 1.0 - beta2**step
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, math.sqrt(bc2))
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(masters, exp_avgs, denom, -lr / bc1)
        copies = [(p, m) for p, m in zip(params, masters, strict=True) if m is not p]
        if copies:
            torch._foreach_copy_([p for p, _ in copies], [m for _, m in copies])

    def master_of(self, p: nn.Parameter) -> Tensor:
        """The fp32 value of ``p`` (its master, or ``p`` itself where it has none)."""
        return self.state[p].get("master", p)

    def master_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        """``model.state_dict()`` with every low-precision parameter replaced by its fp32 master."""
        by_id = {id(p): self.master_of(p) for group in self.param_groups for p in group["params"]}
        params = dict(model.named_parameters())
        return {k: (by_id.get(id(params[k]), v) if k in params else v).detach()
                for k, v in model.state_dict().items()}
