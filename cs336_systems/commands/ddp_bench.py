"""``cs336-systems ddp-bench``: step time and communication of the DDP wrappers vs PyTorch DDP
(naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, ddp_overlap_individual_parameters_benchmarking,
ddp_bucketed_benchmarking).

    torchrun --nproc-per-node 2 -m cs336_systems ddp-bench --preset xl --precision fp32 bf16
    cs336-systems ddp-bench --device cpu        # spawns 2 gloo processes itself (preset tiny on a CPU)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from cs336_systems.bench.ddp import (
    PRECISIONS,
    PROBLEM,
    VARIANTS,
    DDPBenchConfig,
    run_ddp_bench,
)
from cs336_systems.bench.harness import markdown_table
from cs336_systems.parallel.ddp import GRAD_COMM_DTYPES
from cs336_systems.parallel.process_group import under_torchrun
from cs336_systems.records import write_records
from cs336_systems.report.plots import render_timeline

TABLE_COLUMNS = ["precision", "label", "step_ms", "step_std_ms", "nocomm_step_ms", "exposed_comm_ms", "fwd_bwd_ms",
                 "sync_ms", "comm_kernel_ms", "comm_hidden_ms", "compute_kernel_ms", "comm_calls_per_step",
                 "peak_memory_gib"]
GPU_PRESET, CPU_PRESET = "xl", "tiny"  # the handout's size on GPUs; one that a CPU runs in a minute
CPU_CONTEXT_LENGTH = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None, help=f"default: {GPU_PRESET} on GPUs, {CPU_PRESET} on a CPU")
    p.add_argument("--context-length", type=int, default=None,
                   help=f"default: 512 on GPUs, {CPU_CONTEXT_LENGTH} on a CPU")
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--bucket-sizes-mb", nargs="+", type=float, default=[1.0, 10.0, 100.0, 1000.0])
    p.add_argument("--world-size", type=int, default=None, help="default: torchrun's WORLD_SIZE, else 2")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--no-profile", action="store_true", help="skip the profiled step (no kernel-level numbers)")
    p.add_argument("--timeline-variants", nargs="*", default=["naive", "overlap"],
                   help="labels whose kernel timeline is kept (naive, flat, overlap, bucketed-100MB, ...); "
                        "given with no label, none is kept")
    p.add_argument("--trace-dir", default=None, help="also write the timeline PNG here")
    p.add_argument("--attention", default="reference")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each Transformer block (fewer kernel launches: a GPU-bound step); labels get "
                        "'+compile'")
    p.add_argument("--grad-comm-dtype", choices=list(GRAD_COMM_DTYPES), default=None,
                   help="all-reduce gradients in this dtype (overlap, bucketed; torch-ddp through its compression "
                   "hook); default: fp32, the gradients' dtype")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true")


def world_size_from(args: argparse.Namespace) -> int:
    """``--world-size`` as given (validated by the config), else torchrun's, else 2."""
    if args.world_size is not None:
        return args.world_size
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else 2


def run(args: argparse.Namespace) -> int:
    world = world_size_from(args)
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    preset = args.preset or (GPU_PRESET if on_gpu else CPU_PRESET)
    context = args.context_length or (512 if on_gpu else CPU_CONTEXT_LENGTH)
    cfg = DDPBenchConfig(preset=preset, context_length=context, batch_size=args.batch_size,
                         precisions=tuple(args.precision), variants=tuple(args.variants),
                         bucket_sizes_mb=tuple(args.bucket_sizes_mb), world_size=world, warmup=args.warmup,
                         steps=args.steps, profile=not args.no_profile,
                         timeline_variants=tuple(args.timeline_variants), attention=args.attention,
                         device=args.device, timeout_s=args.timeout_s, compile=args.compile,
                         grad_comm_dtype=args.grad_comm_dtype)
    if not under_torchrun() or int(os.environ.get("RANK", "0")) == 0:
        runs = len(cfg.precisions) * len(cfg.runs())
        print(f"ddp-bench: {runs} runs ({', '.join(cfg.precisions)}) of preset {preset}, context {context}, batch "
              f"{args.batch_size}/rank on {world} {'GPUs (NCCL)' if on_gpu else 'CPU processes (gloo)'}; each "
              f"{args.warmup} warm-up steps, {args.steps} timed pairs{', one profiled step' if cfg.profile else ''}",
              file=sys.stderr, flush=True)
    rows = run_ddp_bench(cfg)
    if rows is None:  # not rank 0
        return 0
    print(markdown_table(rows, TABLE_COLUMNS))
    if not args.no_save:
        print(f"records: {write_records(PROBLEM, rows, args.results_dir, device=torch.device(cfg.device_type))}")
    if args.trace_dir:
        for precision in cfg.precisions:
            path = render_timeline([r for r in rows if r["precision"] == precision],
                                   Path(args.trace_dir) / f"ddp_timeline_{preset}_{precision}.png",
                                   f"{preset}, {world} ranks, batch {args.batch_size}/rank, context "
                                   f"{context}: one profiled step on rank 0")
            if path:
                print(f"timeline: {path}")
    return 0
