"""Process groups the standard way: ``torch.distributed`` initialised from torchrun's environment.

Under ``torchrun`` every process finds ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` in its environment; :func:`init_distributed` reads them, picks the backend (NCCL for
CUDA, gloo for CPU), binds the process to GPU ``LOCAL_RANK`` and gives the group a timeout, so that
a lost peer ends the job with an error instead of a hang. Several nodes: torchrun's rendezvous sets
the same variables; nothing here changes.

:func:`spawn` starts ``N`` local processes on a free port with the same environment torchrun would
give them (for tests and CPU runs). A worker that raises fails the whole group at once, and a group
that outlives its timeout is killed and reported, never waited on forever.
"""

from __future__ import annotations

import datetime as _dt
import multiprocessing
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S = 300.0
BACKENDS = ("nccl", "gloo")


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in its process group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it; never a fixed number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    """True when this process was started by torchrun (or :func:`spawn`) and can join a group."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def default_backend(device_type: str | None = None) -> str:
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    return "nccl" if device_type == "cuda" else "gloo"


def init_distributed(backend: str | None = None, device_type: str | None = None,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> DistInfo:
    """Join the process group described by torchrun's environment variables; returns :class:`DistInfo`.

    ``device_type`` None: CUDA when available. NCCL needs CUDA; gloo serves CPU tensors. If the group is
    already initialised (e.g. by the caller) it is reused.
    """
    if not under_torchrun():
        raise ValueError("init_distributed: RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT are not set; "
                         "start the program with `torchrun --nproc-per-node N -m cs336_systems ...`")
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    backend = backend or default_backend(device_type)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "nccl" and device_type != "cuda":
        raise ValueError("the NCCL backend needs CUDA devices; use gloo on CPU")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device_type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible")
        torch.cuda.set_device(local_rank)  # each rank binds its own GPU
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                timeout=_dt.timedelta(seconds=timeout_s))
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, backend=backend, device=device)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# --- local launcher (tests, CPU runs) ----------------------------------------------------------

def _worker(local_rank: int, world_size: int, port: int, fn: Callable, args: tuple, out_dir: str,
            backend: str | None, device_type: str | None, timeout_s: float, threads: int | None) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if threads:
        torch.set_num_threads(threads)
    info = init_distributed(backend, device_type, timeout_s)
    try:
        result = fn(info, *args)
        torch.save(result, Path(out_dir) / f"rank{local_rank}.pt")
    finally:
        destroy_distributed()


def spawn(fn: Callable[..., Any], world_size: int, args: tuple = (), *, backend: str | None = None,
          device_type: str | None = "cpu", timeout_s: float = 120.0, threads: int | None = 1) -> list[Any]:
    """Run ``fn(info: DistInfo, *args)`` in ``world_size`` fresh processes joined in one group on a free
    port; returns the list of per-rank return values (``fn`` must be a module-level function and its
    result picklable).

    If any rank raises, the others are terminated and the error (with the rank's traceback) is raised
    here. If the group has not finished after ``timeout_s`` seconds, every process is killed and
    ``TimeoutError`` is raised: a hang becomes a failure.
    """
    if world_size < 1:
        raise ValueError(f"spawn: world_size must be >= 1, got {world_size}")
    with tempfile.TemporaryDirectory(prefix="cs336-spawn-") as out_dir:
        port = free_port()
        ctx = mp.start_processes(
            _worker, args=(world_size, port, fn, args, out_dir, backend, device_type, timeout_s * 0.9, threads),
            nprocs=world_size, join=False, start_method=_start_method())
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.05, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"spawn: {world_size} processes of {getattr(fn, '__name__', fn)} did not "
                                       f"finish within {timeout_s:.0f} s; killed them")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def _start_method() -> str:
    """forkserver with torch preloaded: children start in ~0.1 s instead of re-importing torch, and
    no OpenMP state is forked from a parent that has already run parallel regions. ``torch._dynamo`` is
    imported by the first ``torch.optim.Optimizer`` built in a process (1-2.6 s each, every worker);
    preloading it took the distributed CPU tests from 82-93 s to 31-37 s on 2 cores."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo",
                                                "cs336_systems.parallel.ddp"])
        return "forkserver"
    return "spawn"


def run_distributed(fn: Callable[..., Any], world_size: int, args: tuple = (), *, backend: str | None = None,
                    device_type: str | None = None, timeout_s: float = 600.0) -> list[Any] | None:
    """Run ``fn(info, *args)`` on every rank and return all ranks' results on the main process.

    Under torchrun: this process joins the group (its ``WORLD_SIZE`` must equal ``world_size``), runs
    ``fn``, and the results are gathered with ``all_gather_object``; rank 0 gets the list, other ranks
    get None. Otherwise: ``world_size`` local processes are spawned on a free port (single node).
    """
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world_size:
            raise ValueError(f"asked for {world_size} processes but torchrun started {os.environ['WORLD_SIZE']}")
        owns_group = not dist.is_initialized()
        info = init_distributed(backend, device_type, timeout_s)
        try:
            result = fn(info, *args)
            gathered: list = [None] * info.world_size
            dist.all_gather_object(gathered, result)
        finally:
            if owns_group:
                destroy_distributed()
        return gathered if info.is_main else None
    return spawn(fn, world_size, args, backend=backend, device_type=device_type or "cpu", timeout_s=timeout_s,
                 threads=None)
