"""Fully-sharded data parallelism (handout problem ``fsdp``; ZeRO stage 3 style).

``FSDP(module, compute_dtype=None)`` shards the weight of every ``Linear`` and ``Embedding`` (ours
from ``cs336_basics.model`` and torch's) across the ranks; every other parameter (RMSNorm gains,
biases) stays replicated and has its gradient all-reduced. Frozen weights (``requires_grad=False``)
are left alone.

Storage. A sharded weight of ``N`` elements becomes a flat fp32 shard of ``ceil(N / W)`` elements
(``W`` ranks; the last rank's shard is zero-padded), registered under the weight's original name, so
``module.named_parameters()`` lists the same names (with 1-D shard shapes) and a standard optimizer
(our AdamW or torch's) steps the shards: master weights, gradients and optimizer state stay fp32.

Forward. A forward pre-hook on each sharded module waits for its all-gather, exposes the full weight
to the module's own ``forward`` (the gathered tensor shadows the parameter as an instance attribute
for the duration of the call; the module code is not changed), and starts the all-gather of the
*next* sharded module in forward order. The gather of module ``j`` thus starts when module ``j-1``
starts, i.e. after module ``j-2`` has finished its forward, never earlier (the handout's limit on
prefetching), and runs while module ``j-1`` computes. The order is the one recorded in the previous
forward (registration order before the first one). A forward post-hook drops the gathered weight.

Backward. Autograd would keep every gathered weight alive until backward (a matmul saves its
weight). A ``saved_tensors_hooks`` pair replaces a saved gathered weight by a small token and, in
backward, gathers it again (waiting for a prefetch issued when the previous module in reverse order
was unpacked): at most about two gathered weights exist at a time. The gradient of the full weight
arrives in ``_Unshard.backward``; it is reduce-scattered asynchronously (summed, then divided by
``W``) into the shard's ``.grad``; at most ``_RS_IN_FLIGHT`` reduce-scatters are outstanding, so
full-size gradients do not pile up. ``finish_gradient_synchronization()`` waits for the rest and
all-reduces the replicated parameters' gradients.

Mixed precision. With ``compute_dtype`` (e.g. bf16) each shard is cast *before* the all-gather
(half the traffic), floating inputs of ``Linear`` modules are cast to it, and gradients are reduced
in ``reduce_dtype`` (default: ``compute_dtype``, as FSDP2's default policy), then upcast to fp32. Under
``torch.autocast`` pass the same ``compute_dtype``: autocast's own cast of a gathered fp32 weight
would be saved for backward in full.

Not supported: ``no_sync`` gradient accumulation without communication (each backward reduces;
gradients of several backwards do accumulate correctly in ``.grad``), data-dependent module order
across ranks, ``torch.compile`` of the wrapped module (hooks and collectives break graphs), and
``nn.Embedding`` with ``max_norm`` or sparse gradients (``ValueError``).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cs336_basics.model import Embedding as BasicsEmbedding
from cs336_basics.model import Linear as BasicsLinear

SHARDED_TYPES = (BasicsLinear, BasicsEmbedding, nn.Linear, nn.Embedding)
LINEAR_TYPES = (BasicsLinear, nn.Linear)
_RS_IN_FLIGHT = 2

# torch >= 2.12 renamed the flat collectives; keep working on 2.11 (GPU machines) and 2.13.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(eq=False)
class _Handle:
    """One sharded weight: its shard and the state of its gathers and reductions."""

    names: list[str]  # qualified names of the weight (several if tied)
    shape: torch.Size
    numel: int
    shard_size: int
    shard: nn.Parameter  # (shard_size,) fp32, this rank's slice of the padded flat weight
    fwd_pending: tuple | None = None  # (work, flat buffer, input) of a forward gather in flight
    bwd_pending: tuple | None = None  # the same, for backward
    bwd_flat: Any = None  # weakref to the flat buffer gathered for backward (reused while alive)
    uses: int = 0  # forward uses this step
    index: int = 0  # position in FSDP.handles
    modules: list[nn.Module] = field(default_factory=list)  # modules using this weight (several if tied)


class _Unshard(torch.autograd.Function):
    """shard -> gathered full weight. Forward: the (prefetched) gather; backward: hand the full
    gradient to the reduce-scatter and give the shard no autograd gradient (its ``.grad`` is written
    when the reduce-scatter lands)."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, fsdp: FSDP, handle: _Handle) -> torch.Tensor:
        ctx.fsdp, ctx.handle = fsdp, handle
        return fsdp._take_forward_weight(handle)

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):
        ctx.fsdp._reduce_scatter(ctx.handle, grad_full)
        return None, None, None


class FSDP(nn.Module):
    """Wrap ``module`` for fully-sharded data parallel training (see the module docstring).

    ``compute_dtype``: dtype of gathered weights (and of communication); None keeps the parameter dtype.
    ``reduce_dtype``: dtype of the gradient reduce-scatter; None: ``compute_dtype`` (or the parameter dtype).
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None, *,
                 reduce_dtype: torch.dtype | None = None, process_group: dist.ProcessGroup | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise ValueError("FSDP: torch.distributed is not initialised; call "
                             "cs336_systems.parallel.process_group.init_distributed() (or run under torchrun)")
        for name, dt in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            if dt is not None and not (isinstance(dt, torch.dtype) and dt.is_floating_point):
                raise ValueError(f"FSDP: {name} must be a floating torch.dtype or None, got {dt!r}")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.compute_dtype = compute_dtype
        self.reduce_dtype = reduce_dtype or compute_dtype
        self._broadcast_from_rank0()
        self.handles: list[_Handle] = []
        self._handle_of_module: dict[nn.Module, _Handle] = {}
        self._shard_weights()
        sharded = {id(h.shard) for h in self.handles}
        self.replicated: list[nn.Parameter] = [p for p in module.parameters()
                                               if p.requires_grad and id(p) not in sharded]
        # Per-step state.
        self._expected_order: list[_Handle] = list(dict.fromkeys(
            self._handle_of_module[m] for m in module.modules() if m in self._handle_of_module))
        self._order: list[_Handle] = []
        self._live: dict[int, _Handle] = {}  # storage data_ptr of a gathered weight in use -> handle
        self._packed: list[_Handle] = []  # handles whose weight was saved for backward, forward order
        self._bwd_done: set[int] = set()
        self._rs_pending: list[tuple[_Handle, Any, torch.Tensor, torch.Tensor]] = []
        self.trace: list[tuple[str, int]] = []  # ("gather"|"start"|"end", position in forward order)
        self._hooks = []
        for m, h in self._handle_of_module.items():
            self._hooks.append(m.register_forward_pre_hook(self._pre_forward))
            self._hooks.append(m.register_forward_hook(self._post_forward))
            h.modules.append(m)

    # -- construction -------------------------------------------------------------------------------
    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        for t in [*self.module.parameters(), *self.module.buffers()]:
            dist.broadcast(t.data, src=src, group=self.process_group)

    @torch.no_grad()
    def _shard_weights(self) -> None:
        by_weight: dict[nn.Parameter, _Handle] = {}
        names: dict[nn.Parameter, list[str]] = {}
        for name, p in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(p, []).append(name)
        for mod_name, m in self.module.named_modules():
            if not isinstance(m, SHARDED_TYPES):
                continue
            if isinstance(m, nn.Embedding) and (m.max_norm is not None or m.sparse):
                raise ValueError(f"FSDP: nn.Embedding {mod_name!r} uses max_norm or sparse gradients, which "
                                 "modify or bypass the full weight; not supported")
            w = m._parameters.get("weight")
            if w is None or not w.requires_grad:
                continue
            if w not in by_weight:
                numel = w.numel()
                shard_size = math.ceil(numel / self.world_size)
                flat = torch.zeros(shard_size * self.world_size, dtype=w.dtype, device=w.device)
                flat[:numel] = w.reshape(-1)
                shard = nn.Parameter(flat[self.rank * shard_size:(self.rank + 1) * shard_size].clone())
                h = _Handle(names=names[w], shape=w.shape, numel=numel, shard_size=shard_size, shard=shard,
                            index=len(self.handles))
                by_weight[w] = h
                self.handles.append(h)
            h = by_weight[w]
            m._parameters["weight"] = h.shard  # same name, now the flat shard (tied: the same shard)
            self._handle_of_module[m] = h

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        self._order, self._packed, self._bwd_done = [], [], set()
        self.trace = []
        for h in self.handles:
            h.uses = 0
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            out = self.module(*args, **kwargs)
        for h in self.handles:  # a prefetch that was not used (order changed): let it land and drop it
            if h.fwd_pending is not None:
                h.fwd_pending[0].wait()
                h.fwd_pending = None
        if self._order:
            self._expected_order = self._order
        return out

    def _issue_gather(self, h: _Handle) -> tuple:
        shard = h.shard.detach()
        if self.compute_dtype is not None and shard.dtype != self.compute_dtype:
            shard = shard.to(self.compute_dtype)  # cast before communicating: fewer bytes on the wire
        flat = torch.empty(h.shard_size * self.world_size, dtype=shard.dtype, device=shard.device)
        work = _all_gather_flat(flat, shard, group=self.process_group, async_op=True)
        return work, flat, shard

    def _pre_forward(self, module: nn.Module, args: tuple):
        h = self._handle_of_module[module]
        pos = len(self._order)
        self._order.append(h)
        h.uses += 1
        if h.fwd_pending is None:
            self.trace.append(("gather", pos))
            h.fwd_pending = self._issue_gather(h)
        # Module pos-1 has finished its forward (it is not running now), so gathering the module at
        # pos+1 respects "no earlier than when the layer two before it has finished".
        if pos + 1 < len(self._expected_order):
            nxt = self._expected_order[pos + 1]
            if nxt.fwd_pending is None and nxt is not h:
                self.trace.append(("gather", pos + 1))
                nxt.fwd_pending = self._issue_gather(nxt)
        self.trace.append(("start", pos))
        full = _Unshard.apply(h.shard, self, h)
        object.__setattr__(module, "weight", full)  # shadows the shard parameter during this call
        bias = module._parameters.get("bias")
        if self.compute_dtype is not None and bias is not None:
            object.__setattr__(module, "bias", bias.to(self.compute_dtype))  # replicated; grad flows back fp32
        if self.compute_dtype is not None and isinstance(module, LINEAR_TYPES):
            return tuple(a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                         for a in args)
        return None

    def _take_forward_weight(self, h: _Handle) -> torch.Tensor:
        work, flat, _ = h.fwd_pending
        h.fwd_pending = None
        work.wait()
        self._live[flat.untyped_storage().data_ptr()] = h
        return flat[: h.numel].view(h.shape)

    def _post_forward(self, module: nn.Module, args, output):
        full = module.__dict__.pop("weight")
        module.__dict__.pop("bias", None)
        self._live.pop(full.untyped_storage().data_ptr(), None)
        self.trace.append(("end", len(self._order) - 1))
        return output

    # -- saved tensors: gathered weights are not kept for backward ------------------------------------
    def _pack(self, t: torch.Tensor):
        if not self._live or t.layout != torch.strided:
            return t
        h = self._live.get(t.untyped_storage().data_ptr())
        if h is None:
            return t
        if h not in self._packed:
            self._packed.append(h)
        return (_WeightToken, h, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, packed):
        if not (isinstance(packed, tuple) and packed and packed[0] is _WeightToken):
            return packed
        _, h, size, stride, offset = packed
        flat = h.bwd_flat() if h.bwd_flat is not None else None
        if flat is None:
            if h.bwd_pending is None:
                h.bwd_pending = self._issue_gather(h)
            work, flat, _ = h.bwd_pending
            h.bwd_pending = None
            work.wait()
            h.bwd_flat = weakref.ref(flat)
            self._bwd_done.add(h.index)
            self.trace.append(("bwd_gather", h.index))
            self._prefetch_backward(h)
        return flat.as_strided(size, stride, offset)

    def _prefetch_backward(self, h: _Handle) -> None:
        """Gather the weight that reverse forward order needs next, while this module's backward runs."""
        for nxt in reversed(self._packed):
            if nxt.index not in self._bwd_done and nxt is not h:
                if nxt.bwd_pending is None:
                    nxt.bwd_pending = self._issue_gather(nxt)
                return

    # -- gradients ----------------------------------------------------------------------------------
    @torch.no_grad()
    def _reduce_scatter(self, h: _Handle, grad_full: torch.Tensor) -> None:
        dtype = self.reduce_dtype or h.shard.dtype
        padded = h.shard_size * self.world_size
        if padded == h.numel and grad_full.dtype == dtype and grad_full.is_contiguous():
            flat = grad_full.view(-1)
        else:
            flat = torch.empty(padded, dtype=dtype, device=grad_full.device)
            flat[: h.numel].copy_(grad_full.reshape(-1))
            flat[h.numel:].zero_()
        out = torch.empty(h.shard_size, dtype=dtype, device=grad_full.device)
        work = _reduce_scatter_flat(out, flat, op=dist.ReduceOp.SUM, group=self.process_group, async_op=True)
        self._rs_pending.append((h, work, out, flat))
        while len(self._rs_pending) > _RS_IN_FLIGHT:
            self._finish_reduce_scatter(*self._rs_pending.pop(0))

    def _finish_reduce_scatter(self, h: _Handle, work, out: torch.Tensor, flat: torch.Tensor) -> None:
        work.wait()
        grad = out.to(h.shard.dtype) if out.dtype != h.shard.dtype else out
        grad.div_(self.world_size)
        if h.shard.grad is None:
            h.shard.grad = grad
        else:
            h.shard.grad.add_(grad)

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Wait for the outstanding reduce-scatters, then average the replicated gradients."""
        while self._rs_pending:
            self._finish_reduce_scatter(*self._rs_pending.pop(0))
        for h in self.handles:  # backward prefetches that found no use
            if h.bwd_pending is not None:
                h.bwd_pending[0].wait()
                h.bwd_pending = None
            h.bwd_flat = None
        grads = [p.grad for p in self.replicated if p.grad is not None]
        if len(grads) != len(self.replicated):
            replicated = {id(p) for p in self.replicated}
            missing = [n for n, p in self.module.named_parameters() if id(p) in replicated and p.grad is None]
            raise RuntimeError(f"FSDP: no gradient for replicated parameter(s) {', '.join(missing[:10])}; every "
                               "rank must produce a gradient for every trainable parameter")
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)
            flat.div_(self.world_size)
            torch._foreach_copy_(grads, [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in grads]),
                                                                       grads, strict=True)])

    # -- checkpoints ----------------------------------------------------------------------------------
    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: every parameter at full shape by its original name (fp32, on every rank)."""
        out: dict[str, torch.Tensor] = {}
        sharded = {id(h.shard): h for h in self.handles}
        gathered: dict[int, torch.Tensor] = {}
        for name, p in self.module.named_parameters(remove_duplicate=False):  # same order on every rank
            h = sharded.get(id(p))
            if h is None:
                out[name] = p.detach().clone()
                continue
            if h.index not in gathered:
                flat = torch.empty(h.shard_size * self.world_size, dtype=p.dtype, device=p.device)
                _all_gather_flat(flat, p.detach(), group=self.process_group)
                gathered[h.index] = flat[: h.numel].view(h.shape)
            out[name] = gathered[h.index]
        return out

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    # API shared with the data-parallel wrappers (cs336_systems.parallel.ddp)
    def on_train_batch_start(self) -> None:
        if self._rs_pending:
            raise RuntimeError("FSDP: the previous step's gradients were never synchronised; call "
                               "finish_gradient_synchronization() after backward")

    def sharded_parameters(self) -> list[nn.Parameter]:
        """The shard parameters (their ``.grad`` is this rank's slice); the rest is replicated."""
        return [h.shard for h in self.handles]

    def sharded_numel(self) -> int:
        return sum(h.shard_size for h in self.handles)


class _WeightToken:
    """Marks a saved tensor that is a view of a gathered weight (see ``FSDP._pack``)."""
