"""Data parallelism: process groups (``process_group``) and gradient-averaging wrappers (``ddp``).

``wrap_model(module, strategy, **options)`` is the single entry point the training driver and the
benchmarks use; every strategy returns an object with the same API (``wrapper(x)``,
``finish_gradient_synchronization()``, ``no_sync()``, ``on_train_batch_start()``, ``close()``,
``.module``, ``.stats``). New strategies (sharded optimizers, FSDP) register in ``STRATEGIES``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from cs336_systems.parallel.ddp import BucketedDDP, FlatDDP, LocalModule, NaiveDDP, OverlapDDP, TorchDDP

# name -> (constructor(module, bucket_size_mb) , needs a process group)
STRATEGIES: dict[str, tuple[Callable[[nn.Module, float | None], nn.Module], bool]] = {
    "none": (lambda m, b: LocalModule(m), False),
    "naive": (lambda m, b: NaiveDDP(m), True),
    "flat": (lambda m, b: FlatDDP(m), True),
    "overlap": (lambda m, b: OverlapDDP(m), True),
    "bucketed": (lambda m, b: BucketedDDP(m, bucket_size_mb=25.0 if b is None else b), True),
    "torch-ddp": (lambda m, b: TorchDDP(m, bucket_size_mb=b), True),
}


def wrap_model(module: nn.Module, strategy: str, bucket_size_mb: float | None = None) -> nn.Module:
    """Wrap ``module`` with the data-parallel ``strategy`` (see ``STRATEGIES``)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown parallel strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy][0](module, bucket_size_mb)


def needs_process_group(strategy: str) -> bool:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown parallel strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy][1]


__all__ = ["STRATEGIES", "BucketedDDP", "FlatDDP", "LocalModule", "NaiveDDP", "OverlapDDP", "TorchDDP",
           "needs_process_group", "wrap_model"]
