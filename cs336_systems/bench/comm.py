"""All-reduce benchmark (handout problem ``distributed_communication_single_node``).

For each tensor size, every rank all-reduces a float32 tensor ``warmup`` times untimed, then
``iters`` times timed: a barrier lines the ranks up, the clock starts, the all-reduce runs, the
device is synchronised (NCCL returns once the work is queued), the clock stops. Per-rank timings
are gathered from all ranks; an iteration's latency is the slowest rank's (the collective is not
done until every rank is), summarised over iterations.

Bandwidths follow nccl-tests' conventions: algorithm bandwidth = bytes / latency; bus bandwidth =
algbw * 2 (n - 1) / n, the per-link traffic of a ring all-reduce, comparable across world sizes and
with the hardware's link speed. Sizes are decimal megabytes (1 MB = 10^6 bytes).
"""

from __future__ import annotations

import statistics
import timeit
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cs336_systems.parallel.process_group import BACKENDS, DistInfo, run_distributed
from cs336_systems.records.schema import COMM_PROBLEM

PROBLEM = COMM_PROBLEM
DEFAULT_SIZES_MB = (1.0, 10.0, 100.0, 1000.0)


@dataclass(kw_only=True)
class CommBenchConfig:
    backend: str = "gloo"
    world_size: int = 2
    sizes_mb: tuple[float, ...] = DEFAULT_SIZES_MB
    warmup: int = 5
    iters: int = 10
    timeout_s: float = 600.0

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"comm-bench: unknown backend {self.backend!r}; choose from {', '.join(BACKENDS)}")
        if self.world_size < 2:
            raise ValueError(f"comm-bench: world_size must be >= 2, got {self.world_size}")
        if not self.sizes_mb or any(s <= 0 for s in self.sizes_mb):
            raise ValueError(f"comm-bench: sizes must be positive, got {self.sizes_mb}")
        if self.warmup < 0 or self.iters < 1:
            raise ValueError(f"comm-bench: need warmup >= 0 and iters >= 1, got {self.warmup}, {self.iters}")
        if self.backend == "nccl":
            n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if self.world_size > n_gpus:
                raise ValueError(f"comm-bench: NCCL with {self.world_size} processes needs {self.world_size} GPUs; "
                                 f"this machine has {n_gpus}")

    @property
    def device_type(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def all_reduce_worker(info: DistInfo, sizes_mb: tuple[float, ...], warmup: int, iters: int) -> dict[float, list[float]]:
    """Per size, this rank's latencies (seconds) of ``iters`` timed all-reduces."""
    times: dict[float, list[float]] = {}
    for size_mb in sizes_mb:
        n = int(size_mb * 1e6) // 4
        data = torch.rand(n, dtype=torch.float32, device=info.device)
        for _ in range(warmup):
            dist.all_reduce(data)
        _sync(info.device)
        samples = []
        for _ in range(iters):
            dist.barrier()
            _sync(info.device)
            t0 = timeit.default_timer()
            dist.all_reduce(data)
            _sync(info.device)
            samples.append(timeit.default_timer() - t0)
        times[size_mb] = samples
        del data
        if info.device.type == "cuda":
            torch.cuda.empty_cache()
    return times


def summarize_ranks(cfg: CommBenchConfig, per_rank: list[dict[float, list[float]]]) -> list[dict]:
    """One record per size from every rank's latencies."""
    rows = []
    n = cfg.world_size
    for size_mb in cfg.sizes_mb:
        by_iter = list(zip(*(r[size_mb] for r in per_rank)))  # iters x ranks
        slowest = [max(it) for it in by_iter]
        nbytes = (int(size_mb * 1e6) // 4) * 4
        median = statistics.median(slowest)
        algbw = nbytes / median / 1e9
        rows.append({
            "backend": cfg.backend, "device_type": cfg.device_type, "world_size": n, "size_mb": size_mb,
            "bytes": nbytes, "warmup": cfg.warmup, "iters": cfg.iters,
            "latency_median_ms": median * 1e3, "latency_mean_ms": statistics.fmean(slowest) * 1e3,
            "latency_std_ms": (statistics.stdev(slowest) if len(slowest) > 1 else 0.0) * 1e3,
            "latency_min_ms": min(slowest) * 1e3,
            "per_rank_median_ms": [statistics.median(r[size_mb]) * 1e3 for r in per_rank],
            "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (n - 1) / n,
        })
    return rows


def run_comm_bench(cfg: CommBenchConfig) -> list[dict] | None:
    """Run one (backend, world size) over all sizes; the records on the main process, None elsewhere."""
    per_rank = run_distributed(all_reduce_worker, cfg.world_size, (tuple(cfg.sizes_mb), cfg.warmup, cfg.iters),
                               backend=cfg.backend, device_type=cfg.device_type, timeout_s=cfg.timeout_s)
    return None if per_rank is None else summarize_ranks(cfg, per_rank)
