"""Gradient averaging over the GPUs of one node with copy engines instead of SM kernels.

An NCCL all-reduce runs as kernels: its thread blocks hold SMs for the whole transfer (and while they
wait for a late peer), SMs that backward's kernels then lack. The GPUs of one node can instead map each
other's memory (CUDA virtual memory, PyTorch's symmetric memory) and move bytes with
``cudaMemcpyAsync``, which the copy engines (DMA units) carry out over NVLink without any SM. Only the
arithmetic needs SMs: one short memory-bound kernel per bucket. Measured on 2 x H200
(docs/parallelism.md): as fast as NCCL for the same bytes, but the xl training step costs the same with
either transport, so there the SMs were not what communication took from backward.

:class:`CopyEngineAllReduce` averages flat buckets that live in symmetric memory, in two shots (the
reduce-scatter + all-gather decomposition of a ring all-reduce, so each rank sends ``2 (N-1)/N`` of a
bucket, the minimum), all on a side stream:

1. bucket split into ``N`` chunks; rank ``r`` pushes chunk ``p`` to rank ``p``'s scratch (copy engine);
2. barrier (every rank's pushes have landed);
3. rank ``r`` averages its chunk ``r`` with the ``N - 1`` copies it received (one kernel);
4. rank ``r`` pushes its averaged chunk into chunk ``r`` of every peer's bucket (copy engine);
5. barrier (every chunk is in place on every rank).

Reuse is safe without more barriers: a rank pushes into a peer's scratch for a bucket again only after
its own barrier 5 of that bucket's previous average, which the peer passes after it has read that
scratch (3 precedes 5 on its stream); it pushes into a peer's bucket only after barrier 2, which the
peer passes after its backward has finished that bucket (its side stream waited for it), and the peer
touches the bucket again only after waiting for 5. A barrier waits at most ``timeout_ms`` for a lost
peer and then aborts the process with a device-side error instead of hanging.

Idea: copy-engine collectives for overlapped communication (PyTorch's symmetric-memory
"low-contention" collectives, NCCL 2.28's CE collectives); the implementation here is our own.
"""

from __future__ import annotations

import socket
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from cs336_systems.parallel.ddp import StreamWork  # the package does not import this file


def _unavailable(device: torch.device) -> str | None:
    """Why this process cannot use :class:`CopyEngineAllReduce` (``None``: it can)."""
    if device.type != "cuda":
        return f"its buffers must be on a CUDA device (got {device})"
    if not dist.is_initialized():
        return "torch.distributed is not initialised"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as e:  # a torch build without symmetric memory
        return f"this torch build has no symmetric memory ({e})"
    return None


@triton.jit
def _average_pair_kernel(own_ptr, other_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(own_ptr + offs, mask=mask)
    b = tl.load(other_ptr + offs, mask=mask)
    tl.store(own_ptr + offs, (a + b) * 0.5, mask=mask)  # the sum rounded once; halving is exact


def _average_pair_(own: torch.Tensor, other: torch.Tensor) -> None:
    """``own = (own + other) / 2`` in one memory pass (``add_`` then ``mul_`` would read ``own`` twice)."""
    block = 4096
    _average_pair_kernel[(triton.cdiv(own.numel(), block),)](own, other, own.numel(), BLOCK=block)


@dataclass(frozen=True)
class _Plan:
    """Precomputed views of one bucket (slicing on every launch would cost host time)."""

    flat: torch.Tensor  # the bucket's first ``numel`` elements (what the gradients are views of)
    own: torch.Tensor  # this rank's chunk of the local bucket
    received: tuple[torch.Tensor, ...]  # the N-1 copies of ``own`` pushed here by the peers (local scratch)
    sends: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # (peer's scratch slot, local chunk) for step 1
    gathers: tuple[torch.Tensor, ...]  # the peers' views of chunk r of their bucket, for step 4


class CopyEngineAllReduce:
    """Average buckets of ``numels`` elements of ``dtype`` over ``process_group`` (all ranks on one node).

    ``view(i)`` is bucket ``i``'s flat tensor (fill it, e.g. point gradients at its slices);
    ``start(i)`` queues the average on a side stream behind the current stream's work and returns a
    work whose ``wait()`` makes the current stream wait for the result. Buckets must be started in the
    same order on every rank, like any collective.

    Memory: the buckets (each padded to a multiple of the world size) plus ``(N-1)/N`` of them as
    scratch, allocated once in symmetric memory, outside PyTorch's caching allocator (``nbytes``
    reports it, since ``torch.cuda.memory_allocated`` does not).
    """

    def __init__(self, numels: list[int], dtype: torch.dtype, device: torch.device,
                 process_group: dist.ProcessGroup | None = None, timeout_ms: int = 300_000):
        why = _unavailable(device)
        if why:
            raise ValueError(f"CopyEngineAllReduce: {why}")
        if not numels or any(n <= 0 for n in numels):
            raise ValueError(f"CopyEngineAllReduce: bucket sizes must be positive, got {numels}")
        import torch.distributed._symmetric_memory as symm_mem

        group = process_group or dist.group.WORLD
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        hosts: list = [None] * self.world_size
        dist.all_gather_object(hosts, socket.gethostname(), group=group)
        if len(set(hosts)) > 1:  # symmetric memory maps peers' memory over NVLink: one node only
            raise ValueError(f"CopyEngineAllReduce: the ranks span several hosts ({sorted(set(hosts))}); the "
                             "copy-engine transport works within one node (use transport='collective')")
        self.timeout_ms = int(timeout_ms)
        n, r = self.world_size, self.rank
        chunks = [-(-k // n) for k in numels]  # ceil: padded buckets split evenly
        total, scratch_total = sum(c * n for c in chunks), max(1, sum(c * (n - 1) for c in chunks))
        with torch.cuda.device(device):
            self.buffer = symm_mem.empty(total, dtype=dtype, device=device).zero_()
            self.scratch = symm_mem.empty(scratch_total, dtype=dtype, device=device)
            if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by older torch, a deprecated no-op later
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    symm_mem.enable_symm_mem_for_group(group.group_name)
            self._buffer_handle = symm_mem.rendezvous(self.buffer, group)
            self._scratch_handle = symm_mem.rendezvous(self.scratch, group)
            peers = [p for p in range(n) if p != r]
            peer_buffer = {p: self._buffer_handle.get_buffer(p, (total,), dtype) for p in peers}
            peer_scratch = {p: self._scratch_handle.get_buffer(p, (scratch_total,), dtype) for p in peers}
            self.stream = torch.cuda.Stream(device)
        self.device = device
        self.nbytes = (total + scratch_total) * self.buffer.element_size()

        def slot(src: int, dst: int) -> int:  # where rank src's copy lands in rank dst's scratch of a bucket
            return (src - dst) % n - 1

        self._plans: list[_Plan] = []
        off = soff = 0
        for k, c in zip(numels, chunks):
            def chunk(t: torch.Tensor, base: int, j: int, c: int = c) -> torch.Tensor:
                return t[base + j * c: base + (j + 1) * c]

            self._plans.append(_Plan(
                flat=self.buffer[off:off + k],
                own=chunk(self.buffer, off, r),
                received=tuple(chunk(self.scratch, soff, slot(p, r)) for p in peers),
                sends=tuple((chunk(peer_scratch[p], soff, slot(r, p)), chunk(self.buffer, off, p)) for p in peers),
                gathers=tuple(chunk(peer_buffer[p], off, r) for p in peers)))
            off, soff = off + c * n, soff + c * (n - 1)

    def view(self, i: int) -> torch.Tensor:
        return self._plans[i].flat

    def start(self, i: int) -> StreamWork:
        plan = self._plans[i]
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for dst, src in plan.sends:  # 1: copy engine (same-device memcpy into mapped peer memory)
                dst.copy_(src)
            self._buffer_handle.barrier(channel=0, timeout_ms=self.timeout_ms)  # 2
            if len(plan.received) == 1:  # 3: two ranks: (own + received) / 2 in one pass
                _average_pair_(plan.own, plan.received[0])
            else:
                for part in plan.received:
                    plan.own.add_(part)
                plan.own.div_(self.world_size)
            for dst in plan.gathers:  # 4: copy engine
                dst.copy_(plan.own)
            self._buffer_handle.barrier(channel=0, timeout_ms=self.timeout_ms)  # 5
        return StreamWork(self.stream)
