"""Gradient clipping by the global L2 norm when gradients are sharded over ranks (FSDP, FSDP2).

With sharded gradients each rank holds a slice of every sharded gradient, so the norm a rank computes
alone is not the model's. Here the squared norms of the sharded slices are summed over ranks (one
all-reduce of a scalar) and the replicated gradients (identical on every rank after averaging) are
counted once, locally:

    ||g||^2 = sum_ranks sum_{sharded p} ||g_p^(rank)||^2 + sum_{replicated p} ||g_p||^2

Zero padding of an uneven last shard contributes nothing. The scale is the one of
``cs336_basics.nn_utils.clip_gradient`` (``max_norm / (norm + eps)``, at most 1), so with replicated
gradients (DDP, ZeRO-1) this equals that function. DTensor gradients (FSDP2) count as sharded when
every placement is ``Shard``; other placements are rejected rather than miscounted.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "placements") and hasattr(t, "to_local")


@torch.no_grad()
def clip_grad_norm_global(parameters: Iterable[torch.nn.Parameter], max_norm: float, *,
                          sharded: Iterable[torch.nn.Parameter] = (), eps: float = 1e-6,
                          process_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Scale every gradient in place so that the global L2 norm is at most ``max_norm``; returns the
    global norm before clipping (the same value on every rank).

    ``sharded``: parameters whose ``.grad`` is this rank's slice of the full gradient (e.g.
    ``FSDP.sharded_parameters()``); DTensor gradients are recognised on their own. A collective:
    call it on every rank of ``process_group``."""
    sharded_ids = {id(p) for p in sharded}
    everything = list(parameters)
    params = list(dict.fromkeys(p for p in everything if p.grad is not None))  # a tied tensor once
    shard_grads, replicated_grads = [], []
    for p in params:
        if _is_dtensor(p.grad):
            if not all(pl.is_shard() for pl in p.grad.placements):
                raise ValueError(f"clip_grad_norm_global: DTensor gradient with placements {p.grad.placements}; "
                                 "only Shard placements are supported")
            shard_grads.append(p.grad.to_local())
        elif id(p) in sharded_ids:
            shard_grads.append(p.grad)
        else:
            replicated_grads.append(p.grad)
    # A rank without gradients still joins the all-reduce, on its parameters' device (NCCL needs CUDA).
    device = (shard_grads or replicated_grads or [_local(p) for p in everything] or [torch.zeros(())])[0].device

    def sq(grads: list[torch.Tensor]) -> torch.Tensor:
        if not grads:
            return torch.zeros((), dtype=torch.float32, device=device)
        return torch.stack([torch.linalg.vector_norm(g.float()) ** 2 for g in grads]).sum()

    total_sq = sq(shard_grads)
    if dist.is_initialized():  # every rank joins, even one without shard gradients
        dist.all_reduce(total_sq, op=dist.ReduceOp.SUM, group=process_group)
    total = (total_sq + sq(replicated_grads)).sqrt()
    scale = (max_norm / (total + eps)).clamp(max=1.0)
    grads = [_local(p.grad) for p in params]
    if grads:
        torch._foreach_mul_(grads, scale.to(grads[0].device))
    return total
