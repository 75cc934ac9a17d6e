"""``cs336-systems bench``: end-to-end benchmark sweep (benchmarking_script).

``--default`` is the main job of ``make bench``: on a CUDA machine the handout's end-to-end
benchmark (presets small..2.7B, context 512, train step, fp32 and bf16); on a CPU-only machine the
``tiny`` preset for a few steps, which finishes in seconds.
"""

from __future__ import annotations

import argparse
import itertools

import pandas as pd
import torch
from tqdm import tqdm

from cs336_systems.bench.e2e import MODES, PRECISIONS, BenchConfig, run_benchmark
from cs336_systems.configs import HANDOUT_PRESETS
from cs336_systems.records import write_records

TABLE_COLUMNS = ["preset", "context_length", "mode", "precision", "compile", "attention", "status",
                 "forward_mean_ms", "backward_mean_ms", "optimizer_mean_ms", "step_mean_ms", "step_std_ms",
                 "tokens_per_s", "mfu", "peak_memory_gib"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--default", action="store_true",
                   help="the main job: handout presets on CUDA, the tiny preset on CPU (overrides the sweep flags)")
    p.add_argument("--preset", nargs="+", default=["small"], help="one or more presets, or 'all' (handout sizes)")
    p.add_argument("--context-length", nargs="+", type=int, default=[512])
    p.add_argument("--batch-size", type=int, default=None, help="default: the preset's (4)")
    p.add_argument("--mode", nargs="+", choices=MODES, default=["train-step"])
    p.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["fp32"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--attention", nargs="+", default=["reference"], help="attention backend name(s)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--results-dir", default="results", help="where records are written")
    p.add_argument("--no-save", action="store_true", help="print the table only")


def configs_from_args(args: argparse.Namespace) -> list[BenchConfig]:
    if args.default:
        if torch.cuda.is_available() and args.device != "cpu":
            grid = itertools.product(HANDOUT_PRESETS, [512], ["train-step"], PRECISIONS)
            return [BenchConfig(preset=p, context_length=c, mode=m, precision=pr, warmup=5, steps=10)
                    for p, c, m, pr in grid]
        return [BenchConfig(preset="tiny", context_length=128, mode=m, precision="fp32", warmup=2, steps=5,
                            device="cpu") for m in MODES]
    presets = list(HANDOUT_PRESETS) if args.preset == ["all"] else args.preset
    grid = itertools.product(presets, args.context_length, args.mode, args.precision, args.attention)
    return [BenchConfig(preset=p, context_length=c, batch_size=args.batch_size, mode=m, precision=pr,
                        compile=args.compile, attention=a, warmup=args.warmup, steps=args.steps, device=args.device)
            for p, c, m, pr, a in grid]


def format_table(records: list[dict]) -> str:
    df = pd.DataFrame(records)
    cols = [c for c in TABLE_COLUMNS if c in df.columns]
    return df[cols].to_markdown(index=False, floatfmt=".3g")


def run(args: argparse.Namespace) -> int:
    configs = configs_from_args(args)
    records = []
    for cfg in tqdm(configs, desc="bench", unit="config", disable=len(configs) < 2):
        records.append(run_benchmark(cfg))
    print(format_table(records))
    if not args.no_save:
        path = write_records("benchmarking_script", records, args.results_dir, device=configs[0].torch_device)
        print(f"\nrecords: {path}")
    return 0
