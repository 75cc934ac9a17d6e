"""The timing harness that ``bench``, ``ddp-bench`` and ``shard-bench`` share.

A timed step is bracketed by device synchronisation (``timeit.default_timer`` after a synchronize, the
handout's method), and in a process group it starts on every rank at once (:func:`align_ranks`), so no
step is charged for another rank's lateness. Paired timing (:func:`time_pairs`) alternates two steps
so that both halves of a pair see the same host conditions on a shared machine; summaries are medians
with their spread (:func:`summarize`) and a bootstrap interval of the median (:func:`median_ci95`).
:func:`profile_comm` measures, from one profiled step, how long communication ran and how much of it
overlapped compute.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import statistics
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cs336_systems.devices import resolve_device
from cs336_systems.profiling.quiet import native_stderr_silenced, quiet_profile


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_world_and_device(who: str, world_size: int, device: str | None, min_world: int = 1) -> None:
    """``ValueError`` naming the setting and its allowed values for a process count below ``min_world`` (or
    not an integer), a device other than cpu / cuda / None, or CUDA asked for where it cannot run ``world_size``
    ranks (one GPU each)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < min_world:
        raise ValueError(f"{who}: --world-size must be an integer >= {min_world} (processes, one per device), "
                         f"got {world_size!r}")
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"{who}: --device must be cpu or cuda (default: cuda if available), got {device!r}")
    if resolve_device(device).type == "cuda":
        n = torch.cuda.device_count()
        if n < world_size:
            raise ValueError(f"{who}: {world_size} ranks need {world_size} GPUs, found {n}; use --world-size <= {n}")


def summarize(samples: list[float]) -> dict[str, float]:
    """mean / std (sample) / median / min of ``samples`` (seconds), as milliseconds."""
    if not samples:
        return {"mean_ms": float("nan"), "std_ms": float("nan"), "median_ms": float("nan"), "min_ms": float("nan")}
    ms = [s * 1e3 for s in samples]
    return {
        "mean_ms": statistics.fmean(ms),
        "std_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
    }


def median_ci95(samples: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap 95% interval of the median of ``samples`` (fixed seed: reproducible)."""
    import numpy as np

    x = np.asarray(samples, dtype=float)
    if len(x) < 2:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def align_ranks(device: torch.device) -> None:
    """Start a timed step on every rank at the same moment: a barrier that returns once every rank reached
    it (a no-op outside a process group). Without it a step is charged for the time another rank still
    spent on the previous one (a step that nothing synchronised): its first collective waits for it."""
    if not dist.is_initialized():
        return
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
    synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device,
          sync: Callable[[], None] | None = None) -> tuple[float, Any]:
    """(seconds, result) of one call of ``fn``: synchronized at both ends and none inside, so host launches
    overlap device work as in training; started on every rank at once (:func:`align_ranks`). ``sync``
    replaces the device synchronize (a caller's own, e.g. one that also counts)."""
    sync = sync or (lambda: synchronize(device))
    sync()
    align_ranks(device)
    t0 = timeit.default_timer()
    result = fn()
    sync()
    return timeit.default_timer() - t0, result


def time_pairs(first: Callable[[], Any], second: Callable[[], Any], pairs: int,
               device: torch.device) -> tuple[list[tuple[float, Any]], list[tuple[float, Any]]]:
    """``pairs`` times: a timed call of ``first``, then one of ``second``. The host speed of a shared machine
    drifts over seconds; the two halves of a pair see the same conditions, so their ratio is the cost of
    what differs between them even when the absolute times wander."""
    a, b = [], []
    for _ in range(pairs):
        a.append(timed(first, device))
        b.append(timed(second, device))
    return a, b


def paired_overhead(step_s: list[float], base_s: list[float]) -> dict:
    """Summary of pairs (step i against base i): ``overhead`` = median of step / base - 1 with its bootstrap
    95% interval, and ``exposed_ms`` = the median difference, or None where it is not above zero (then the
    difference is lost in the noise: not a measured time)."""
    ratios = [s / b for s, b in zip(step_s, base_s, strict=True)]
    diff_ms = statistics.median((s - b) * 1e3 for s, b in zip(step_s, base_s, strict=True))
    return {"overhead": statistics.median(ratios) - 1.0, "overhead_ci95": [r - 1.0 for r in median_ci95(ratios)],
            "exposed_ms": diff_ms if diff_ms > 0 else None}


class StepClock:
    """Marks between the phases of one step: CUDA events on the current stream, or the host clock on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(timeit.default_timer())

    def intervals_ms(self) -> list[float]:
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


class PhaseTimer:
    """Times named phases of a step: host clock (``timeit.default_timer``) after a device
    synchronize, plus CUDA events recorded around the same region on GPUs."""

    def __init__(self, device: torch.device):
        self.device = device
        self.host: dict[str, list[float]] = {}
        self._events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {}

    @contextlib.contextmanager
    def phase(self, name: str, record: bool = True):
        synchronize(self.device)
        start_ev = end_ev = None
        if record and self.device.type == "cuda":
            start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_ev.record()
        t0 = timeit.default_timer()
        yield
        if end_ev is not None:
            end_ev.record()
        synchronize(self.device)
        if record:
            self.host.setdefault(name, []).append(timeit.default_timer() - t0)
            if start_ev is not None:
                self._events.setdefault(name, []).append((start_ev, end_ev))

    def event_seconds(self, name: str) -> list[float]:
        return [s.elapsed_time(e) / 1e3 for s, e in self._events.get(name, [])]


def is_comm(name: str) -> bool:
    """Whether a kernel or op of a profile is a collective (NCCL kernels; gloo ops on a CPU)."""
    n = name.lower()
    return "nccl" in n or "allreduce" in n or "all_reduce" in n or "gloo" in n


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Length (ms) of the union of ``(start_us, end_us)`` intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total / 1e3


def profile_comm(step_fn: Callable[[], Any], device: torch.device, *, cpu_activity: bool = False,
                 trace_path: Path | None = None, keep_timeline: bool = False) -> dict:
    """One call of ``step_fn`` under ``torch.profiler``: how long collectives ran on the device
    (``comm_kernel_ms``), how long compute kernels ran, and how much of the communication ran concurrently
    with compute (``comm_hidden_ms``); all-gathers apart (FSDP) and the compute stream's idle time. On a CPU
    device the numbers come from the profiler's CPU ops (coarse). ``cpu_activity`` adds host activity to a
    CUDA trace (``trace_path``: the Chrome trace, gzipped); ``keep_timeline``: the kernel intervals too."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    if cpu_activity and device.type == "cuda":
        activities.insert(0, ProfilerActivity.CPU)
    with quiet_profile(activities=activities) as prof:
        step_fn()
        synchronize(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        with native_stderr_silenced():
            prof.export_chrome_trace(str(path))
        text = path.read_text()
    if trace_path is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(trace_path, "wt") as f:
            f.write(text)
    wanted = "kernel" if device.type == "cuda" else "cpu_op"
    kernels = sorted((e for e in json.loads(text).get("traceEvents", []) if e.get("cat") == wanted and "dur" in e),
                     key=lambda e: e["ts"])
    if not kernels:
        return {}
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if is_comm(e["name"])]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if not is_comm(e["name"])]
    gathers = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "allgather" in e["name"].lower().replace("_", "")]
    comm_ms, compute_ms = union_ms(comm), union_ms(compute)
    t0 = kernels[0]["ts"]
    out = {"comm_kernel_ms": comm_ms, "comm_hidden_ms": max(0.0, comm_ms + compute_ms - union_ms(comm + compute)),
           "compute_kernel_ms": compute_ms, "comm_kernels": len(comm),
           "allgather_kernel_ms": union_ms(gathers), "allgather_kernels": len(gathers),
           # the compute stream's idle time: the step's kernel span minus the time some compute kernel ran
           "compute_idle_ms": (kernels[-1]["ts"] + kernels[-1]["dur"] - t0) / 1e3 - compute_ms}
    if keep_timeline:
        out["timeline"] = {"start_us": [round(e["ts"] - t0, 1) for e in kernels],
                           "dur_us": [round(e["dur"], 1) for e in kernels],
                           "comm": [is_comm(e["name"]) for e in kernels],
                           "stream": [e.get("args", {}).get("stream", e.get("tid")) for e in kernels]}
    return out


def markdown_table(rows: list[dict], columns: list[str], floatfmt: str = ".4g") -> str:
    """The ``columns`` of ``rows`` (those present) as a markdown table; a value that was not measured (None,
    or missing from a row) shows as n/a, never as 0 or nan."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df = df[[c for c in columns if c in df.columns]]
    return df.astype(object).where(df.notna(), None).to_markdown(index=False, floatfmt=floatfmt, missingval="n/a")
