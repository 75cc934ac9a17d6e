"""Count the bytes autograd saves for backward, with ``saved_tensors_hooks``."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor


def _storage_key(t: Tensor) -> tuple[int, int]:
    return t.untyped_storage().data_ptr(), t.device.index or 0


def saved_tensor_bytes(fn: Callable, *args, exclude: Iterable[Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn(*args)`` runs, leaving
    out the storages of ``exclude`` (e.g. the parameters). The graph built here is not for backward.

    The pack hook keeps a *detached* alias: it holds the storage for the duration of the forward (so
    a freed pointer cannot be reused and counted twice) but has no ``grad_fn``. Returning the tensor
    itself would make every saved output (softmax, rsqrt, ...) point back at its own graph node, a
    cycle through C++ that ``gc`` cannot collect: the graph, its activations and, through its
    AccumulateGrad nodes, the parameters would outlive this call.
    """
    skip = {_storage_key(t) for t in exclude}
    seen: dict[tuple[int, int], int] = {}

    def pack(t: Tensor):
        if t.layout == torch.strided and t.device.type != "meta":
            key = _storage_key(t)
            if key not in skip:
                seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t.detach()

    def unpack(_):
        raise RuntimeError("saved_tensor_bytes: the counting forward is not for backward")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = fn(*args)
    del out
    return sum(seen.values())
