"""Parallel strategies by name: how a model is wrapped, which optimizer steps it, how its gradients are
clipped. The training driver (``--parallel``), ``ddp-bench`` and ``shard-bench`` all build their
variants here, so a strategy means the same thing everywhere.

==============  ===================================================  ==============================
name            wrapper                                              optimizer
==============  ===================================================  ==============================
``none``        ``LocalModule`` (one process)                        ``optimizer_cls``
``naive``       ``NaiveDDP``                                         ``optimizer_cls``
``flat``        ``FlatDDP``                                          ``optimizer_cls``
``overlap``     ``OverlapDDP``                                       ``optimizer_cls``
``bucketed``    ``BucketedDDP`` (25 MiB buckets by default)          ``optimizer_cls``
``torch-ddp``   ``TorchDDP`` (PyTorch DDP)                           ``optimizer_cls``
``zero1``       ``BucketedDDP``                                      ``ShardedOptimizer(optimizer_cls)``
``torch-zero``  ``TorchDDP``                                         ``ZeroRedundancyOptimizer``
``fsdp``        our ``FSDP`` (``compute_dtype``, ``reduce_dtype``)   ``optimizer_cls`` on the shards
``torch-fsdp2`` ``fully_shard`` per ``TransformerBlock`` and root    ``optimizer_cls`` on the DTensors
==============  ===================================================  ==============================

Every wrapper has the API of ``parallel.ddp`` (``wrapper(x)``, ``finish_gradient_synchronization()``,
``on_train_batch_start()``, ``close()``, ``.module``); ``no_sync()`` exists where gradient accumulation
can skip communication (not for ``fsdp``, which reduce-scatters every backward and accumulates the
shards correctly). Build the optimizer *after* wrapping: FSDP replaces parameters by shards.

Gradient clipping: with ``fsdp`` / ``torch-fsdp2`` gradients are shards, so ``clip_gradients`` takes
the global norm over ranks (``parallel.clip``); elsewhere they are replicated after averaging and the
plain norm is the global one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from cs336_basics.nn_utils import clip_gradient
from cs336_systems.parallel.clip import clip_grad_norm_global
from cs336_systems.parallel.ddp import (
    BucketedDDP,
    FlatDDP,
    LocalModule,
    NaiveDDP,
    NothingToFinish,
    OverlapDDP,
    TorchDDP,
)

DEFAULT_BUCKET_MB = 25.0


@dataclass(frozen=True, kw_only=True)
class WrapOptions:
    """Knobs a strategy may use; each strategy ignores the ones it has no use for."""

    bucket_size_mb: float | None = None  # bucketed / zero1 (None: 25 MiB), torch-ddp / torch-zero (None: torch's)
    compute_dtype: torch.dtype | None = None  # fsdp / torch-fsdp2: dtype of gathered weights (None: fp32)
    reduce_dtype: torch.dtype | None = None  # fsdp / torch-fsdp2: dtype of the gradient reduction (None: compute)
    # overlap / bucketed / zero1 / torch-ddp / torch-zero: dtype of the gradient all-reduce (None: the gradients')
    grad_comm_dtype: torch.dtype | None = None

    def __post_init__(self):
        if self.bucket_size_mb is not None and not self.bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be > 0 or None, got {self.bucket_size_mb!r}")


class TorchFSDP2(NothingToFinish, nn.Module):
    """PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) behind our wrapper API: each
    ``TransformerBlock`` (or, in a model without them, nothing but the root) is one FSDP unit, the root
    another. Parameters become ``DTensor`` shards (``Shard(0)``); the optimizer steps them directly.
    FSDP2 finishes its reduce-scatters inside backward, so ``finish_gradient_synchronization`` has
    nothing left to do."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype | None = None):
        super().__init__()
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from cs336_basics.model import TransformerBlock

        with torch.no_grad():  # the contract of every wrapper: start from rank 0's state
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype or compute_dtype)
        for block in [m for m in module.modules() if isinstance(m, TransformerBlock)]:
            fully_shard(block, mp_policy=mp)
        fully_shard(module, mp_policy=mp)
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)

    def sharded_parameters(self) -> list[nn.Parameter]:
        return list(self.module.parameters())

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: every entry of the state dict at full shape (DTensors gathered)."""
        return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach()
                for k, v in self.module.state_dict().items()}


def _fsdp(module: nn.Module, o: WrapOptions) -> nn.Module:
    from cs336_systems.parallel.fsdp import FSDP

    # WrapOptions' None means "reduce in the compute dtype" for both FSDPs (FSDP(...)'s own default is fp32).
    return FSDP(module, compute_dtype=o.compute_dtype, reduce_dtype=o.reduce_dtype or o.compute_dtype)


def _bucketed(module: nn.Module, o: WrapOptions) -> nn.Module:
    return BucketedDDP(module, bucket_size_mb=DEFAULT_BUCKET_MB if o.bucket_size_mb is None else o.bucket_size_mb,
                       comm_dtype=o.grad_comm_dtype)


def _local_optimizer(params, optimizer_cls, **kwargs) -> torch.optim.Optimizer:
    return optimizer_cls(params, **kwargs)


def _sharded_optimizer(params, optimizer_cls, **kwargs) -> torch.optim.Optimizer:
    from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

    return ShardedOptimizer(params, optimizer_cls, **kwargs)


def _torch_zero(params, optimizer_cls, **kwargs) -> torch.optim.Optimizer:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_cls, **kwargs)


@dataclass(frozen=True, kw_only=True)
class Strategy:
    name: str
    help: str
    wrap_fn: Callable[[nn.Module, WrapOptions], nn.Module]
    optimizer_fn: Callable[..., torch.optim.Optimizer] = _local_optimizer
    distributed: bool = True  # needs a process group
    uses_buckets: bool = False  # takes bucket_size_mb
    uses_dtypes: bool = False  # takes compute_dtype / reduce_dtype
    uses_grad_comm_dtype: bool = False  # takes grad_comm_dtype
    shards_gradients: bool = False  # gradients are per-rank shards: clip by the global norm

    def wrap(self, module: nn.Module, options: WrapOptions | None = None) -> nn.Module:
        return self.wrap_fn(module, options or WrapOptions())

    def make_optimizer(self, params: Iterable, optimizer_cls: type[torch.optim.Optimizer],
                       **kwargs) -> torch.optim.Optimizer:
        """The optimizer for the *wrapped* model's parameters (build it after :meth:`wrap`)."""
        return self.optimizer_fn(params, optimizer_cls, **kwargs)

    def clip_gradients(self, wrapped: nn.Module, max_norm: float) -> torch.Tensor:
        """Clip by the global L2 norm (a collective for sharding strategies); returns the norm."""
        params = wrapped.module.parameters()
        if self.shards_gradients:
            return clip_grad_norm_global(params, max_norm, sharded=wrapped.sharded_parameters())
        return clip_gradient(params, max_norm)


def full_state_dict(wrapped: nn.Module) -> dict[str, torch.Tensor]:
    """The wrapped model's state dict at full shapes (a collective for sharding strategies)."""
    state = {k: v.detach() for k, v in wrapped.module.state_dict().items()}
    if hasattr(wrapped, "full_state_dict"):
        full = wrapped.full_state_dict()
        state.update({k: v for k, v in full.items() if k in state})
    return state


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy(name="none", help="one process, no communication", wrap_fn=lambda m, o: LocalModule(m),
             distributed=False),
    Strategy(name="naive", help="all-reduce each gradient after backward", wrap_fn=lambda m, o: NaiveDDP(m)),
    Strategy(name="flat", help="one all-reduce of all gradients flattened", wrap_fn=lambda m, o: FlatDDP(m)),
    Strategy(name="overlap", help="async all-reduce per gradient during backward",
             wrap_fn=lambda m, o: OverlapDDP(m, comm_dtype=o.grad_comm_dtype), uses_grad_comm_dtype=True),
    Strategy(name="bucketed", help="async all-reduce per bucket during backward", wrap_fn=_bucketed,
             uses_buckets=True, uses_grad_comm_dtype=True),
    Strategy(name="torch-ddp", help="PyTorch DistributedDataParallel",
             wrap_fn=lambda m, o: TorchDDP(m, bucket_size_mb=o.bucket_size_mb, comm_dtype=o.grad_comm_dtype),
             uses_buckets=True, uses_grad_comm_dtype=True),
    Strategy(name="zero1", help="bucketed DDP + optimizer state sharded (ShardedOptimizer)", wrap_fn=_bucketed,
             optimizer_fn=_sharded_optimizer, uses_buckets=True, uses_grad_comm_dtype=True),
    Strategy(name="torch-zero", help="PyTorch DDP + ZeroRedundancyOptimizer",
             wrap_fn=lambda m, o: TorchDDP(m, bucket_size_mb=o.bucket_size_mb, comm_dtype=o.grad_comm_dtype),
             optimizer_fn=_torch_zero, uses_buckets=True, uses_grad_comm_dtype=True),
    Strategy(name="fsdp", help="our FSDP: weights, gradients and optimizer state sharded", wrap_fn=_fsdp,
             uses_dtypes=True, shards_gradients=True),
    Strategy(name="torch-fsdp2", help="PyTorch FSDP2 fully_shard per block and root",
             wrap_fn=lambda m, o: TorchFSDP2(m, o.compute_dtype, o.reduce_dtype), uses_dtypes=True,
             shards_gradients=True),
)}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown parallel strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
