"""``cs336-systems leaderboard``: the 2026 handout's timing of one full 8B training step (section 9).

    cs336-systems leaderboard                          # full 8b step on this GPU, shortened do_bench
    cs336-systems leaderboard --handout-timing         # do_bench(rep=30_000, warmup=10_000) as the handout
    cs336-systems leaderboard --layers 4 --context-length 8192   # a reduced run
    cs336-systems leaderboard --impl naive ours        # the handout's naive step beside ours (its OOM is a result)
    cs336-systems leaderboard --device cpu             # a miniature of the same code path (CI)
    cs336-systems leaderboard --nproc 2                # data parallel on two GPUs, one sequence each
    torchrun --nproc-per-node 2 -m cs336_systems leaderboard   # the same, started by torchrun
"""

from __future__ import annotations

import argparse
import os

from cs336_systems.leaderboard import (
    HANDOUT_REP_MS,
    HANDOUT_WARMUP_MS,
    IMPLS,
    PARALLEL,
    PROBLEM,
    QUALITY_PROBLEM,
    ROUNDINGS,
)

COLUMNS = ["impl", "nproc", "layers", "context_length", "status", "step_ms", "tokens_per_s", "mfu", "peak_memory_gib",
           "plan_total_gib", "forward_ms", "loss_ms", "backward_ms", "optimizer_ms", "wall_s"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", nargs="+", choices=IMPLS, default=["ours"],
                   help="ours: every fast part we have; naive: the handout's step as written")
    p.add_argument("--layers", type=int, default=None, help="fewer blocks than the preset's 34 (reduced runs)")
    p.add_argument("--context-length", type=int, default=None, help="default: 32,768 (the handout's)")
    p.add_argument("--batch-size", type=int, default=None, help="default: 2 (the handout's)")
    p.add_argument("--attention", default=None, help="attention backend (default: flash_triton; naive: reference)")
    p.add_argument("--handout-timing", action="store_true",
                   help=f"do_bench(warmup={HANDOUT_WARMUP_MS:.0f}, rep={HANDOUT_REP_MS:.0f}) as the handout; "
                   "default: the shortest budgets (do_bench still runs a few steps)")
    p.add_argument("--check-logits", action="store_true",
                   help="first compare our step's logits and loss with the handout model's on the same weights")
    p.add_argument("--quality-check", action="store_true",
                   help="first train the small preset 300 steps with these precisions and with fp32 masters, and "
                   "compare the losses (on a CPU: the tiny preset, a few steps)")
    p.add_argument("--seed", type=int, default=0, help="weights and batch (and the quality guard's data)")
    p.add_argument("--rounding", choices=ROUNDINGS, default="stochastic",
                   help="how the fused AdamW stores bf16 parameters and moments (the quality guard shows why "
                   "stochastic is the default)")
    p.add_argument("--device", default=None, help="cuda (default where there is one) or cpu (a miniature model)")
    p.add_argument("--nproc", type=int, default=None,
                   help="data-parallel processes, one GPU each, the batch split among them (default: torchrun's "
                   "WORLD_SIZE, else 1); without torchrun they are started here (gloo on a CPU)")
    p.add_argument("--parallel", choices=PARALLEL, default="zero1",
                   help="with --nproc > 1: zero1 shards the AdamW state over the processes, bucketed keeps a full "
                   "optimizer on each; both all-reduce the gradients in buckets during backward")
    p.add_argument("--bucket-size-mb", type=float, default=256.0, help="gradient all-reduce bucket size (MiB)")
    p.add_argument("--timeout-s", type=float, default=3600.0,
                   help="with --nproc > 1: the whole group's time limit (a hung rank ends the run)")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true")


def torch_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def run(args: argparse.Namespace) -> int:
    from cs336_systems.devices import resolve_device

    if resolve_device(args.device).type == "cpu":
        # The CPU miniature runs the same Triton kernels through the interpreter; it must be chosen
        # before any kernel module is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from cs336_systems.bench.harness import markdown_table
    from cs336_systems.leaderboard import (
        LeaderboardConfig,
        compare_logits,
        quality_guard,
        run_leaderboard,
        run_leaderboard_ranks,
    )
    from cs336_systems.parallel.process_group import run_distributed, under_torchrun
    from cs336_systems.records import write_records

    torchrun = under_torchrun()
    nproc = args.nproc if args.nproc is not None else int(os.environ["WORLD_SIZE"]) if torchrun else 1
    if torchrun and nproc != int(os.environ["WORLD_SIZE"]):
        raise ValueError(f"leaderboard: --nproc {nproc} but torchrun started {os.environ['WORLD_SIZE']} processes")
    if not args.timeout_s > 0:
        raise ValueError(f"leaderboard: --timeout-s must be positive, got {args.timeout_s}")
    warmup_ms, rep_ms = (HANDOUT_WARMUP_MS, HANDOUT_REP_MS) if args.handout_timing else (1.0, 1.0)
    configs = [LeaderboardConfig(impl=impl, layers=args.layers, context_length=args.context_length,
                                 batch_size=args.batch_size, device=args.device, attention=args.attention,
                                 warmup_ms=warmup_ms, rep_ms=rep_ms, seed=args.seed, rounding=args.rounding,
                                 nproc=nproc, parallel=args.parallel, bucket_size_mb=args.bucket_size_mb)
               for impl in args.impl]
    for cfg in configs:
        cfg.model_config()  # settings are checked before any work
    device = configs[0].torch_device
    if nproc > 1 and device.type == "cuda" and torch_device_count() < nproc and not torchrun:
        raise ValueError(f"leaderboard: --nproc {nproc} needs {nproc} GPUs; this machine has {torch_device_count()}")
    main = not torchrun or int(os.environ["RANK"]) == 0
    if (args.quality_check or args.check_logits) and torchrun and nproc > 1:
        raise ValueError("leaderboard: --quality-check and --check-logits run in one process; start them without "
                         "torchrun (cs336-systems leaderboard --nproc N runs them before starting the group)")
    if args.quality_check:
        on_gpu = device.type == "cuda"
        guard = quality_guard(device, seed=args.seed, stochastic_rounding=args.rounding == "stochastic",
                              **({} if on_gpu else dict(preset="tiny", steps=8, context_length=32)))
        print(f"quality guard: bf16 everything ends {guard['relative_difference']:+.2%} from the fp32-master run")
        if not args.no_save:
            print(f"records: {write_records(QUALITY_PROBLEM, [guard], args.results_dir, device)}")
    check = None
    if args.check_logits:
        check = compare_logits(configs[0])
        print(f"logits: relative error {check['logits_rel_error']:.2e} against the handout model "
              f"(loss {check['loss_ours']:.4f} vs {check['loss_reference']:.4f})")
    if nproc == 1 and not torchrun:
        results = [run_leaderboard(cfg) for cfg in configs]
    else:
        if device.type == "cuda":
            import torch

            torch.cuda.empty_cache()  # what the checks above cached on GPU 0
        per_rank = run_distributed(run_leaderboard_ranks, nproc, (configs,), device_type=device.type,
                                   timeout_s=args.timeout_s)
        if not main:
            return 0
        results = per_rank[0]  # every rank returns the same combined records
    rows = [{**r, **(check or {})} for r in results]
    print(markdown_table(rows, COLUMNS))
    if not args.no_save:
        print(f"records: {write_records(PROBLEM, rows, args.results_dir, device)}")
    return 0
