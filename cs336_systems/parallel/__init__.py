"""Data parallelism and sharding: process groups (``process_group``), gradient-averaging wrappers
(``ddp``), optimizer-state sharding (``sharded_optimizer``), FSDP (``fsdp``), and the strategies that
combine them (``strategies``).

``STRATEGIES`` maps a name (``--parallel``) to a :class:`Strategy`: ``wrap(module, WrapOptions)``,
``make_optimizer(params, optimizer_cls, **kwargs)``, ``clip_gradients(wrapped, max_norm)``. The
training driver and the benchmarks build every variant through it. ``wrap_model`` is the short form
for the wrapper alone.
"""

from __future__ import annotations

import torch
from torch import nn

from cs336_systems.parallel.ddp import BucketedDDP, FlatDDP, LocalModule, NaiveDDP, OverlapDDP, TorchDDP
from cs336_systems.parallel.strategies import (
    STRATEGIES,
    Strategy,
    TorchFSDP2,
    WrapOptions,
    full_state_dict,
    get_strategy,
)


def wrap_model(module: nn.Module, strategy: str, bucket_size_mb: float | None = None, *,
               compute_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
               grad_comm_dtype: torch.dtype | None = None) -> nn.Module:
    """Wrap ``module`` with ``strategy`` (see ``STRATEGIES``)."""
    options = WrapOptions(bucket_size_mb=bucket_size_mb, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype,
                          grad_comm_dtype=grad_comm_dtype)
    return get_strategy(strategy).wrap(module, options)


def needs_process_group(strategy: str) -> bool:
    return get_strategy(strategy).distributed


__all__ = ["STRATEGIES", "BucketedDDP", "FlatDDP", "LocalModule", "NaiveDDP", "OverlapDDP", "Strategy", "TorchDDP",
           "TorchFSDP2", "WrapOptions", "full_state_dict", "get_strategy", "needs_process_group", "wrap_model"]
