"""Data-parallel wrappers: each takes a finished ``nn.Module`` and averages its gradients over ranks.

=================  ==========================================================================
``NaiveDDP``       after backward, one all-reduce per gradient tensor (handout ``naive_ddp``)
``FlatDDP``        after backward, one all-reduce of all gradients flattened together
                   (``minimal_ddp_flat_benchmarking``)
``OverlapDDP``     during backward, an async all-reduce per gradient as soon as it is accumulated
                   (``register_post_accumulate_grad_hook``; ``ddp_overlap_individual_parameters``)
``BucketedDDP``    during backward, an async all-reduce per bucket of at most ``bucket_size_mb``,
                   launched once the bucket's last gradient is ready (``ddp_overlap_bucketed``)
=================  ==========================================================================

All share one API (``wrapper(x)``; ``finish_gradient_synchronization()`` before ``optimizer.step()``;
``no_sync()`` for gradient accumulation; ``.module``) and one contract: ranks are checked to wrap the
same architecture (``ValueError`` listing the differences) and start from rank 0's parameters and
buffers; gradients are averaged (``ReduceOp.AVG`` on NCCL, sum then one divide elsewhere); frozen
parameters get no communication and a tied one is reduced once; a trainable parameter without a
gradient raises ``RuntimeError`` naming it instead of hanging in a collective. Buckets launch strictly
in bucket order on every rank, and after a synchronised backward a bucket's gradients are views of
the buffer that was reduced in place (no copy back; nothing held between steps). The design, with
the memory traffic of each path, is in docs/parallelism.md ("The wrappers").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

MB = 1024 * 1024  # bucket sizes are in MiB, as torch DDP's bucket_cap_mb
GRAD_COMM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # command-line names of comm_dtype choices


@dataclass
class CommStats:
    """Host-side accounting of the collectives a wrapper issued (reset by the caller).

    ``seconds`` is wall time spent inside collective calls and ``wait()``s; with NCCL the calls return
    once the work is queued, so this is *not* the GPU's communication time (the benchmark measures
    that from profiler kernels); with gloo it is close to it.
    """

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def reset(self) -> None:
        self.calls, self.bytes, self.seconds = 0, 0, 0.0


class _DataParallel(nn.Module):
    """Shared machinery: state check and broadcast, parameter bookkeeping, ``no_sync``, accounting."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise ValueError(f"{type(self).__name__}: torch.distributed is not initialised; call "
                             "cs336_systems.parallel.process_group.init_distributed() (or run under torchrun)")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.stats = CommStats()
        self._sync_enabled = True
        # Unique trainable parameters in module.parameters() order (which already lists a tied tensor once).
        self._names: dict[nn.Parameter, str] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            self._names.setdefault(p, name)
        self.trainable: list[nn.Parameter] = [p for p in module.parameters() if p.requires_grad]
        self._check_same_structure()
        self._broadcast_state()

    # -- construction -----------------------------------------------------------------------
    def _structure(self) -> list[tuple[str, str, tuple[int, ...], str, bool]]:
        rows = [("param", n, tuple(p.shape), str(p.dtype), p.requires_grad)
                for n, p in self.module.named_parameters()]
        rows += [("buffer", n, tuple(b.shape), str(b.dtype), False) for n, b in self.module.named_buffers()]
        return rows

    def _check_same_structure(self) -> None:
        mine = self._structure()
        everyone: list = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.process_group)
        reference = everyone[0]
        for rank, theirs in enumerate(everyone):
            if theirs == reference:
                continue
            ref_set, their_set = set(reference), set(theirs)
            diff = [f"rank 0 only: {r[0]} {r[1]} {r[2]} {r[3]} requires_grad={r[4]}" for r in reference
                    if r not in their_set]
            diff += [f"rank {rank} only: {r[0]} {r[1]} {r[2]} {r[3]} requires_grad={r[4]}" for r in theirs
                     if r not in ref_set]
            if not diff:
                diff = ["same entries in a different order"]
            raise ValueError(f"{type(self).__name__}: rank {rank}'s module differs from rank 0's; every rank "
                             "must wrap the same architecture:\n  " + "\n  ".join(diff[:20]))

    @torch.no_grad()
    def _broadcast_state(self) -> None:
        src = dist.get_global_rank(self.process_group, 0) if self.process_group is not None else 0
        for t in [*self.module.parameters(), *self.module.buffers()]:
            dist.broadcast(t.data, src=src, group=self.process_group)

    # -- API --------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate local gradients without communication; the first
        backward after the block (and its ``finish_gradient_synchronization``) averages the sum."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError

    def on_train_batch_start(self) -> None:
        """Hook for the start of a step: nothing is left over from the previous one."""

    def close(self) -> None:
        """Remove hooks so that ``.module`` can be trained (or wrapped) without this wrapper."""

    # -- helpers ----------------------------------------------------------------------------
    def _averages_in_collective(self, device: torch.device) -> bool:
        """Whether ``ReduceOp.AVG`` is used for tensors on ``device``: NCCL has it (2.10+); gloo only in
        recent torch, so there the sum is divided once per reduced buffer (the same code on every version)."""
        return device.type == "cuda" and "nccl" in str(dist.get_backend(self.process_group)).lower()

    def _all_reduce_mean(self, tensor: torch.Tensor, async_op: bool) -> tuple[object, bool]:
        """Start averaging ``tensor`` over ranks in place; returns (work, whether the caller must still
        divide ``tensor`` by the world size after the work completes)."""
        avg = self._averages_in_collective(tensor.device)
        t0 = time.perf_counter()
        work = dist.all_reduce(tensor, op=dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM,
                               group=self.process_group, async_op=async_op)
        self.stats.calls += 1
        self.stats.bytes += tensor.numel() * tensor.element_size()
        self.stats.seconds += time.perf_counter() - t0
        return work, not avg

    def _wait(self, work) -> None:
        t0 = time.perf_counter()
        work.wait()
        self.stats.seconds += time.perf_counter() - t0

    def _require_grads(self, params: list[nn.Parameter]) -> None:
        missing = [self._names[p] for p in params if p.grad is None]
        if missing:
            raise RuntimeError(
                f"{type(self).__name__}: no gradient for {len(missing)} parameter(s) that require grad: "
                f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}. Every rank must produce a "
                "gradient for every trainable parameter before finish_gradient_synchronization() (freeze unused "
                "parameters with requires_grad_(False))")


class NaiveDDP(_DataParallel):
    """After backward, all-reduce every gradient tensor on its own (one collective per parameter)."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        self._require_grads(self.trainable)
        for p in self.trainable:
            _, divide = self._all_reduce_mean(p.grad, async_op=False)
            if divide:
                p.grad.div_(self.world_size)


class FlatDDP(_DataParallel):
    """After backward, flatten all gradients into one buffer per (device, dtype), all-reduce it once,
    and copy the averages back."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        self._require_grads(self.trainable)
        groups: dict[tuple, list[torch.Tensor]] = {}
        for p in self.trainable:
            groups.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        for grads in groups.values():
            flat = _flatten_dense_tensors(grads)
            _, divide = self._all_reduce_mean(flat, async_op=False)
            if divide:
                flat.div_(self.world_size)
            torch._foreach_copy_(grads, _unflatten_dense_tensors(flat, grads))


@dataclass(eq=False)
class _Bucket:
    params: list[nn.Parameter]
    index: int
    offsets: list[int] = field(default_factory=list)  # element offset of each parameter's gradient in the flat buffer
    numel: int = 0
    ready: set[int] = field(default_factory=set)  # id() of params whose gradient has arrived this step
    work: object | None = None  # the async all-reduce in flight
    reduced: torch.Tensor | None = None  # the tensor it reduces (the flat buffer, or a one-parameter bucket's grad)
    wire: torch.Tensor | None = None  # with comm_dtype: the bucket's gradients packed and cast, all-reduced
    grads: list[torch.Tensor] | None = None  # with comm_dtype: the gradients ``wire`` is copied back into
    divide: bool = False  # whether ``reduced`` still has to be divided by the world size (no AVG)

    def __post_init__(self):
        for p in self.params:
            self.offsets.append(self.numel)
            self.numel += p.numel()

    @property
    def complete(self) -> bool:
        return len(self.ready) == len(self.params)

    def lying_flat(self) -> torch.Tensor | None:
        """The flat buffer the bucket's gradients already lie in back to back, in bucket order (the previous
        step's views, kept by ``zero_grad(set_to_none=False)``), or ``None``. Host-side checks only (pointers
        and layout): nothing waits for the device."""
        grads = [p.grad for p in self.params]
        base = grads[0]._base
        if (base is not None and base.dim() == 1 and base.numel() == self.numel and base.is_contiguous()
                and all(g._base is not None and g._base.data_ptr() == base.data_ptr() and g.is_contiguous()
                        and g.data_ptr() == base.data_ptr() + off * base.element_size()
                        for g, off in zip(grads, self.offsets))):
            return base
        return None

    def point_grads_at(self, flat: torch.Tensor, stream) -> None:
        """Make every ``.grad`` of the bucket a view of ``flat`` (their values were copied there on
        ``stream``). The tensors they replace are freed, so the caching allocator is told that ``stream``
        still reads them (it reuses their memory only once the copy is done)."""
        for p, off in zip(self.params, self.offsets):
            if stream is not None:
                p.grad.record_stream(stream)
            p.grad = flat[off:off + p.numel()].view(p.shape)


class StreamWork:
    """A finished-on-the-device marker: ``wait()`` makes the current stream wait for everything ``stream``
    had queued when this was made (one CUDA event; the host never blocks)."""

    __slots__ = ("device", "event")

    def __init__(self, stream: torch.cuda.Stream):
        self.device = stream.device
        self.event = torch.cuda.Event()
        self.event.record(stream)

    def wait(self) -> None:
        torch.cuda.current_stream(self.device).wait_event(self.event)


class BucketedDDP(_DataParallel):
    """Overlap gradient all-reduce with backward, bucket by bucket.

    ``bucket_size_mb``: at most this many MiB of gradients per bucket (a larger tensor gets a bucket
    of its own); ``None``: one bucket per parameter, reduced in place without a copy (``OverlapDDP``).
    A bucket never mixes devices or dtypes.

    ``comm_dtype`` (e.g. ``torch.bfloat16``, as PyTorch DDP's ``bf16_compress_hook``): all-reduce in
    this dtype, half the bytes of fp32; each bucket is packed and cast in one pass, averaged, and copied
    back, so every gradient is rounded to it before averaging (relative error up to ~2^-8 for bf16).

    On GPUs every copy a launch makes (packing, casting, copying the average back) runs on a side stream
    behind backward's, so it overlaps the rest of backward as the transfer does, and
    ``finish_gradient_synchronization()`` only makes the compute stream wait; the host never blocks."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = 25.0,
                 process_group: dist.ProcessGroup | None = None, *, comm_dtype: torch.dtype | None = None):
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"{type(self).__name__}: bucket_size_mb must be > 0, got {bucket_size_mb!r}")
        _check_dtype_arg(type(self).__name__, comm_dtype)
        super().__init__(module, process_group)
        self.comm_dtype = comm_dtype
        self.bucket_size_mb = bucket_size_mb
        self.buckets = self._assign_buckets()
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._side_streams: dict[torch.device, torch.cuda.Stream] = {}  # where buckets are packed (CUDA)
        self._next_to_launch = 0
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self.trainable]

    def _assign_buckets(self) -> list[_Bucket]:
        cap = None if self.bucket_size_mb is None else self.bucket_size_mb * MB
        buckets: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed(self.trainable):
            nbytes = p.numel() * p.element_size()
            current = buckets[-1] if buckets else None
            fits = (current is not None and cap is not None and size + nbytes <= cap
                    and current[0].device == p.device and current[0].dtype == p.dtype)
            if fits:
                current.append(p)
                size += nbytes
            else:
                buckets.append([p])
                size = nbytes
        return [_Bucket(params, i) for i, params in enumerate(buckets)]

    # -- backward-time hooks ----------------------------------------------------------------
    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self._sync_enabled:
            return
        bucket = self._bucket_of[id(param)]
        if bucket.index < self._next_to_launch:
            raise RuntimeError(
                f"{type(self).__name__}: gradient of {self._names[param]} arrived after its bucket was already "
                "reduced this step (a second backward without finish_gradient_synchronization()?); run all but "
                "the last backward of an accumulation inside no_sync()")
        bucket.ready.add(id(param))
        # Launch every complete bucket from the next one in order: the same sequence on every rank.
        while self._next_to_launch < len(self.buckets) and self.buckets[self._next_to_launch].complete:
            self._launch(self.buckets[self._next_to_launch])
            self._next_to_launch += 1

    @contextlib.contextmanager
    def _packing_stream(self, device: torch.device) -> Iterator[torch.cuda.Stream | None]:
        """Run the block on this device's side stream, behind everything the current (backward) stream has
        queued so far (class docstring, "Streams"); on a CPU, in place (yields ``None``)."""
        if device.type != "cuda":
            yield None
            return
        side = self._side_streams.get(device)
        if side is None:
            side = self._side_streams[device] = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            yield side

    @torch.no_grad()
    def _launch(self, bucket: _Bucket) -> None:
        # Buffers are allocated here, on the backward stream, before switching streams: they come from its
        # pool (a side-stream pool would keep a second set of gradient-sized blocks cached) and are only
        # written after the side stream has waited for backward.
        grads = [p.grad for p in bucket.params]
        device = grads[0].device
        if self.comm_dtype is not None and grads[0].dtype != self.comm_dtype:
            # Pack and cast in one pass (no flat fp32 copy): the gradients stay autograd's own tensors and
            # receive the average back, on the side stream as soon as it lands (on a CPU: in finish).
            bucket.wire = torch.empty(bucket.numel, dtype=self.comm_dtype, device=device)
            bucket.grads = grads
            with self._packing_stream(device) as side:
                torch.cat([g.reshape(-1) for g in grads], out=bucket.wire)
                bucket.work, bucket.divide = self._all_reduce_mean(bucket.wire, async_op=True)
                if side is not None:
                    bucket.work.wait()  # the side stream waits for the collective, the host does not
                    self._unpack(bucket)
                    bucket.work = StreamWork(side)
            return
        if len(grads) == 1:  # reduced in place
            bucket.reduced = grads[0]
            bucket.work, bucket.divide = self._all_reduce_mean(bucket.reduced, async_op=True)
            return
        flat = bucket.lying_flat()
        if flat is not None:  # reduced as it lies: no copy
            bucket.reduced = flat
            bucket.work, bucket.divide = self._all_reduce_mean(flat, async_op=True)
            return
        flat = torch.empty(bucket.numel, dtype=bucket.params[0].dtype, device=device)
        with self._packing_stream(device) as side:  # the copy overlaps backward; the collective follows it
            torch.cat([g.reshape(-1) for g in grads], out=flat)
            bucket.work, bucket.divide = self._all_reduce_mean(flat, async_op=True)
        bucket.point_grads_at(flat, side)
        bucket.reduced = flat

    def _unpack(self, bucket: _Bucket) -> None:
        """``comm_dtype``: the averaged wire back into the gradients, then the divide in their dtype where the
        collective summed."""
        torch._foreach_copy_(bucket.grads, [bucket.wire[o:o + g.numel()].view(g.shape)
                                            for g, o in zip(bucket.grads, bucket.offsets)])
        if bucket.divide:
            torch._foreach_div_(bucket.grads, self.world_size)
        bucket.divide = False

    # -- API --------------------------------------------------------------------------------
    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        try:
            if self._next_to_launch < len(self.buckets):
                pending = [p for b in self.buckets[self._next_to_launch:] for p in b.params]
                missing = [p for p in pending if id(p) not in self._bucket_of[id(p)].ready]
                if missing:
                    # Buckets already launched are still in flight: let them land before raising.
                    for b in self.buckets[: self._next_to_launch]:
                        self._wait(b.work)
                    names = [self._names[p] for p in missing]
                    raise RuntimeError(
                        f"{type(self).__name__}: no gradient arrived for {len(names)} parameter(s) that require "
                        f"grad: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}. Every rank must produce "
                        "a gradient for every trainable parameter in each synchronised backward (freeze unused "
                        "parameters with requires_grad_(False))")
            for bucket in self.buckets:
                self._wait(bucket.work)
                if bucket.wire is not None and not isinstance(bucket.work, StreamWork):  # not unpacked yet (CPU)
                    self._unpack(bucket)
                elif bucket.divide:  # no AVG on this backend: one divide of the whole reduced buffer
                    bucket.reduced.div_(self.world_size)
        finally:
            self._reset_step()

    def _reset_step(self) -> None:
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.work = bucket.reduced = bucket.wire = bucket.grads = None
            bucket.divide = False
        self._next_to_launch = 0

    def on_train_batch_start(self) -> None:
        if self._next_to_launch or any(b.ready for b in self.buckets):
            raise RuntimeError(f"{type(self).__name__}: the previous step's gradients were never synchronised; "
                               "call finish_gradient_synchronization() after backward")

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class OverlapDDP(BucketedDDP):
    """One async all-reduce per parameter, issued from its post-accumulate-grad hook during backward."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None, *,
                 comm_dtype: torch.dtype | None = None):
        super().__init__(module, bucket_size_mb=None, process_group=process_group, comm_dtype=comm_dtype)


class NothingToFinish:
    """The API's step hooks for wrappers whose gradients are final after backward (no wrapper at all,
    or one that synchronises inside backward, as PyTorch DDP and FSDP2 do)."""

    def finish_gradient_synchronization(self) -> None:
        pass

    def on_train_batch_start(self) -> None:
        pass

    def close(self) -> None:
        pass


class LocalModule(NothingToFinish, nn.Module):
    """No data parallelism (one process, or the single-GPU baseline): the same API, no communication."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.stats = CommStats()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield


class TorchDDP(NothingToFinish, nn.parallel.DistributedDataParallel):
    """PyTorch's ``DistributedDataParallel`` (the peer in benchmarks) behind our API: its reducer
    synchronises inside backward, so ``finish_gradient_synchronization`` has nothing left to do."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None = None,
                 process_group: dist.ProcessGroup | None = None, *, comm_dtype: torch.dtype | None = None):
        _check_dtype_arg(type(self).__name__, comm_dtype, hooks=True)
        device = next(module.parameters()).device
        kwargs = {} if bucket_size_mb is None else {"bucket_cap_mb": bucket_size_mb}
        super().__init__(module, device_ids=[device] if device.type == "cuda" else None,
                         process_group=process_group, **kwargs)
        if comm_dtype is not None:  # torch's own compression hooks (cast, all-reduce, divide, cast back)
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = {torch.bfloat16: default_hooks.bf16_compress_hook,
                    torch.float16: default_hooks.fp16_compress_hook}[comm_dtype]
            self.register_comm_hook(process_group, hook)
        self.stats = CommStats()  # collectives run inside the reducer; not visible here


def _check_dtype_arg(who: str, dtype: torch.dtype | None, hooks: bool = False) -> None:
    """``comm_dtype`` must be None or floating; ``hooks``: PyTorch DDP's, whose compression hooks exist for
    bf16 and fp16 only."""
    if hooks:
        ok, choices = dtype in (None, torch.bfloat16, torch.float16), "torch.bfloat16 or torch.float16"
    else:
        ok, choices = dtype is None or (isinstance(dtype, torch.dtype) and dtype.is_floating_point), \
            "a floating torch.dtype"
    if not ok:
        raise ValueError(f"{who}: comm_dtype must be {choices} or None, got {dtype!r}")
