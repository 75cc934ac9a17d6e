"""``cs336-systems ddp-bench``: step time and communication of the DDP wrappers vs PyTorch DDP
(naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, ddp_overlap_individual_parameters_benchmarking,
ddp_bucketed_benchmarking).

    torchrun --nproc-per-node 2 -m cs336_systems ddp-bench --preset xl --precision fp32 bf16
    cs336-systems ddp-bench --preset tiny --device cpu        # spawns 2 gloo processes itself
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd
import torch

from cs336_systems.bench.ddp import (
    PRECISIONS,
    PROBLEM,
    VARIANTS,
    DDPBenchConfig,
    render_timeline,
    run_ddp_bench,
)
from cs336_systems.parallel.process_group import configure_nccl, under_torchrun
from cs336_systems.records import write_records

TABLE_COLUMNS = ["precision", "label", "step_ms", "step_std_ms", "nocomm_step_ms", "exposed_comm_ms", "fwd_bwd_ms",
                 "sync_ms", "comm_kernel_ms", "comm_hidden_ms", "compute_kernel_ms", "comm_calls_per_step",
                 "peak_memory_gib"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="xl")
    p.add_argument("--context-length", type=int, default=512)
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
    p.add_argument("--nccl-high-priority", action="store_true",
                   help="run NCCL collectives on high-priority CUDA streams (CS336_NCCL_HIGH_PRIORITY=1); labels "
                        "get '@hiprio'")
    p.add_argument("--nccl-max-ctas", type=int, default=None,
                   help="cap NCCL's thread blocks per collective (NCCL_MAX_CTAS), so gradient all-reduces take fewer "
                        "SMs from the backward; labels get '@ctas<N>'")
    p.add_argument("--grad-comm-dtype", choices=["bf16", "fp16"], default=None,
                   help="all-reduce gradients in this dtype (overlap, bucketed; torch-ddp through its compression "
                   "hook); default: fp32, the gradients' dtype")
    p.add_argument("--compute-dtype", choices=["bf16"], default=None,
                   help="overlap and bucketed compute with bf16 copies of the Linear weights (the values autocast "
                        "would use), so gradients enter the buckets in bf16; needs --precision bf16; labels get "
                        "'@bf16-weights'")
    p.add_argument("--sm-carveout", type=int, default=None,
                   help="overlap and bucketed: while buckets are in flight, matmuls leave this many SMs free for "
                        "NCCL (pair with --nccl-max-ctas); labels get '@sm<N>'")
    p.add_argument("--transports", nargs="+", choices=["collective", "copy-engine"], default=["collective"],
                   help="run overlap and bucketed once per transport: 'collective' (the process group's all-reduce) "
                        "and/or 'copy-engine' (symmetric memory, copy engines over NVLink; GPUs only; labels get "
                        "'@ce')")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true")


def run(args: argparse.Namespace) -> int:
    world = args.world_size or (int(os.environ["WORLD_SIZE"]) if under_torchrun() else 2)
    cfg = DDPBenchConfig(preset=args.preset, context_length=args.context_length, batch_size=args.batch_size,
                         precisions=tuple(args.precision), variants=tuple(args.variants),
                         bucket_sizes_mb=tuple(args.bucket_sizes_mb), world_size=world, warmup=args.warmup,
                         steps=args.steps, profile=not args.no_profile,
                         timeline_variants=tuple(args.timeline_variants), attention=args.attention,
                         device=args.device, timeout_s=args.timeout_s, nccl_max_ctas=args.nccl_max_ctas,
                         compile=args.compile, nccl_high_priority=args.nccl_high_priority,
                         grad_comm_dtype=args.grad_comm_dtype, transports=tuple(args.transports),
                         compute_dtype=args.compute_dtype, sm_carveout=args.sm_carveout)
    configure_nccl(cfg.nccl_max_ctas, cfg.nccl_high_priority)  # before any communicator exists
    rows = run_ddp_bench(cfg)
    if rows is None:  # not rank 0
        return 0
    df = pd.DataFrame(rows)
    print(df[[c for c in TABLE_COLUMNS if c in df.columns]].to_markdown(index=False, floatfmt=".4g"))
    if not args.no_save:
        print(f"records: {write_records(PROBLEM, rows, args.results_dir, device=torch.device(cfg.device_type))}")
    if args.trace_dir:
        for precision in cfg.precisions:
            path = render_timeline([r for r in rows if r["precision"] == precision],
                                   Path(args.trace_dir) / f"ddp_timeline_{args.preset}_{precision}.png",
                                   f"{args.preset}, {world} ranks, batch {args.batch_size}/rank, context "
                                   f"{args.context_length}: one profiled step on rank 0")
            if path:
                print(f"timeline: {path}")
    return 0
