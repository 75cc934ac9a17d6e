"""Data-parallel step benchmark: our four wrappers, PyTorch DDP, and the no-communication baseline
(handout problems ``naive_ddp_benchmarking``, ``minimal_ddp_flat_benchmarking``,
``ddp_overlap_individual_parameters_benchmarking``, ``ddp_bucketed_benchmarking``).

Every rank builds the same model once per precision, then each variant wraps it in turn (hooks are
removed between variants; PyTorch DDP goes last). Per variant:

* ``warmup`` untimed steps, then ``steps`` timed training steps (forward, backward,
  ``finish_gradient_synchronization``, AdamW). The clock reads after a device synchronize at both
  ends of a step; CUDA events on the compute stream split it into forward+backward, the wait for
  gradients (``sync``: everything the compute stream waited for in ``finish_gradient_synchronization``)
  and the optimizer. A step's time is the slowest rank's. The no-communication halves (below) are split
  the same way (``nocomm_fwd_bwd_ms``, ``nocomm_optimizer_ms``; newer records), so a pair's difference can
  be placed: a longer backward, the wait, or the optimizer.
* after each timed step, the same step inside ``no_sync()`` (no collective is issued): the steps come in
  pairs, so that drifting host speed (a shared machine; the eager bf16 step is host-bound) hits both
  halves of a pair alike. Every timed step starts with the ranks aligned by a barrier
  (:func:`align_ranks`): nothing else synchronises the ranks after a ``no_sync()`` step, and without it
  the next step's first all-reduce waits for the rank that finished late, charging the gap to
  communication. A synchronised step's time is its slowest rank's; the no-communication step, a
  single-GPU step, is the mean over ranks of each rank's own. ``exposed`` communication = median over
  pairs of (step - no-communication step); ``overhead`` = median over pairs of step /
  no-communication step - 1, with a bootstrap 95% interval (``overhead_ci95``). ``overhead_vs_slowest``
  (newer records) divides by the slower rank's no-communication step instead: a
  synchronised step cannot end before its slowest rank, so the ranks' spread alone (host jitter, not
  communication) is left out of it. Records with ``timing="paired-aligned"``. ``timing="paired"`` records
  (earlier) had no barrier and took the slowest rank for both halves, which over-charged communication by
  up to the ranks' step-time spread; older records still ran all steps first, then all no-communication
  steps.
* on GPUs, one step under ``torch.profiler`` (CUDA activity only): the summed duration of NCCL
  kernels (``comm_kernel_ms``, the time spent inside collectives on the device) and how much of it
  ran concurrently with compute kernels (``comm_hidden_ms``). On CPU (gloo) the same numbers come
  from the profiler's CPU ops, which is coarse.

``peak_memory_gib`` is the largest rank's allocator peak during the variant (reset before each one;
``peak_memory_scope="variant"``). Records without that key were taken with the peak reset once per
precision, so their peak is the running maximum over the variants measured before, an upper bound.

``none`` is the plain module with no wrapper: the single-device step at the same per-device batch.
For the variants in ``timeline_variants`` the profiled step's kernel intervals of rank 0 are kept
in the records, so the report can draw the naive-vs-overlapped timeline.
"""

from __future__ import annotations

import contextlib
import gc
import json
import statistics
import tempfile
import timeit
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.optimizer import AdamW
from cs336_systems.configs import count_parameters, get_preset
from cs336_systems.parallel import wrap_model
from cs336_systems.parallel.ddp import GRAD_COMM_DTYPES, TRANSPORTS
from cs336_systems.parallel.process_group import DistInfo, bind_cpus_requested, run_distributed

PROBLEM = "ddp_bucketed_benchmarking"  # records of every variant live under one problem id
VARIANTS = ("none", "naive", "flat", "overlap", "bucketed", "torch-ddp")
PRECISIONS = ("fp32", "bf16")
OURS_OVERLAPPING = ("overlap", "bucketed")  # the variants that take compute_dtype and sm_carveout (BucketedDDP)
# Records' ``timing``: "paired-aligned" (module docstring); "paired" records (before 2026-11-22 08:40) did not
# align the ranks before each step and took the slowest rank of the no_sync() half too.
TIMING = "paired-aligned"


@dataclass(kw_only=True)
class DDPBenchConfig:
    preset: str = "xl"
    context_length: int = 512
    batch_size: int = 4  # per rank
    precisions: tuple[str, ...] = PRECISIONS
    variants: tuple[str, ...] = VARIANTS
    bucket_sizes_mb: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0)
    world_size: int = 2
    warmup: int = 3
    steps: int = 5
    profile: bool = True
    timeline_variants: tuple[str, ...] = ("naive", "overlap")
    attention: str = "reference"
    device: str | None = None  # None: cuda if available
    timeout_s: float = 900.0
    nccl_max_ctas: int | None = None  # cap on NCCL's thread blocks per collective (NCCL_MAX_CTAS); None: NCCL's
    compile: bool = False  # torch.compile each Transformer block in place (regional compilation; fewer launches)
    nccl_high_priority: bool = False  # NCCL on high-priority streams (process_group.HIGH_PRIORITY_ENV)
    grad_comm_dtype: str | None = None  # "bf16" / "fp16": overlap, bucketed and torch-ddp all-reduce in it
    # "bf16": overlap and bucketed compute with bf16 copies of the Linear weights (BucketedDDP's compute_dtype;
    # the same values autocast would use, gradients into the buckets without an fp32 pass); needs precision bf16
    compute_dtype: str | None = None
    sm_carveout: int | None = None  # overlap / bucketed: SMs matmuls leave to NCCL while buckets are in flight
    # overlap / bucketed run once per transport ("collective": NCCL/gloo all-reduce; "copy-engine": BucketedDDP)
    transports: tuple[str, ...] = ("collective",)

    def __post_init__(self):
        get_preset(self.preset)
        if self.nccl_max_ctas is not None and not 1 <= self.nccl_max_ctas <= 64:
            raise ValueError(f"ddp-bench: nccl_max_ctas must be in 1..64, got {self.nccl_max_ctas}")
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"ddp-bench: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
        for p in self.precisions:
            if p not in PRECISIONS:
                raise ValueError(f"ddp-bench: unknown precision {p!r}; choose from {', '.join(PRECISIONS)}")
        if self.world_size < 2:
            raise ValueError("ddp-bench: world_size must be >= 2 (the single-device step is the 'none' variant)")
        if self.warmup < 1 or self.steps < 2:
            raise ValueError(f"ddp-bench: need warmup >= 1 and steps >= 2, got {self.warmup}, {self.steps}")
        if self.grad_comm_dtype is not None:
            if self.grad_comm_dtype not in GRAD_COMM_DTYPES:
                raise ValueError(f"ddp-bench: grad_comm_dtype must be one of {', '.join(GRAD_COMM_DTYPES)} or None, "
                                 f"got {self.grad_comm_dtype!r}")
            bad = [v for v in self.variants if v in ("naive", "flat")]
            if bad:
                raise ValueError(f"ddp-bench: grad_comm_dtype applies to overlap, bucketed and torch-ddp; drop {bad}")
        if self.compute_dtype is not None:
            if self.compute_dtype != "bf16" or self.precisions != ("bf16",):
                raise ValueError(f"ddp-bench: compute_dtype must be 'bf16' (or None), with precision bf16 only (the "
                                 f"copies stand in for autocast's casts); got {self.compute_dtype!r} with "
                                 f"{self.precisions}")
            bad = [v for v in self.variants if v in ("naive", "flat")]
            if bad or "copy-engine" in self.transports:
                raise ValueError("ddp-bench: compute_dtype applies to overlap and bucketed with the collective "
                                 f"transport; drop {bad or 'copy-engine'}")
        if self.sm_carveout is not None and not 1 <= self.sm_carveout <= 64:
            raise ValueError(f"ddp-bench: sm_carveout must be in 1..64, got {self.sm_carveout}")
        bad = [t for t in self.transports if t not in TRANSPORTS]
        if bad or not self.transports:
            raise ValueError(f"ddp-bench: transports must be some of {', '.join(TRANSPORTS)}, got {self.transports}")
        if "copy-engine" in self.transports:
            if self.device_type != "cuda":
                raise ValueError("ddp-bench: the copy-engine transport needs GPUs (symmetric memory over NVLink)")
            if self.grad_comm_dtype is not None:
                raise ValueError("ddp-bench: the copy-engine transport moves fp32 gradients; drop grad_comm_dtype")
        if any(b <= 0 for b in self.bucket_sizes_mb):
            raise ValueError(f"ddp-bench: bucket sizes must be > 0, got {self.bucket_sizes_mb}")
        if self.device == "cuda" or (self.device is None and torch.cuda.is_available()):
            n = torch.cuda.device_count()
            if n < self.world_size:
                raise ValueError(f"ddp-bench: {self.world_size} ranks need {self.world_size} GPUs, found {n}")

    @property
    def device_type(self) -> str:
        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def runs(self) -> list[tuple[str, float | None, str]]:
        """(variant, bucket size, transport) in benchmark order; torch DDP last (its reducer is not removable)."""
        out: list[tuple[str, float | None, str]] = []
        for v in self.variants:
            if v == "bucketed":
                out += [("bucketed", b, t) for t in self.transports for b in self.bucket_sizes_mb]
            elif v == "overlap":
                out += [("overlap", None, t) for t in self.transports]
            elif v != "torch-ddp":
                out.append((v, None, "collective"))
        if "torch-ddp" in self.variants:
            out.append(("torch-ddp", None, "collective"))  # its default 25 MB buckets
        return out


class _StepClock:
    """Marks on the compute stream (CUDA events) or host clock (CPU) between the phases of a step."""

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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def align_ranks(device: torch.device) -> None:
    """Start a timed step on every rank at the same moment: a barrier that returns once every rank reached
    it. Without it a step is charged for the time the other rank still spent on the previous one (a step
    inside ``no_sync()`` or of another model, which nothing synchronised): the first collective waits for
    the late rank."""
    if not dist.is_initialized():
        return
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
    _sync(device)


def _is_comm(name: str) -> bool:
    n = name.lower()
    return "nccl" in n or "allreduce" in n or "all_reduce" in n or "gloo" in n


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total / 1e3


def _profile_step(step_fn, device: torch.device, keep_intervals: bool) -> dict:
    """One step under torch.profiler: communication time on the device and how much of it overlapped compute."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        step_fn(communicate=True)
        _sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    wanted = "kernel" if device.type == "cuda" else "cpu_op"
    kernels = [e for e in events if e.get("cat") == wanted and "dur" in e]
    if not kernels:
        return {}
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if _is_comm(e["name"])]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if not _is_comm(e["name"])]
    comm_ms, compute_ms = _union_ms(comm), _union_ms(compute)
    hidden_ms = max(0.0, comm_ms + compute_ms - _union_ms(comm + compute))  # |comm ∩ compute|
    out = {"comm_kernel_ms": comm_ms, "comm_hidden_ms": hidden_ms, "compute_kernel_ms": compute_ms,
           "comm_kernels": len(comm)}
    if keep_intervals:
        t0 = min(e["ts"] for e in kernels)
        rows = sorted(kernels, key=lambda e: e["ts"])
        out["timeline"] = {"start_us": [round(e["ts"] - t0, 1) for e in rows],
                           "dur_us": [round(e["dur"], 1) for e in rows], "comm": [_is_comm(e["name"]) for e in rows],
                           "stream": [e.get("args", {}).get("stream", e.get("tid")) for e in rows]}
    return out


def _bench_variant(info: DistInfo, cfg: DDPBenchConfig, model, optimizer, x, y, precision: str, variant: str,
                   bucket_mb: float | None, label: str, transport: str = "collective") -> dict:
    device = info.device
    comm = GRAD_COMM_DTYPES[cfg.grad_comm_dtype] if cfg.grad_comm_dtype and variant != "none" else None
    ours = variant in OURS_OVERLAPPING
    compute = GRAD_COMM_DTYPES[cfg.compute_dtype] if cfg.compute_dtype and ours else None
    carve = cfg.sm_carveout if ours else None
    wrapped = wrap_model(model, variant, bucket_mb, grad_comm_dtype=comm, transport=transport, compute_dtype=compute,
                         sm_carveout=carve)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16" \
        else contextlib.nullcontext
    clock_rows: dict[bool, list[list[float]]] = {True: [], False: []}  # phase times of the timed steps, by half

    def step(communicate: bool, clock: _StepClock | None = None) -> None:
        mark = clock.mark if clock else (lambda: None)
        wrapped.on_train_batch_start()
        mark()
        with contextlib.nullcontext() if communicate else wrapped.no_sync():
            with autocast():
                loss = cross_entropy(wrapped(x), y)
            loss.backward()
            mark()
            wrapped.finish_gradient_synchronization()
        mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark()

    def timed(communicate: bool) -> float:
        clock = _StepClock(device)
        _sync(device)
        align_ranks(device)
        t0 = timeit.default_timer()
        step(communicate, clock)
        _sync(device)
        clock_rows[communicate].append(clock.intervals_ms())
        return timeit.default_timer() - t0

    for _ in range(cfg.warmup):
        step(True)
    step(False)  # warm the no-communication path (allocator, no_sync branches)
    wrapped.stats.reset()
    # Pairs: a step with communication, then the same step inside no_sync(). Host speed on a shared
    # machine drifts over seconds; a pair sees the same conditions, so their difference is the cost of
    # communicating even when the absolute step time wanders.
    comm_times, nocomm_times = [], []
    for _ in range(cfg.steps):
        comm_times.append(timed(True))
        nocomm_times.append(timed(False))
    comm_calls, comm_bytes, comm_host_s = wrapped.stats.calls, wrapped.stats.bytes, wrapped.stats.seconds
    prof = {}
    if cfg.profile:
        prof = _profile_step(step, device, keep_intervals=info.is_main and label in cfg.timeline_variants)
    wrapped.close()
    phases = [statistics.median(col) for col in zip(*clock_rows[True])]
    nocomm_phases = [statistics.median(col) for col in zip(*clock_rows[False])]
    extra_gib = getattr(wrapped, "extra_device_bytes", 0) / 2**30  # symmetric memory: not in the allocator's peak
    return {"extra_device_gib": extra_gib, "comm_step_s": comm_times, "nocomm_step_s": nocomm_times,
            "fwd_bwd_ms": phases[0], "sync_ms": phases[1], "optimizer_ms": phases[2],
            "nocomm_fwd_bwd_ms": nocomm_phases[0], "nocomm_optimizer_ms": nocomm_phases[2],
            "comm_calls_per_step": comm_calls / cfg.steps,
            "comm_bytes_per_step": comm_bytes / cfg.steps, "comm_host_ms": comm_host_s / cfg.steps * 1e3, **prof}


def variant_label(variant: str, bucket_mb: float | None, nccl_max_ctas: int | None = None,
                  compiled: bool = False, high_priority: bool = False, grad_comm_dtype: str | None = None,
                  bound: bool = False, transport: str = "collective", compute_dtype: str | None = None,
                  sm_carveout: int | None = None) -> str:
    """'bucketed-100MB', plus '+compile' for compiled blocks, '@ce' for the copy-engine transport, '@ctasN' for an
    NCCL CTA cap and '@hiprio' for NCCL on high-priority streams, '@bf16-grads' for gradients all-reduced in bf16,
    '@bf16-weights' for bf16 Linear-weight copies (overlap, bucketed), '@smN' for N SMs left free by matmuls while
    buckets are in flight (overlap, bucketed), '@bound' for ranks bound to their own CPU cores (CS336_BIND_CPUS=1)."""
    label = f"bucketed-{bucket_mb:g}MB" if variant == "bucketed" else variant
    return (label + ("+compile" if compiled else "") + ("@ce" if transport == "copy-engine" else "")
            + (f"@ctas{nccl_max_ctas}" if nccl_max_ctas else "")
            + ("@hiprio" if high_priority else "")
            + (f"@{grad_comm_dtype}-grads" if grad_comm_dtype and variant != "none" else "")
            + (f"@{compute_dtype}-weights" if compute_dtype and variant in OURS_OVERLAPPING else "")
            + (f"@sm{sm_carveout}" if sm_carveout and variant in OURS_OVERLAPPING else "")
            + ("@bound" if bound else ""))


def ddp_bench_worker(info: DistInfo, cfg: DDPBenchConfig) -> list[dict]:
    """Every (precision, variant) on this rank: raw per-step times and phase medians."""
    out = []
    model_cfg = get_preset(cfg.preset).replace(context_length=cfg.context_length)
    for precision in cfg.precisions:
        torch.manual_seed(0)
        model = BasicsTransformerLM(**model_cfg.model_kwargs(), attention_backend=cfg.attention,
                                    check_inputs=False, device=info.device)
        if cfg.compile:  # in place: the parameters (and the wrappers' hooks on them) stay the same objects
            for block in model.layers:
                block.compile()
        optimizer = AdamW(model.parameters(), lr=1e-5)
        g = torch.Generator(device="cpu").manual_seed(1000 + info.rank)
        x, y = (torch.randint(0, model_cfg.vocab_size, (cfg.batch_size, cfg.context_length), generator=g)
                .to(info.device) for _ in range(2))
        for variant, bucket_mb, transport in cfg.runs():
            if info.device.type == "cuda":  # each variant's own peak (the model and AdamW state are shared)
                torch.cuda.synchronize(info.device)
                torch.cuda.reset_peak_memory_stats(info.device)
            label = variant_label(variant, bucket_mb, cfg.nccl_max_ctas, cfg.compile, cfg.nccl_high_priority,
                                  cfg.grad_comm_dtype, bind_cpus_requested(), transport, cfg.compute_dtype,
                                  cfg.sm_carveout)
            result = _bench_variant(info, cfg, model, optimizer, x, y, precision, variant, bucket_mb, label,
                                    transport)
            # the allocator's peak plus memory it does not see (the copy-engine transport's symmetric buffers)
            result.update(precision=precision, variant=variant, bucket_size_mb=bucket_mb, label=label,
                          transport=transport,
                          peak_memory_gib=(torch.cuda.max_memory_allocated(info.device) / 2**30
                                           + result["extra_device_gib"] if info.device.type == "cuda" else None),
                          peak_memory_scope="variant")
            out.append(result)
        del model, optimizer
        gc.collect()
        if info.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(info.device)
    return out


def summarize(cfg: DDPBenchConfig, per_rank: list[list[dict]], backend: str) -> list[dict]:
    """One record per (precision, variant): slowest-rank step times, exposed communication, profiler numbers."""
    model_cfg = get_preset(cfg.preset).replace(context_length=cfg.context_length)
    n_params = count_parameters(model_cfg)
    rows = []
    for results in zip(*per_rank):
        r0 = results[0]
        # A synchronised step ends when its slowest rank does; the single-GPU step (no_sync, ranks not coupled)
        # is each rank's own, averaged over ranks ("none" has no coupling in either half: averaged too).
        slowest = statistics.fmean if r0["variant"] == "none" else max
        step = [slowest(ts) for ts in zip(*(r["comm_step_s"] for r in results))]
        nocomm = [statistics.fmean(ts) for ts in zip(*(r["nocomm_step_s"] for r in results))]
        step_ms, nocomm_ms = statistics.median(step) * 1e3, statistics.median(nocomm) * 1e3
        ratios = [s / n for s, n in zip(step, nocomm, strict=True)]
        # The same pairs against the *slower* rank's no_sync() step: a synchronised step cannot end before its
        # slowest rank, so the ranks' own spread (host jitter) is charged to communication in `overhead`; this
        # is the part of the overhead beyond that spread.
        nocomm_slowest = [max(ts) for ts in zip(*(r["nocomm_step_s"] for r in results))]
        ratios_slowest = [s / n for s, n in zip(step, nocomm_slowest, strict=True)]
        row = {k: v for k, v in asdict(cfg).items() if k not in ("variants", "precisions", "bucket_sizes_mb",
                                                                "timeline_variants", "transports")}
        row.update(
            status="ok", backend=backend, precision=r0["precision"], variant=r0["variant"], label=r0["label"],
            bucket_size_mb=r0["bucket_size_mb"], transport=r0["transport"],
            extra_device_gib=r0["extra_device_gib"], n_params=n_params, grad_bytes=4 * n_params,
            step_ms=step_ms, step_std_ms=statistics.stdev(step) * 1e3, step_min_ms=min(step) * 1e3,
            nocomm_step_ms=nocomm_ms, timing=TIMING,
            step_times_ms=[t * 1e3 for t in step], nocomm_times_ms=[t * 1e3 for t in nocomm],
            # paired: step i with communication against step i + 1/2 without (same host conditions)
            exposed_comm_ms=statistics.median((s - n) * 1e3 for s, n in zip(step, nocomm, strict=True)),
            overhead=statistics.median(ratios) - 1.0, overhead_ci95=[r - 1.0 for r in median_ci95(ratios)],
            nocomm_slowest_times_ms=[t * 1e3 for t in nocomm_slowest],
            overhead_vs_slowest=statistics.median(ratios_slowest) - 1.0,
            overhead_vs_slowest_ci95=[r - 1.0 for r in median_ci95(ratios_slowest)],
            fwd_bwd_ms=statistics.fmean(r["fwd_bwd_ms"] for r in results),
            sync_ms=statistics.fmean(r["sync_ms"] for r in results),
            optimizer_ms=statistics.fmean(r["optimizer_ms"] for r in results),
            # the same phases in the no_sync() halves (mean over ranks): where a pair's difference goes
            nocomm_fwd_bwd_ms=statistics.fmean(r["nocomm_fwd_bwd_ms"] for r in results),
            nocomm_optimizer_ms=statistics.fmean(r["nocomm_optimizer_ms"] for r in results),
            comm_calls_per_step=r0["comm_calls_per_step"], comm_bytes_per_step=r0["comm_bytes_per_step"],
            comm_host_ms=statistics.fmean(r["comm_host_ms"] for r in results),
            peak_memory_gib=max((r["peak_memory_gib"] or 0.0) for r in results) or None,
            peak_memory_scope=r0.get("peak_memory_scope"),
            tokens_per_s=cfg.world_size * cfg.batch_size * cfg.context_length / (step_ms * 1e-3),
        )
        for key in ("comm_kernel_ms", "comm_hidden_ms", "compute_kernel_ms", "comm_kernels"):
            if key in r0:
                row[key] = statistics.fmean(r[key] for r in results if key in r)
        if "timeline" in r0:
            row["timeline"] = r0["timeline"]
        rows.append(row)
    return rows


def median_ci95(samples: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap 95% interval of the median of ``samples`` (fixed seed: reproducible)."""
    import numpy as np

    x = np.asarray(samples, dtype=float)
    if len(x) < 2:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def run_ddp_bench(cfg: DDPBenchConfig) -> list[dict] | None:
    """Run under torchrun (one group of ``cfg.world_size``) or spawn local processes; records on rank 0."""
    device_type = cfg.device_type
    per_rank = run_distributed(ddp_bench_worker, cfg.world_size, (cfg,), device_type=device_type,
                               timeout_s=cfg.timeout_s)
    if per_rank is None:
        return None
    return summarize(cfg, per_rank, "nccl" if device_type == "cuda" else "gloo")


def render_timeline(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """Kernel timeline (one profiled step, rank 0) of each row that carries one: compute vs communication."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("timeline")]
    if not rows:
        return None
    fig, axes = plt.subplots(len(rows), 1, figsize=(13, 1.9 * len(rows) + 0.6), squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        tl = r["timeline"]
        for is_comm, y, color in ((False, 1, "tab:blue"), (True, 0, "tab:red")):
            bars = [(s / 1e3, d / 1e3) for s, d, c in zip(tl["start_us"], tl["dur_us"], tl["comm"]) if c == is_comm]
            ax.broken_barh(bars, (y - 0.4, 0.8), color=color, linewidth=0)
        ax.set_yticks([0, 1], ["communication", "compute"])
        hidden = r.get("comm_hidden_ms", 0.0)
        total = r.get("comm_kernel_ms", 0.0)
        ax.set_title(f"{r['label']} ({r['precision']}): step {r['step_ms']:.0f} ms; communication "
                     f"{total:.0f} ms, of which {hidden:.0f} ms overlapped with compute", fontsize=9, loc="left")
        ax.set_xlabel("ms since the step's first kernel")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
