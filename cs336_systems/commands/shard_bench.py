"""``cs336-systems shard-bench``: memory (after construction, before and after the optimizer step) and
step time of optimizer-state sharding and FSDP vs unsharded DDP, the single-GPU step, PyTorch's
ZeroRedundancyOptimizer and FSDP2 (optimizer_state_sharding_accounting, fsdp_accounting).

    torchrun --nproc-per-node 2 -m cs336_systems shard-bench --preset xl --precision bf16 --trace-dir out/
    torchrun --nproc-per-node 2 -m cs336_systems shard-bench --variants none fsdp --rounds 3   # drift-robust ratio
    torchrun --nproc-per-node 2 -m cs336_systems shard-bench --variants none fsdp --pair-with-none  # paired ratio
    cs336-systems shard-bench --device cpu        # spawns 2 gloo processes itself (preset tiny on a CPU)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd
import torch

from cs336_systems.bench.harness import markdown_table
from cs336_systems.bench.shard import OPTIMIZERS, PRECISIONS, PROBLEM, VARIANTS, ShardBenchConfig, run_shard_bench
from cs336_systems.commands.ddp_bench import CPU_CONTEXT_LENGTH, CPU_PRESET, GPU_PRESET, world_size_from
from cs336_systems.parallel.process_group import under_torchrun
from cs336_systems.records import write_records
from cs336_systems.report.plots import render_timeline

TABLE_COLUMNS = ["variant", "status", "step_ms", "ratio_to_none", "ratio_to_none_round_median", "pair_ratio",
                 "init_peak_gib",
                 "pre_step_peak_gib", "post_step_peak_gib", "post_step_alloc_gib", "params_gib", "grads_gib",
                 "optimizer_state_gib", "forward_saved_gib", "comm_kernel_ms", "comm_hidden_ms", "compute_idle_ms"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None, help=f"default: {GPU_PRESET} on GPUs, {CPU_PRESET} on a CPU")
    p.add_argument("--context-length", type=int, default=None,
                   help=f"default: 512 on GPUs, {CPU_CONTEXT_LENGTH} on a CPU")
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--profile", nargs="*", choices=VARIANTS, default=["fsdp", "torch-fsdp2"],
                   help="variants with one profiled step (kernel timeline, Chrome trace)")
    p.add_argument("--world-size", type=int, default=None, help="default: torchrun's WORLD_SIZE, else 2")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5,
                   help="timed steps (device synchronize at both ends of each step only): step time")
    p.add_argument("--memory-steps", type=int, default=2,
                   help="steps after the timed ones, synchronised per phase: the memory counters (max over them)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the whole variant list this many times in turn, each variant built afresh; step "
                        "times are pooled, per-round medians and per-round ratios to 'none' recorded (host-speed "
                        "drift cancels within a round); memory steps and the profile in round 1 only")
    p.add_argument("--pair-with-none", action="store_true",
                   help="time every variant but 'none' in pairs with a plain single-GPU model built as 'none' is "
                        "(a step of the variant, then one of the plain model, in the same process): pair_ratio is "
                        "the median of the per-pair ratios, with a bootstrap 95%% interval. Needs room for a second "
                        "model with AdamW state during the timed steps; dropped before the memory steps")
    p.add_argument("--trace-dir", default=None,
                   help="write Chrome traces (rank 0; every rank with --profile-cpu) and the timeline PNG here")
    p.add_argument("--profile-cpu", action="store_true",
                   help="the profiled step records CPU activity too and every rank writes its trace (needs "
                        "--trace-dir); the kernel metrics are unchanged")
    p.add_argument("--attention", default="reference")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile every Transformer block's forward before wrapping (regional compilation)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="foreach",
                   help="torch.optim.AdamW's implementation in every variant (fused: as its best users run it)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true")


def run(args: argparse.Namespace) -> int:
    world = world_size_from(args)
    on_gpu = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    preset = args.preset or (GPU_PRESET if on_gpu else CPU_PRESET)
    context = args.context_length or (512 if on_gpu else CPU_CONTEXT_LENGTH)
    cfg = ShardBenchConfig(preset=preset, context_length=context, batch_size=args.batch_size,
                           precision=args.precision, variants=tuple(args.variants), world_size=world,
                           warmup=args.warmup, steps=args.steps, memory_steps=args.memory_steps,
                           rounds=args.rounds, pair_with_none=args.pair_with_none,
                           profile=tuple(args.profile or ()), profile_cpu=args.profile_cpu, trace_dir=args.trace_dir,
                           attention=args.attention, device=args.device, timeout_s=args.timeout_s,
                           compile=args.compile, optimizer=args.optimizer)
    if not under_torchrun() or int(os.environ.get("RANK", "0")) == 0:
        print(f"shard-bench: {len(cfg.variants)} variants x {cfg.rounds} round(s), {cfg.precision}, preset {preset}, "
              f"context {context}, batch {args.batch_size}/rank on {world} "
              f"{'GPUs (NCCL)' if on_gpu else 'CPU processes (gloo; memory counters n/a: no allocator)'}; each "
              f"{args.warmup} warm-up, {args.steps} timed{' pairs' if cfg.pair_with_none else ''} and "
              f"{args.memory_steps} memory steps", file=sys.stderr, flush=True)
    rows = run_shard_bench(cfg)
    if rows is None:  # not rank 0
        return 0
    print(markdown_table(rows, TABLE_COLUMNS))
    if cfg.rounds > 1:  # per round: median step and its ratio to 'none' of the same round
        per_round = pd.DataFrame([
            {"variant": r["variant"], **{f"round {k + 1} ms": ms for k, ms in enumerate(r["round_step_ms"])},
             **{f"round {k + 1} / none": q for k, q in enumerate(r.get("round_ratio_to_none", []))}}
            for r in rows if r["status"] == "ok"])
        print(per_round.to_markdown(index=False, floatfmt=".4g"))
    paired = [r for r in rows if r["status"] == "ok" and "pair_ratio" in r]
    if paired:  # per variant: its steps against the plain partner's, pair by pair
        print(pd.DataFrame([{"variant": r["variant"], "pairs": len(r["pair_ratios"]), "step_ms": r["step_ms"],
                             "partner_step_ms": r["partner_step_ms"], "pair_ratio": r["pair_ratio"],
                             "ci95_lo": r["pair_ratio_ci95"][0], "ci95_hi": r["pair_ratio_ci95"][1]}
                            for r in paired]).to_markdown(index=False, floatfmt=".4g"))
    if not args.no_save:
        print(f"records: {write_records(PROBLEM, rows, args.results_dir, device=torch.device(cfg.device_type))}")
    if args.trace_dir:
        timeline_rows = [{**r, "label": r["variant"], "precision": cfg.precision} for r in rows if r.get("timeline")]
        png = Path(args.trace_dir) / f"shard_timeline_{preset}_{cfg.precision}.png"
        path = render_timeline(timeline_rows, png, f"{preset}, {world} ranks, batch {args.batch_size}/rank, "
                               f"context {context}: one profiled step on rank 0")
        if path:
            print(f"timeline: {path}")
    return 0
