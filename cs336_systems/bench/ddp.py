"""Data-parallel step benchmark: our four wrappers, PyTorch DDP, and the no-communication baseline
(handout problems ``naive_ddp_benchmarking``, ``minimal_ddp_flat_benchmarking``,
``ddp_overlap_individual_parameters_benchmarking``, ``ddp_bucketed_benchmarking``).

Every rank builds the model once per precision; each variant wraps it in turn (PyTorch DDP last,
its reducer cannot be removed). Timed steps come in pairs (``bench.harness.time_pairs``): a
synchronised step, then the same step inside ``no_sync()``, so the cost of communicating is
measured against the single-device step under the same host conditions. A synchronised step's time
is its slowest rank's; the no-communication step is the mean of the ranks' own. CUDA events split a
step into forward+backward, the wait for gradients and the optimizer; one profiled step gives the
communication kernels' time and how much of it overlapped compute. How each column is defined, and
how the method came to be, is in docs/parallelism.md ("Benchmarks").
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.optimizer import AdamW
from cs336_systems.bench import harness
from cs336_systems.bench.harness import median_ci95
from cs336_systems.configs import count_parameters, get_preset
from cs336_systems.parallel import wrap_model
from cs336_systems.parallel.ddp import GRAD_COMM_DTYPES
from cs336_systems.parallel.process_group import DistInfo, run_distributed
from cs336_systems.records.schema import DDP_PROBLEM

PROBLEM = DDP_PROBLEM  # records of every variant live under one problem id
VARIANTS = ("none", "naive", "flat", "overlap", "bucketed", "torch-ddp")
PRECISIONS = ("fp32", "bf16")
TIMING = "paired-aligned"  # the records' ``timing``: pairs, ranks aligned before every timed step

__all__ = ["PRECISIONS", "PROBLEM", "TIMING", "VARIANTS", "DDPBenchConfig", "median_ci95",
           "run_ddp_bench", "summarize", "variant_label"]


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
    compile: bool = False  # torch.compile each Transformer block in place (regional compilation; fewer launches)
    grad_comm_dtype: str | None = None  # "bf16" / "fp16": overlap, bucketed and torch-ddp all-reduce in it

    def __post_init__(self):
        get_preset(self.preset)
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"ddp-bench: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
        for p in self.precisions:
            if p not in PRECISIONS:
                raise ValueError(f"ddp-bench: unknown precision {p!r}; choose from {', '.join(PRECISIONS)}")
        harness.check_world_and_device("ddp-bench", self.world_size, self.device, min_world=2)
        if self.warmup < 1 or self.steps < 2:
            raise ValueError(f"ddp-bench: need warmup >= 1 and steps >= 2, got {self.warmup}, {self.steps}")
        if self.grad_comm_dtype is not None:
            if self.grad_comm_dtype not in GRAD_COMM_DTYPES:
                raise ValueError(f"ddp-bench: grad_comm_dtype must be one of {', '.join(GRAD_COMM_DTYPES)} or None, "
                                 f"got {self.grad_comm_dtype!r}")
            bad = [v for v in self.variants if v in ("naive", "flat")]
            if bad:
                raise ValueError(f"ddp-bench: grad_comm_dtype applies to overlap, bucketed and torch-ddp; drop {bad}")
        if any(b <= 0 for b in self.bucket_sizes_mb):
            raise ValueError(f"ddp-bench: bucket sizes must be > 0, got {self.bucket_sizes_mb}")

    @property
    def device_type(self) -> str:
        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def runs(self) -> list[tuple[str, float | None]]:
        """(variant, bucket size) in benchmark order; torch DDP last (its reducer is not removable)."""
        out: list[tuple[str, float | None]] = []
        for v in self.variants:
            if v == "bucketed":
                out += [("bucketed", b) for b in self.bucket_sizes_mb]
            elif v != "torch-ddp":
                out.append((v, None))
        if "torch-ddp" in self.variants:
            out.append(("torch-ddp", None))  # its default 25 MB buckets
        return out


def _bench_variant(info: DistInfo, cfg: DDPBenchConfig, model, optimizer, x, y, precision: str, variant: str,
                   bucket_mb: float | None, label: str) -> dict:
    device = info.device
    comm = GRAD_COMM_DTYPES[cfg.grad_comm_dtype] if cfg.grad_comm_dtype and variant != "none" else None
    wrapped = wrap_model(model, variant, bucket_mb, grad_comm_dtype=comm)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16" \
        else contextlib.nullcontext

    def step(communicate: bool, clock: harness.StepClock | None = None) -> harness.StepClock | None:
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
        return clock

    def clocked(communicate: bool):
        return lambda: step(communicate, harness.StepClock(device))

    for _ in range(cfg.warmup):
        step(True)
    step(False)  # warm the no-communication path (allocator, no_sync branches)
    wrapped.stats.reset()
    comm_steps, nocomm_steps = harness.time_pairs(clocked(True), clocked(False), cfg.steps, device)
    comm_calls, comm_bytes, comm_host_s = wrapped.stats.calls, wrapped.stats.bytes, wrapped.stats.seconds
    prof = {}
    if cfg.profile:
        keep = info.is_main and label in cfg.timeline_variants
        prof = harness.profile_comm(lambda: step(True), device, keep_timeline=keep)
        prof = {k: v for k, v in prof.items() if k not in ("allgather_kernel_ms", "allgather_kernels")}
    wrapped.close()
    phases = [statistics.median(col) for col in zip(*(c.intervals_ms() for _, c in comm_steps))]
    nocomm_phases = [statistics.median(col) for col in zip(*(c.intervals_ms() for _, c in nocomm_steps))]
    return {"comm_step_s": [t for t, _ in comm_steps], "nocomm_step_s": [t for t, _ in nocomm_steps],
            "fwd_bwd_ms": phases[0], "sync_ms": phases[1], "optimizer_ms": phases[2],
            "nocomm_fwd_bwd_ms": nocomm_phases[0], "nocomm_optimizer_ms": nocomm_phases[2],
            "comm_calls_per_step": comm_calls / cfg.steps,
            "comm_bytes_per_step": comm_bytes / cfg.steps, "comm_host_ms": comm_host_s / cfg.steps * 1e3, **prof}


def variant_label(variant: str, bucket_mb: float | None, compiled: bool = False,
                  grad_comm_dtype: str | None = None) -> str:
    """'bucketed-100MB', plus '+compile' for compiled blocks and '@bf16-grads' for gradients all-reduced in bf16."""
    label = f"bucketed-{bucket_mb:g}MB" if variant == "bucketed" else variant
    return (label + ("+compile" if compiled else "")
            + (f"@{grad_comm_dtype}-grads" if grad_comm_dtype and variant != "none" else ""))


def ddp_bench_worker(info: DistInfo, cfg: DDPBenchConfig) -> list[dict]:
    """Every (precision, variant) on this rank: raw per-step times and phase medians."""
    out = []
    model_cfg = get_preset(cfg.preset).replace(context_length=cfg.context_length)
    bar = tqdm(total=len(cfg.precisions) * len(cfg.runs()), desc="ddp-bench", unit="run", disable=not info.is_main,
               file=sys.stderr)
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
        for variant, bucket_mb in cfg.runs():
            label = variant_label(variant, bucket_mb, cfg.compile, cfg.grad_comm_dtype)
            bar.set_postfix_str(f"{precision} {label}")
            if info.device.type == "cuda":  # each variant's own peak (the model and AdamW state are shared)
                torch.cuda.synchronize(info.device)
                torch.cuda.reset_peak_memory_stats(info.device)
            result = _bench_variant(info, cfg, model, optimizer, x, y, precision, variant, bucket_mb, label)
            result.update(precision=precision, variant=variant, bucket_size_mb=bucket_mb, label=label,
                          peak_memory_gib=(torch.cuda.max_memory_allocated(info.device) / 2**30
                                           if info.device.type == "cuda" else None),  # no allocator on a CPU
                          peak_memory_scope="variant")
            out.append(result)
            bar.update()
        del model, optimizer
        gc.collect()
        if info.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(info.device)
    bar.close()
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
        # The same pairs against the *slower* rank's no_sync() step: a synchronised step cannot end before its
        # slowest rank, so the ranks' own spread (host jitter) is left out of this one.
        nocomm_slowest = [max(ts) for ts in zip(*(r["nocomm_step_s"] for r in results))]
        pairs, vs_slowest = harness.paired_overhead(step, nocomm), harness.paired_overhead(step, nocomm_slowest)
        spread = harness.summarize(step)
        row = {k: v for k, v in asdict(cfg).items() if k not in ("variants", "precisions", "bucket_sizes_mb",
                                                                "timeline_variants")}
        row.update(
            status="ok", backend=backend, precision=r0["precision"], variant=r0["variant"], label=r0["label"],
            bucket_size_mb=r0["bucket_size_mb"], n_params=n_params, grad_bytes=4 * n_params,
            step_ms=spread["median_ms"], step_std_ms=spread["std_ms"], step_min_ms=spread["min_ms"],
            nocomm_step_ms=statistics.median(nocomm) * 1e3, timing=TIMING,
            step_times_ms=[t * 1e3 for t in step], nocomm_times_ms=[t * 1e3 for t in nocomm],
            # "none" communicates in neither half: there is no exposed communication to measure
            exposed_comm_ms=None if r0["variant"] == "none" else pairs["exposed_ms"],
            overhead=pairs["overhead"], overhead_ci95=pairs["overhead_ci95"],
            nocomm_slowest_times_ms=[t * 1e3 for t in nocomm_slowest],
            overhead_vs_slowest=vs_slowest["overhead"], overhead_vs_slowest_ci95=vs_slowest["overhead_ci95"],
            fwd_bwd_ms=statistics.fmean(r["fwd_bwd_ms"] for r in results),
            sync_ms=statistics.fmean(r["sync_ms"] for r in results),
            optimizer_ms=statistics.fmean(r["optimizer_ms"] for r in results),
            # the same phases in the no_sync() halves (mean over ranks): where a pair's difference goes
            nocomm_fwd_bwd_ms=statistics.fmean(r["nocomm_fwd_bwd_ms"] for r in results),
            nocomm_optimizer_ms=statistics.fmean(r["nocomm_optimizer_ms"] for r in results),
            comm_calls_per_step=r0["comm_calls_per_step"], comm_bytes_per_step=r0["comm_bytes_per_step"],
            comm_host_ms=statistics.fmean(r["comm_host_ms"] for r in results),
            peak_memory_gib=None if r0["peak_memory_gib"] is None else max(r["peak_memory_gib"] for r in results),
            peak_memory_scope=r0.get("peak_memory_scope"),
            tokens_per_s=cfg.world_size * cfg.batch_size * cfg.context_length / (spread["median_ms"] * 1e-3),
        )
        for key in ("comm_kernel_ms", "comm_hidden_ms", "compute_kernel_ms", "comm_kernels"):
            if key in r0:
                row[key] = statistics.fmean(r[key] for r in results if key in r)
        if "timeline" in r0:
            row["timeline"] = r0["timeline"]
        rows.append(row)
    return rows


def run_ddp_bench(cfg: DDPBenchConfig) -> list[dict] | None:
    """Run under torchrun (one group of ``cfg.world_size``) or spawn local processes; records on rank 0."""
    device_type = cfg.device_type
    per_rank = run_distributed(ddp_bench_worker, cfg.world_size, (cfg,), device_type=device_type,
                               timeout_s=cfg.timeout_s)
    if per_rank is None:
        return None
    return summarize(cfg, per_rank, "nccl" if device_type == "cuda" else "gloo")
