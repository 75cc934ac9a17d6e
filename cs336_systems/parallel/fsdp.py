"""Fully-sharded data parallelism (handout problem ``fsdp``; ZeRO stage 3 style).

``FSDP(module, compute_dtype=None)`` shards the weight of every ``Linear`` and ``Embedding`` (ours
and torch's) across the ranks; other parameters (norm gains, biases) stay replicated and have their
gradients all-reduced; frozen weights are left alone. Communication is per unit, as FSDP2 groups a
model (every ``TransformerBlock``, or each instance of ``unit_classes``; every sharded module outside
one; tied modules merged): one all-gather in forward, one in backward and one reduce-scatter per unit,
with the next unit's gather prefetched while the current one computes (at most two gathered at a
time). The shards of a unit are slices of one flat fp32 buffer, each an ``nn.Parameter`` under the
weight's own name, so a standard optimizer steps them in place; gathered weights are freed after a
unit's forward (their storage, FSDP2's way, refilled when its backward starts). ``compute_dtype``
casts shards before the all-gather (half the traffic); gradients are reduced in ``reduce_dtype``
(default fp32) and accumulated in fp32.

Not supported (``ValueError`` where it can be detected): ``no_sync``, unit order differing between
ranks, activation checkpointing that re-runs a unit in backward, reading a unit's saved weights from
nodes its outputs do not lead to, ``torch.compile`` of the wrapped module, modules that read a sharded
weight without calling the module, moving the wrapped model to another device or dtype, and
``nn.Embedding`` with ``max_norm`` or sparse gradients. The design in full: docs/sharding.md ("FSDP").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.distributed_c10d import AllgatherOptions, ReduceScatterOptions
from torch.utils._pytree import tree_leaves

from cs336_basics.model import Embedding as BasicsEmbedding
from cs336_basics.model import Linear as BasicsLinear
from cs336_basics.model import TransformerBlock

LINEAR_TYPES = (BasicsLinear, nn.Linear)  # modules whose inputs are cast to compute_dtype outside autocast
SHARDED_TYPES = (BasicsLinear, BasicsEmbedding, nn.Linear, nn.Embedding)
_RS_IN_FLIGHT = 2

# torch >= 2.12 renamed the flat collectives; keep working on 2.11 (GPU machines) and 2.13. The training step
# calls the ProcessGroup's own methods (``_pg_method``), which skip torch.distributed's Python wrapper
# (argument checks, logging decorators, coalescing bookkeeping): ~2 us less per call, 149 calls per xl step.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _pg_method(pg: dist.ProcessGroup, new: str, old: str):
    """``pg.<new>`` (torch >= 2.12) or ``pg.<old>`` (``_allgather_base`` / ``_reduce_scatter_base``)."""
    return getattr(pg, new, None) or getattr(pg, old)


# References to a storage held by one tensor (and the temporary storage object that reads the count): more
# means another tensor (a view autograd saved for backward) shares it. Without the counter, assume shared.
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _storage_users(t: torch.Tensor) -> int:
    storage = t.untyped_storage()  # held while the count is read
    return _use_count(storage._cdata)


_ALONE = _storage_users(torch.empty(1)) if _use_count is not None else None


def _shared(t: torch.Tensor) -> bool:
    """Whether another tensor (e.g. a view saved for backward) still uses ``t``'s storage."""
    return _ALONE is None or _storage_users(t) > _ALONE


@dataclass(eq=False)
class _Unit:
    """The sharded weights of one block (or one module): one flat shard, one gather, one reduce-scatter."""

    index: int  # position in FSDP.units (registration order)
    name: str  # qualified name of the block / module (the first one if tied ones were merged)
    weight_names: list[list[str]]  # per weight: its qualified names (several if tied)
    shapes: list[torch.Size]
    numels: list[int]
    shard_sizes: list[int]  # ceil(numel / W) per weight
    offsets: list[int]  # start of each weight's shard in flat_shard
    flat_shard: torch.Tensor  # (sum(shard_sizes),) fp32: this rank's shards, back to back
    params: list[nn.Parameter] = field(default_factory=list)  # views of flat_shard, one per weight
    members: list[tuple[nn.Module, int]] = field(default_factory=list)  # (sharded module, its weight slot)
    # Geometry of the gathered weight-by-weight buffer (``W * shard_numel`` elements; weight i's W chunks at
    # ``W * offsets[i]``), precomputed for ``as_strided`` (one call per view):
    weight_geometry: list[tuple] = field(default_factory=list)  # (shape, stride, offset) of each full weight
    copy_geometry: list[tuple] = field(default_factory=list)  # ((W, s), (s, 1), offset): weight i's W chunks
    rows_divisible: bool = False  # W divides the first dimension of every weight
    active: int = 0  # forward calls of the unit's block / modules in progress
    pos: int = -1  # position in this forward's order (last acquisition)
    views: tuple | None = None  # the full weights while the unit is in use in forward
    use: _Use | None = None  # the gathered buffer behind ``views``
    fwd_pending: tuple | None = None  # (work, rank-major buffer, source) of a forward gather in flight

    def __post_init__(self):
        self.shard_numel = sum(self.shard_sizes)  # elements of flat_shard (read on every gather and reduction)


class _Use:
    """One forward use of a unit: the gathered weight-by-weight buffer its full weights are views of. If
    autograd saved such a view, the buffer's *storage* is freed after the forward (``resize_(0)``; the
    saved views keep their geometry) and refilled, in place, before the use's backward."""

    __slots__ = ("full", "index", "nbytes", "peers", "pending", "started", "unit")

    def __init__(self, unit: _Unit, full: torch.Tensor):
        self.unit, self.full = unit, full
        self.nbytes = full.untyped_storage().nbytes()
        self.index = -1  # position in ``peers``; -1: not saved
        self.peers: list[_Use] = []  # the uses saved in the same forward (FSDP._saved of that forward), in order
        self.pending: tuple | None = None  # a backward gather in flight for this use
        self.started = False  # its backward has begun (its pre-backward hook ran) and not ended

    @property
    def allocated(self) -> bool:
        return self.full.untyped_storage().nbytes() > 0

    def free(self) -> None:
        self.full.untyped_storage().resize_(0)

    def refill_target(self) -> torch.Tensor:
        """The storage, allocated again, as a new 1-D tensor with its *own* version counter: writing the
        gathered weights through it does not count as an in-place change of the views autograd saved."""
        storage = self.full.untyped_storage()
        storage.resize_(self.nbytes)
        return torch.empty(0, dtype=self.full.dtype, device=self.full.device).set_(storage)


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class _UnshardUnit(torch.autograd.Function):
    """The unit's full weights (views of one gathered buffer) as outputs of one autograd node. Forward:
    hand out the views; backward: receive all of the unit's full-weight gradients at once, start their
    reduce-scatter, and give the shards no autograd gradient (their ``.grad`` is written when the
    reduce-scatter lands). The only input that requires grad is one shard parameter (``anchor``), which
    puts the node into the graph: an edge per shard would cost one more (empty) ``AccumulateGrad``
    evaluation per weight in every backward."""

    @staticmethod
    def forward(ctx, fsdp: FSDP, use: _Use, full: torch.Tensor, anchor: torch.Tensor):
        ctx.fsdp, ctx.use = fsdp, use
        ctx.set_materialize_grads(False)  # a weight unused in this forward gets None, not a zero tensor
        return fsdp._weight_views(use.unit, full)

    @staticmethod
    def backward(ctx, *grads):
        ctx.fsdp._backward_done(ctx.use, grads)
        return None, None, None, None


def _repeated_block_classes(module: nn.Module) -> tuple[type, ...]:
    """Classes of the elements of ``ModuleList`` / ``Sequential`` containers whose elements (two or more)
    all have one class that holds shardable modules: a model's repeated block."""
    found: list[type] = []
    for m in module.modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2:
            kinds = {type(c) for c in m}
            if len(kinds) == 1:
                (kind,) = kinds
                if not issubclass(kind, SHARDED_TYPES) and any(isinstance(s, SHARDED_TYPES) for s in m[0].modules()):
                    found.append(kind)
    return tuple(dict.fromkeys(found))


class FSDP(nn.Module):
    """Wrap ``module`` for fully-sharded data parallel training (see the module docstring).

    ``compute_dtype``: dtype of gathered weights (and of the all-gathers); None keeps the parameter dtype.
    ``reduce_dtype``: dtype of the gradient reduce-scatter; None: the parameter dtype (fp32).
    ``unit_classes``: module classes whose instances are communication units; None: ``TransformerBlock``
    and the model's repeated block class; ``()``: every Linear / Embedding is a unit of its own.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None, *,
                 reduce_dtype: torch.dtype | None = None, unit_classes: Iterable[type] | None = None,
                 process_group: dist.ProcessGroup | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise ValueError("FSDP: torch.distributed is not initialised; call "
                             "cs336_systems.parallel.process_group.init_distributed() (or run under torchrun)")
        for name, dt in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            if dt is not None and not (isinstance(dt, torch.dtype) and dt.is_floating_point):
                raise ValueError(f"FSDP: {name} must be a floating torch.dtype or None, got {dt!r}")
        if unit_classes is None:
            unit_classes = (TransformerBlock, *_repeated_block_classes(module))
        unit_classes = tuple(unit_classes)
        if not all(isinstance(c, type) and issubclass(c, nn.Module) for c in unit_classes):
            raise ValueError(f"FSDP: unit_classes must be nn.Module subclasses, got {unit_classes!r}")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.compute_dtype = compute_dtype
        self.reduce_dtype = reduce_dtype
        pg = process_group if process_group is not None else dist.group.WORLD
        self._all_gather_op = _pg_method(pg, "all_gather_single", "_allgather_base")
        self._reduce_scatter_op = _pg_method(pg, "reduce_scatter_single", "_reduce_scatter_base")
        self._all_gather_opts = AllgatherOptions()  # asyncOp defaults to True: NCCL runs it on its own stream
        self._reduce_scatter_opts = ReduceScatterOptions()
        self._reduce_scatter_opts.reduceOp = dist.ReduceOp.SUM
        self._broadcast_from_rank0()
        self.units: list[_Unit] = []
        self._unit_of_module: dict[nn.Module, tuple[_Unit, int]] = {}  # sharded module -> (unit, weight slot)
        self._unit_of_root: dict[nn.Module, _Unit] = {}  # block that is not itself a sharded module -> unit
        self._standalone: list[nn.Module] = []  # sharded modules outside every block: units entered by themselves
        self._build_units(unit_classes)
        sharded = {id(p) for u in self.units for p in u.params}
        self.replicated: list[nn.Parameter] = [p for p in module.parameters()
                                               if p.requires_grad and id(p) not in sharded]
        # Per-step state.
        self._expected_order: list[_Unit] = list(self.units)
        self._order: list[_Unit] = []
        self._saved: list[_Use] = []  # uses of units whose gathered weights autograd saved, forward order
        self._rs_pending: list[tuple] = []
        self.trace: list[tuple[str, int]] = []  # ("gather"|"start"|"end", forward position), ("bwd_*", unit)
        self.collectives: Counter = Counter()  # collectives issued since the last forward began, by kind
        # Hooks: a block unit enters and leaves with its block (one pre- and one post-hook for all its weights);
        # a sharded module outside any block is a unit entered by its own hooks. The modules inside a block
        # carry no hooks (a call of such a module outside its block's forward is not supported).
        self._hooks = []
        for root, u in self._unit_of_root.items():
            self._hooks.append(root.register_forward_pre_hook(lambda m, a, u=u: self._enter(u)))
            self._hooks.append(root.register_forward_hook(lambda m, a, o, u=u: self._exit(u, o)))
        for m in self._standalone:
            u = self._unit_of_module[m][0]
            self._hooks.append(m.register_forward_pre_hook(lambda mod, a, u=u: self._enter(u)))
            self._hooks.append(m.register_forward_hook(lambda mod, a, o, u=u: self._exit(u, o)))
        # Casting Linear inputs (and biases) to compute_dtype: only needed outside an autocast region of that
        # dtype (autocast casts matmul operands itself); registered while such forwards run (_set_casting).
        self._cast_hooks: list = []

    # -- construction -------------------------------------------------------------------------------
    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        for t in [*self.module.parameters(), *self.module.buffers()]:
            dist.broadcast(t.data, src=src, group=self.process_group)

    def _build_units(self, unit_classes: tuple[type, ...]) -> None:
        # Outermost instances of the unit classes (never the wrapped model itself) own what is inside them.
        root_of: dict[nn.Module, nn.Module] = {}
        root_name: dict[nn.Module, str] = {}

        def visit(m: nn.Module, prefix: str) -> None:
            for name, child in m.named_children():
                qual = f"{prefix}{name}"
                if unit_classes and isinstance(child, unit_classes) and not isinstance(child, SHARDED_TYPES):
                    root_name[child] = qual
                    for sub in child.modules():
                        root_of.setdefault(sub, child)
                else:
                    visit(child, qual + ".")

        visit(self.module, "")
        names: dict[nn.Parameter, list[str]] = {}
        for name, p in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(p, []).append(name)
        # Group the sharded modules by their root; roots that share a weight are merged (union-find).
        parent: dict[nn.Module, nn.Module] = {}

        def find(k: nn.Module) -> nn.Module:
            while parent[k] is not k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        owner: dict[nn.Parameter, nn.Module] = {}
        members: list[tuple[nn.Module, nn.Module, nn.Parameter]] = []  # (module, root, weight)
        for mod_name, m in self.module.named_modules():
            if not isinstance(m, SHARDED_TYPES):
                continue
            if isinstance(m, nn.Embedding) and (m.max_norm is not None or m.sparse):
                raise ValueError(f"FSDP: nn.Embedding {mod_name!r} uses max_norm or sparse gradients, which "
                                 "modify or bypass the full weight; not supported")
            w = m._parameters.get("weight")
            if w is None or not w.requires_grad or w.numel() == 0:
                continue
            root = root_of.get(m, m)
            root_name.setdefault(root, mod_name)
            parent.setdefault(root, root)
            if w in owner:
                a, b = find(root), find(owner[w])
                if a is not b:
                    parent[a] = b
            else:
                owner[w] = root
            members.append((m, root, w))
        groups: dict[nn.Module, list[tuple[nn.Module, nn.Module, nn.Parameter]]] = {}
        for m, root, w in members:
            groups.setdefault(find(root), []).append((m, root, w))
        for group in groups.values():
            self._make_unit(group, names, root_name)

    @torch.no_grad()
    def _make_unit(self, group, names, root_name) -> None:
        W, r = self.world_size, self.rank
        weights = list(dict.fromkeys(w for _, _, w in group))
        if len({(w.dtype, w.device) for w in weights}) > 1:
            raise ValueError(f"FSDP: the weights of unit {root_name[group[0][1]]!r} differ in dtype or device "
                             f"({sorted({f'{w.dtype}/{w.device}' for w in weights})}); a unit needs one of each")
        numels = [w.numel() for w in weights]
        shard_sizes = [math.ceil(n / W) for n in numels]
        offsets = [sum(shard_sizes[:i]) for i in range(len(weights))]
        flat_shard = torch.zeros(sum(shard_sizes), dtype=weights[0].dtype, device=weights[0].device)
        for w, n, s, o in zip(weights, numels, shard_sizes, offsets, strict=True):
            lo, hi = min(r * s, n), min((r + 1) * s, n)  # this rank's part of the flat weight; the rest is padding
            flat_shard[o:o + hi - lo] = w.reshape(-1)[lo:hi]
        u = _Unit(index=len(self.units), name=root_name[group[0][1]], weight_names=[names[w] for w in weights],
                  shapes=[w.shape for w in weights], numels=numels, shard_sizes=shard_sizes, offsets=offsets,
                  flat_shard=flat_shard,
                  weight_geometry=[(w.shape, _contiguous_strides(w.shape), W * o) for w, o in zip(weights, offsets,
                                                                                                   strict=True)],
                  copy_geometry=[((W, s), (s, 1), W * o) for s, o in zip(shard_sizes, offsets, strict=True)],
                  rows_divisible=all(w.dim() >= 1 and w.shape[0] % W == 0 for w in weights))
        u.params = [nn.Parameter(flat_shard[o:o + s]) for o, s in zip(offsets, shard_sizes, strict=True)]
        slot = {w: i for i, w in enumerate(weights)}
        for m, root, w in group:
            m._parameters["weight"] = u.params[slot[w]]  # same name, now a slice of the flat shard
            self._unit_of_module[m] = (u, slot[w])
            u.members.append((m, slot[w]))
            if root is not m:
                self._unit_of_root[root] = u
            else:
                self._standalone.append(m)
        self.units.append(u)

    @torch.no_grad()
    def _check_storage(self, u: _Unit) -> None:
        """Re-link a shard parameter whose ``.data`` was replaced (e.g. ``load_state_dict(assign=True)``)
        to its slice of the flat shard: the gathers read the flat shard."""
        base, size = u.flat_shard.data_ptr(), u.flat_shard.element_size()
        for p, o, s in zip(u.params, u.offsets, u.shard_sizes, strict=True):
            if p.data_ptr() != base + o * size:
                if p.shape != (s,) or p.dtype != u.flat_shard.dtype or p.device != u.flat_shard.device:
                    raise RuntimeError(f"FSDP: a shard parameter of unit {u.name!r} was replaced by a tensor of shape "
                                       f"{tuple(p.shape)}, {p.dtype}, {p.device}; expected ({s},), "
                                       f"{u.flat_shard.dtype}, {u.flat_shard.device}")
                u.flat_shard[o:o + s] = p.data
                p.data = u.flat_shard[o:o + s]

    # -- gathers ------------------------------------------------------------------------------------
    def _issue_gather(self, u: _Unit, into: torch.Tensor | None = None) -> tuple:
        """Start the all-gather of ``u``'s flat shard (rank-major: rank 0's shards, rank 1's, ...) into a new
        buffer, or into ``into`` (a single-weight unit, whose rank-major layout is the weight's)."""
        shard = u.flat_shard
        if self.compute_dtype is not None and shard.dtype != self.compute_dtype:
            shard = shard.to(self.compute_dtype)  # cast before communicating: fewer bytes on the wire
        out = into if into is not None else torch.empty(u.shard_numel * self.world_size, dtype=shard.dtype,
                                                         device=shard.device)
        work = self._all_gather_op(out, shard, self._all_gather_opts)
        self.collectives["all_gather"] += 1
        return work, out, shard

    def _wait_gather(self, u: _Unit, pending: tuple, use: _Use | None = None) -> torch.Tensor:
        """The gathered buffer rearranged weight by weight: a new one, or ``use``'s storage refilled."""
        work, out, _ = pending
        work.wait()
        if len(u.shard_sizes) == 1:  # one weight: rank-major is weight-major
            # In forward, a copy: the collective's own bookkeeping may still reference ``out`` for a while, which
            # would make _shared() depend on timing (ranks must agree on which uses are gathered again). In
            # backward the gather wrote into the use's storage (``out`` is an alias of it).
            return out.clone() if use is None else out
        full = torch.empty_like(out) if use is None else use.refill_target()
        torch.split_with_sizes_copy(out.view(self.world_size, u.shard_numel), u.shard_sizes, dim=1,
                                    out=[full.as_strided(*g) for g in u.copy_geometry])
        return full

    @staticmethod
    def _weight_views(u: _Unit, full: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple([full.as_strided(*g) for g in u.weight_geometry])

    # -- forward ------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        self._reset_step()
        self._set_casting(self._needs_casting())
        out = self.module(*args, **kwargs)
        for u in self.units:  # a prefetch that was not used (order changed): let it land and drop it
            if u.fwd_pending is not None:
                u.fwd_pending[0].wait()
                u.fwd_pending = None
        if self._order:
            self._expected_order = self._order
        # Backward starts with the last use saved: gather it while the loss is computed (unless it was kept).
        self._prefetch_backward(self._saved, len(self._saved))
        return out

    def _reset_step(self) -> None:
        for use in self._saved:  # whatever a forward without backward (or an exception) left behind
            self._release(use)
        for u in self.units:
            if u.fwd_pending is not None:
                u.fwd_pending[0].wait()
            if u.views is not None:
                self._uninstall(u)
            u.fwd_pending = u.views = u.use = None
            u.active = 0
            self._check_storage(u)
        self._order, self._saved = [], []
        self.trace = []
        self.collectives = Counter()

    def _enter(self, u: _Unit) -> None:
        u.active += 1
        if u.active > 1:
            return
        u.pos = pos = len(self._order)
        self._order.append(u)
        if u.fwd_pending is None:
            self.trace.append(("gather", pos))
            u.fwd_pending = self._issue_gather(u)
        # Unit pos-1 has finished its forward (it is not running now), so gathering the unit at pos+1
        # respects "no earlier than when the layer two before it has finished".
        if pos + 1 < len(self._expected_order):
            nxt = self._expected_order[pos + 1]
            if nxt.fwd_pending is None and nxt.active == 0 and nxt is not u:
                self.trace.append(("gather", pos + 1))
                nxt.fwd_pending = self._issue_gather(nxt)
        self.trace.append(("start", pos))
        full = self._wait_gather(u, u.fwd_pending)
        u.fwd_pending = None
        u.use = use = _Use(u, full)
        u.views = views = _UnshardUnit.apply(self, use, full, u.params[0])
        for m, slot in u.members:  # shadow each shard parameter by its full weight while the unit is in use
            object.__setattr__(m, "weight", views[slot])

    def _exit(self, u: _Unit, output) -> None:
        u.active -= 1
        if u.active > 0:
            return
        self._uninstall(u)
        use, u.use, u.views = u.use, None, None
        self.trace.append(("end", u.pos))
        if not (torch.is_grad_enabled() and _shared(use.full)):
            use.free()  # no view of it saved for backward (no grad, or e.g. an embedding lookup): free it now
            return
        use.index, use.peers = len(self._saved), self._saved
        self._saved.append(use)
        hooked = False  # refill the storage right before the use's backward: when the grad of an output arrives
        for t in (output,) if isinstance(output, torch.Tensor) else tree_leaves(output):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(partial(self._pre_backward, use))
                hooked = True
        if not hooked:
            return  # no output to hook: keep the gathered weights until backward (or finish) is over
        if u.pos == len(self._expected_order) - 1 and u is self._expected_order[-1]:
            self.trace.append(("bwd_keep", u.index))  # the forward's last unit, which backward needs first
            return
        use.free()  # autograd keeps the views (their geometry), not the bytes

    @staticmethod
    def _uninstall(u: _Unit) -> None:
        for m, _ in u.members:
            m.__dict__.pop("weight", None)

    # -- casting to compute_dtype ---------------------------------------------------------------------
    def _needs_casting(self) -> bool:
        """Whether Linear inputs must be cast to ``compute_dtype`` by hooks: not inside an autocast region of
        that dtype on the weights' device, where autocast casts the matmul operands to the same dtype."""
        if self.compute_dtype is None or not self.units:
            return False
        device_type = self.units[0].flat_shard.device.type
        return not (torch.is_autocast_enabled(device_type)
                    and torch.get_autocast_dtype(device_type) == self.compute_dtype)

    def _set_casting(self, on: bool) -> None:
        if on == bool(self._cast_hooks):
            return
        if on:
            for m in self._unit_of_module:
                if isinstance(m, LINEAR_TYPES):
                    self._cast_hooks.append(m.register_forward_pre_hook(self._cast_inputs))
                    self._cast_hooks.append(m.register_forward_hook(self._drop_cast_bias))
        else:
            for h in self._cast_hooks:
                h.remove()
            self._cast_hooks.clear()

    def _cast_inputs(self, module: nn.Module, args: tuple):
        bias = module._parameters.get("bias")
        if bias is not None:
            object.__setattr__(module, "bias", bias.to(self.compute_dtype))  # replicated; grad flows back fp32
        return tuple(a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    @staticmethod
    def _drop_cast_bias(module: nn.Module, args, output):
        module.__dict__.pop("bias", None)
        return output

    # -- backward: refill the freed storage of a use right before its backward --------------------------
    def _pre_backward(self, use: _Use, grad: torch.Tensor) -> None:
        """Hook on the outputs of a use whose weights were saved: runs before any node of the unit."""
        if use.pending is not None or not use.allocated:  # (a prefetch may be writing into the storage)
            u = use.unit
            pending, use.pending = use.pending, None
            self._wait_gather(u, pending if pending is not None else self._issue_backward_gather(use), use)
            self.trace.append(("bwd_gather", u.index))
        if not use.started:
            use.started = True
            self._prefetch_backward(use.peers, use.index)

    def _issue_backward_gather(self, use: _Use) -> tuple:
        if len(use.unit.shard_sizes) == 1:  # gather straight into the use's storage
            return self._issue_gather(use.unit, into=use.refill_target())
        return self._issue_gather(use.unit)

    def _prefetch_backward(self, saved: list[_Use], below: int) -> None:
        """Start gathering the use that reverse forward order needs next (the last one before ``below`` whose
        backward has not begun), while the current one's backward runs."""
        for i in range(below - 1, -1, -1):
            nxt = saved[i]
            if not nxt.started:
                if nxt.pending is None and not nxt.allocated:
                    nxt.pending = self._issue_backward_gather(nxt)
                return

    def _release(self, use: _Use) -> None:
        """Wait for a backward gather of ``use`` in flight and free its storage (a later backward refills it)."""
        if use.pending is not None:
            use.pending[0].wait()
            use.pending = None
        if use.allocated:
            use.free()
        use.started = False

    def _backward_done(self, use: _Use, grads: tuple) -> None:
        use.free()  # every node that read the use's weights has run
        use.started = False
        self._reduce_scatter(use.unit, grads)

    # -- gradients ----------------------------------------------------------------------------------
    @torch.no_grad()
    def _reduce_scatter(self, u: _Unit, grads: tuple) -> None:
        dtype = self.reduce_dtype or u.flat_shard.dtype
        device = u.flat_shard.device
        # _chunk_cat chunks each tensor along dim 0: that is the flat chunking when W divides every weight's
        # rows (gradients passed as they come); otherwise each is flattened first.
        flats = [(g if u.rows_divisible else g.reshape(-1)) if g is not None
                 else torch.zeros(n, dtype=dtype, device=device) for g, n in zip(grads, u.numels, strict=True)]
        # Rank-major: rank 0's chunk of every weight, then rank 1's, ...; each weight zero-padded to W chunks.
        rs_in = torch.empty(self.world_size, u.shard_numel, dtype=dtype, device=device)
        torch._chunk_cat(flats, 0, self.world_size, out=rs_in)
        out = torch.empty(u.shard_numel, dtype=dtype, device=device)
        work = self._reduce_scatter_op(out, rs_in.view(-1), self._reduce_scatter_opts)
        self.collectives["reduce_scatter"] += 1
        self._rs_pending.append((u, work, out, rs_in))
        while len(self._rs_pending) > _RS_IN_FLIGHT:
            self._finish_reduce_scatter(*self._rs_pending.pop(0))

    def _finish_reduce_scatter(self, u: _Unit, work, out: torch.Tensor, rs_in: torch.Tensor) -> None:
        work.wait()
        grad = out.to(u.flat_shard.dtype) if out.dtype != u.flat_shard.dtype else out
        grad.div_(self.world_size)
        grads = [p.grad for p in u.params]
        if all(g is None for g in grads):  # the params' .grad are views of one flat fp32 gradient per unit
            for p, g in zip(u.params, grad.split_with_sizes(u.shard_sizes), strict=True):
                p.grad = g
            return
        base = grads[0]._base if grads[0] is not None else None
        if base is not None and base.numel() == u.shard_numel and all(
                g is not None and g._base is base and g.storage_offset() == base.storage_offset() + o
                for g, o in zip(grads, u.offsets, strict=True)):
            base.add_(grad)  # accumulate (several backwards): one add for the unit
            return
        for p, o, s in zip(u.params, u.offsets, u.shard_sizes, strict=True):  # .grad set elsewhere: one by one
            if p.grad is None:
                p.grad = grad[o:o + s].clone()
            else:
                p.grad.add_(grad[o:o + s])

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Wait for the outstanding reduce-scatters, then average the replicated gradients."""
        while self._rs_pending:
            self._finish_reduce_scatter(*self._rs_pending.pop(0))
        for use in self._saved:  # backward prefetches that found no use, uses whose backward never came
            self._release(use)
        grads = [p.grad for p in self.replicated if p.grad is not None]
        if len(grads) != len(self.replicated):
            replicated = {id(p) for p in self.replicated}
            missing = [n for n, p in self.module.named_parameters() if id(p) in replicated and p.grad is None]
            raise RuntimeError(f"FSDP: no gradient for replicated parameter(s) {', '.join(missing[:10])}; every "
                               "rank must produce a gradient for every trainable parameter")
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)
            self.collectives["all_reduce"] += 1
            flat.div_(self.world_size)
            torch._foreach_copy_(grads, [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in grads]),
                                                                       grads, strict=True)])

    # -- checkpoints ----------------------------------------------------------------------------------
    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: every parameter at full shape by its original name (fp32, on every rank)."""
        slot_of = {id(p): (u, i) for u in self.units for i, p in enumerate(u.params)}
        weights: dict[int, tuple[torch.Tensor, ...]] = {}
        for u in self.units:  # same order on every rank
            self._check_storage(u)
            out = torch.empty(u.shard_numel * self.world_size, dtype=u.flat_shard.dtype, device=u.flat_shard.device)
            _all_gather_flat(out, u.flat_shard, group=self.process_group)
            weights[u.index] = tuple(w.clone() for w in self._weight_views(u, self._wait_gather(u, (_Done, out, None))))
        out_dict: dict[str, torch.Tensor] = {}
        for name, p in self.module.named_parameters(remove_duplicate=False):
            hit = slot_of.get(id(p))
            out_dict[name] = p.detach().clone() if hit is None else weights[hit[0].index][hit[1]]
        return out_dict

    # State-dict adapters (cs336_systems.checkpoint): tensors laid out like the shard parameters (their
    # optimizer state) <-> full shapes by name, so a checkpoint does not depend on the world size.
    def shard_names(self) -> dict[nn.Parameter, str]:
        """Each shard parameter -> the (first) qualified name of its full weight."""
        return {p: names[0] for u in self.units for p, names in zip(u.params, u.weight_names, strict=True)}

    def full_shapes(self) -> dict[str, torch.Size]:
        """The full shape of each sharded weight, by its (first) qualified name."""
        return {names[0]: shape for u in self.units for names, shape in zip(u.weight_names, u.shapes, strict=True)}

    @torch.no_grad()
    def gather_full(self, like_shards: dict[nn.Parameter, torch.Tensor], keep=lambda unit_index: True
                    ) -> dict[str, torch.Tensor]:
        """Collective: full-shape CPU tensors (by weight name) from tensors shaped like each shard parameter
        (e.g. AdamW's moments of the shards); one all-gather per unit. ``keep(unit_index)`` False: this rank
        takes part in the gather but drops the result (spreads the memory of a checkpoint over ranks)."""
        out: dict[str, torch.Tensor] = {}
        for u in self.units:  # same order on every rank
            flat = torch.cat([like_shards[p].reshape(-1) for p in u.params])
            gathered = torch.empty(u.shard_numel * self.world_size, dtype=flat.dtype, device=flat.device)
            _all_gather_flat(gathered, flat, group=self.process_group)
            if keep(u.index):
                full = self._wait_gather(u, (_Done, gathered, None))
                for names, w in zip(u.weight_names, self._weight_views(u, full), strict=True):
                    out[names[0]] = w.to("cpu", copy=True)
        return out

    def shard_of(self, p: nn.Parameter, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of the full-shape ``full`` in the layout of shard parameter ``p`` (zero-padded)."""
        u, slot = self._param_slots[p]
        n, s = u.numels[slot], u.shard_sizes[slot]
        lo, hi = min(self.rank * s, n), min((self.rank + 1) * s, n)
        shard = torch.zeros(s, dtype=full.dtype, device=p.device)
        shard[:hi - lo] = full.reshape(-1)[lo:hi]
        return shard

    @cached_property
    def _param_slots(self) -> dict[nn.Parameter, tuple[_Unit, int]]:
        return {p: (u, i) for u in self.units for i, p in enumerate(u.params)}

    def close(self) -> None:
        self._set_casting(False)
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
        return [p for u in self.units for p in u.params]

    def sharded_numel(self) -> int:
        return sum(u.shard_numel for u in self.units)


class _Done:
    """A finished collective (``full_state_dict`` gathers synchronously)."""

    @staticmethod
    def wait() -> None:
        return None

