"""``cs336-systems memory``: peak memory per configuration, memory_viz snapshots, offline timeline
plots, the largest allocations with their source lines (memory_profiling)."""

from __future__ import annotations

import argparse
import itertools

import pandas as pd
from tqdm import tqdm

from cs336_systems.bench.e2e import PRECISIONS
from cs336_systems.bench.harness import markdown_table
from cs336_systems.bench.memory import MODES, MemoryConfig, run_memory_profile
from cs336_systems.bench.recording import RecordWriter
from cs336_systems.devices import resolve_device

COLUMNS = ["preset", "context_length", "mode", "precision", "status", "peak_memory_gib", "baseline_gib",
           "after_forward_gib", "params_and_optimizer_state_gib", "block_saved_for_backward_mib",
           "residual_stream_mib_fp32"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", nargs="+", default=None,
                   help="default: 2.7B (the handout's size) on a GPU, tiny on a CPU-only machine")
    p.add_argument("--context-length", nargs="+", type=int, default=[128, 256, 512])
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--mode", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--snapshot-dir", default=None,
                   help="write memory_viz pickles (GPU) and timeline PNGs here")
    p.add_argument("--device", default=None)
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.preset is None:
        on_gpu = resolve_device(args.device).type == "cuda"
        args.preset = ["2.7B"] if on_gpu else ["tiny"]
        if not on_gpu:
            print("memory: no GPU: profiling the CPU-sized preset 'tiny' (pass --preset for another)")
    configs = [MemoryConfig(preset=p, context_length=c, batch_size=args.batch_size, mode=m, precision=pr,
                            warmup=args.warmup, device=args.device, snapshot_dir=args.snapshot_dir)
               for p, c, m, pr in itertools.product(args.preset, args.context_length, args.mode, args.precision)]
    writer = RecordWriter("memory_profiling", args.results_dir, configs[0].torch_device, enabled=not args.no_save)
    records = []
    for cfg in tqdm(configs, desc="memory", unit="config"):
        records.append(run_memory_profile(cfg))
        writer.add(records[-1])
    print(markdown_table(records, COLUMNS, ".3g"))
    for rec in records:
        if rec.get("largest_allocations"):
            print(f"\nlargest allocations, {rec['preset']} ctx {rec['context_length']} {rec['mode']} "
                  f"{rec['precision']}:")
            print(pd.DataFrame(rec["largest_allocations"]).to_markdown(index=False, floatfmt=".4g"))
    if writer.path:
        print(f"\nrecords: {writer.path}")
    return 0
