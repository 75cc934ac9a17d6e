"""Optimizer-state sharding (ZeRO stage 1 style, handout problem ``optimizer_state_sharding``).

``ShardedOptimizer(params, optimizer_cls, **kwargs)`` wraps any ``torch.optim.Optimizer`` class. Every
parameter is owned by exactly one rank; each rank's wrapped optimizer (``.local_optimizer``) holds
state (AdamW's two moments, SGD's momentum) for its own parameters only, so optimizer-state memory
per rank is about ``1 / world_size`` of the unsharded one. ``step()`` updates the local shard, then
every parameter is broadcast from its owner so that all ranks hold the same weights again.

Assignment. Parameters are assigned group by group, in the order they are added, largest first, each
to the rank with the fewest elements so far (ties: the lower rank): deterministic on every rank,
balanced by element count, and stable under ``add_param_group`` during training (earlier parameters
keep their owners). A rank may own nothing (more ranks than parameters); its wrapped optimizer then
has empty groups and ``step`` only takes part in the broadcasts.

Communication. Gradients are *not* reduced here: combine with a data-parallel wrapper that averages
them (``cs336_systems.parallel.ddp``) or compute identical gradients on every rank. The broadcast
after the step is batched: the parameters of one owner are packed into flat buckets of at most
``broadcast_bucket_mb`` MiB per (device, dtype), a parameter larger than a bucket is broadcast in place,
and at most ``_IN_FLIGHT`` buckets are in flight at once, which bounds the transient memory.

Checkpoints. ``state_dict()`` and ``load_state_dict()`` are collectives: call them on every rank.
``state_dict()`` consolidates the whole optimizer state onto rank 0 (CPU tensors, the standard torch
layout: parameters numbered in ``param_groups`` order) and returns it there; the other ranks get an
empty dict. ``load_state_dict(sd)`` expects that full dict on every rank (e.g. each rank
``torch.load``s the same file) and keeps only the state of the parameters it owns.

Differences from ZeRO stage 1 (Rajbhandari et al., 2020) are discussed in ``docs/sharding.md``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

MB = 1024 * 1024
_IN_FLIGHT = 2  # broadcast buckets allowed in flight at once


class ShardedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer_cls`` so that each rank keeps optimizer state for its own parameters only.

    ``kwargs`` are the wrapped optimizer's hyperparameters (defaults of every group). Keyword-only
    options of the wrapper itself: ``process_group`` (default: the world) and ``broadcast_bucket_mb``.
    """

    def __init__(self, params, optimizer_cls: type[torch.optim.Optimizer], *,
                 process_group: dist.ProcessGroup | None = None, broadcast_bucket_mb: float = 64.0,
                 **kwargs: Any):
        if isinstance(params, torch.Tensor):
            raise TypeError("ShardedOptimizer: params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {torch.typename(params)}")
        params = list(params)
        if not params:
            raise ValueError("ShardedOptimizer: optimizer got an empty parameter list")
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"ShardedOptimizer: optimizer_cls must be a torch.optim.Optimizer subclass, "
                            f"got {optimizer_cls!r}")
        if not dist.is_initialized():
            raise ValueError("ShardedOptimizer: torch.distributed is not initialised; call "
                             "cs336_systems.parallel.process_group.init_distributed() (or run under torchrun)")
        if not broadcast_bucket_mb > 0:
            raise ValueError(f"ShardedOptimizer: broadcast_bucket_mb must be > 0, got {broadcast_bucket_mb!r}")
        self.optimizer_cls = optimizer_cls
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.broadcast_bucket_bytes = int(broadcast_bucket_mb * MB)
        self.owner: dict[torch.Tensor, int] = {}  # parameter -> owning rank (group-local rank)
        self.rank_numel = [0] * self.world_size  # elements owned by each rank so far
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._optimizer_kwargs = dict(kwargs)
        # The base constructor validates `params` and calls self.add_param_group for every group.
        super().__init__(params, defaults=dict(kwargs))

    # -- parameter assignment -------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (also during training): its parameters are assigned to ranks, and this rank's
        share becomes a new group of the wrapped optimizer (possibly empty, so that group indices of
        the wrapper and the wrapped optimizer stay aligned)."""
        super().add_param_group(param_group)  # validation, defaults, duplicate checks
        group = self.param_groups[-1]
        order = sorted(range(len(group["params"])), key=lambda i: (-group["params"][i].numel(), i))
        for i in order:
            p = group["params"][i]
            rank = min(range(self.world_size), key=lambda r: (self.rank_numel[r], r))
            self.owner[p] = rank
            self.rank_numel[rank] += p.numel()
        local_group = {k: v for k, v in group.items() if k != "params"}
        local_group["params"] = [p for p in group["params"] if self.owner[p] == self.rank]
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local_group], **self._optimizer_kwargs)
        else:
            self.local_optimizer.add_param_group(local_group)
        # Show the wrapped optimizer's own defaults (e.g. AdamW's betas) in the wrapper's group too.
        for k, v in self.local_optimizer.param_groups[-1].items():
            if k != "params":
                group.setdefault(k, v)

    def owned_parameters(self, rank: int | None = None) -> list[torch.Tensor]:
        rank = self.rank if rank is None else rank
        return [p for g in self.param_groups for p in g["params"] if self.owner[p] == rank]

    def _sync_hyperparameters(self) -> None:
        """Copy hyperparameters (e.g. an LR schedule's ``lr``) from the wrapper's groups to the wrapped ones."""
        for mine, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            for k, v in mine.items():
                if k != "params":
                    local[k] = v

    # -- step ----------------------------------------------------------------------------------
    def step(self, closure=None, **kwargs):
        """Step the wrapped optimizer on this rank's parameters, then broadcast every parameter from
        its owner. ``closure`` (if any) is evaluated on every rank by the wrapped optimizer."""
        self._sync_hyperparameters()
        loss = self.local_optimizer.step(closure, **kwargs) if closure is not None \
            else self.local_optimizer.step(**kwargs)
        self._broadcast_parameters()
        return loss

    @torch.no_grad()
    def _broadcast_parameters(self) -> None:
        in_flight: list[tuple[Any, torch.Tensor | None, list[torch.Tensor]]] = []

        def drain(limit: int) -> None:
            while len(in_flight) > limit:
                work, flat, tensors = in_flight.pop(0)
                work.wait()
                if flat is not None and flat.numel():
                    torch._foreach_copy_(tensors, _unflatten_dense_tensors(flat, tensors))

        for rank in range(self.world_size):
            src = rank if self.process_group is None else dist.get_global_rank(self.process_group, rank)
            for tensors in self._buckets(self.owned_parameters(rank)):
                if len(tensors) == 1:
                    flat = None
                    work = dist.broadcast(tensors[0], src=src, group=self.process_group, async_op=True)
                else:
                    flat = _flatten_dense_tensors(tensors)
                    work = dist.broadcast(flat, src=src, group=self.process_group, async_op=True)
                in_flight.append((work, flat, tensors))
                drain(_IN_FLIGHT)
        drain(0)

    def _buckets(self, params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Pack ``params`` (``.data``) into buckets of one (device, dtype), at most the bucket size each."""
        by_kind: dict[tuple, list[torch.Tensor]] = defaultdict(list)
        for p in params:
            by_kind[(p.device, p.dtype)].append(p.data)
        buckets: list[list[torch.Tensor]] = []
        for tensors in by_kind.values():
            current: list[torch.Tensor] = []
            size = 0
            for t in tensors:
                nbytes = t.numel() * t.element_size()
                if current and size + nbytes > self.broadcast_bucket_bytes:
                    buckets.append(current)
                    current, size = [], 0
                current.append(t)
                size += nbytes
            if current:
                buckets.append(current)
        return buckets

    # -- checkpoints ---------------------------------------------------------------------------
    def _global_index(self) -> dict[torch.Tensor, int]:
        return {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def _groups_for_state_dict(self) -> list[dict[str, Any]]:
        index = self._global_index()
        return [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                for g in self.param_groups]

    def state_dict(self, to: int = 0) -> dict[str, Any]:
        """Collective (call on every rank): the full optimizer state, consolidated on rank ``to``
        (returned there, tensors on CPU, the standard torch layout); other ranks return ``{}``."""
        index = self._global_index()
        mine = {index[p]: {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in st.items()}
                for p, st in self.local_optimizer.state.items()}
        gathered: list[Any] | None = [None] * self.world_size if self.rank == to else None
        dst = to if self.process_group is None else dist.get_global_rank(self.process_group, to)
        dist.gather_object(mine, gathered, dst=dst, group=self.process_group)
        if self.rank != to:
            return {}
        state: dict[int, Any] = {}
        for part in gathered:
            state.update(part)
        return {"state": dict(sorted(state.items())), "param_groups": self._groups_for_state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full state dict (from :meth:`state_dict`, or from an unsharded optimizer of the same
        class over the same parameter groups). Call on every rank with the same dict."""
        if not state_dict or "param_groups" not in state_dict:
            raise ValueError("ShardedOptimizer.load_state_dict: expected the full state dict (state_dict() "
                             "returns it on rank 0 only; load it from a file on every rank)")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups, strict=True)):
            raise ValueError("ShardedOptimizer.load_state_dict: the saved parameter groups do not match this "
                             f"optimizer's ({[len(g['params']) for g in groups]} saved vs "
                             f"{[len(g['params']) for g in self.param_groups]} here)")
        for saved, mine in zip(groups, self.param_groups, strict=True):
            mine.update({k: v for k, v in saved.items() if k != "params"})
        # Re-number this rank's parameters as the wrapped optimizer numbers them, then let it load
        # (it casts floating state to each parameter's dtype and device).
        saved_index = [i for g in groups for i in g["params"]]
        local_state, local_groups, n = {}, [], 0
        for saved, mine in zip(groups, self.param_groups, strict=True):
            ids = []
            for i, p in zip(saved["params"], mine["params"], strict=True):
                if self.owner[p] != self.rank:
                    continue
                if i in state_dict["state"]:
                    local_state[n] = state_dict["state"][i]
                ids.append(n)
                n += 1
            local_groups.append({**{k: v for k, v in mine.items() if k != "params"}, "params": ids})
        assert len(saved_index) == sum(len(g["params"]) for g in self.param_groups)
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})

    def __repr__(self) -> str:
        share = self.rank_numel[self.rank] / max(1, sum(self.rank_numel))
        return (f"ShardedOptimizer({self.optimizer_cls.__name__}, rank {self.rank}/{self.world_size}, "
                f"owns {share:.1%} of {sum(self.rank_numel):,} elements)")
