"""``cs336-systems bench``: end-to-end benchmark sweep.

Sweeps presets x context lengths x modes x precisions x compile x attention backends x
checkpointing x optimizers and writes one record per configuration under
``results/<problem>/`` (``--problem``: which handout question the sweep answers). An
out-of-memory configuration is recorded as ``OOM`` and the sweep goes on.

``--default`` is the main job of ``make bench``: on a CUDA machine the handout's end-to-end
benchmark (presets small..2.7B, context 512, train step, fp32 and bf16); on a CPU-only machine the
``tiny`` preset for a few steps, which finishes in seconds.

``--warmup-study`` runs every configuration with 0, 1, 2 and 5 warm-up steps, each in a fresh
interpreter so that nothing is warm from the configuration before it.
"""

from __future__ import annotations

import argparse
import itertools

import pandas as pd
import torch
from tqdm import tqdm

import cs336_systems.attention
import cs336_systems.profiling.nvtx  # noqa: F401  (registers the "reference_nvtx" attention backend)
from cs336_systems.bench.e2e import (
    MODES,
    OPTIMIZERS,
    PRECISIONS,
    BenchConfig,
    run_benchmark,
    run_benchmark_isolated,
)
from cs336_systems.bench.recording import RecordWriter
from cs336_systems.configs import HANDOUT_PRESETS

PROBLEMS = ("benchmarking_script", "benchmarking_mixed_precision", "torch_compile", "gradient_checkpointing",
            "mfu_target")
WARMUP_STUDY = (0, 1, 2, 5)
TABLE_COLUMNS = ["preset", "context_length", "mode", "precision", "compile", "attention", "checkpoint", "optimizer",
                 "warmup", "status", "forward_mean_ms", "backward_mean_ms", "optimizer_mean_ms", "step_mean_ms",
                 "step_std_ms", "tokens_per_s", "mfu", "peak_memory_gib"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--default", action="store_true",
                   help="the main job: handout presets on CUDA, the tiny preset on CPU (overrides the sweep flags)")
    p.add_argument("--preset", nargs="+", default=["small"], help="one or more presets, or 'all' (handout sizes)")
    p.add_argument("--context-length", nargs="+", type=int, default=[512])
    p.add_argument("--batch-size", type=int, default=None, help="default: the preset's (4)")
    p.add_argument("--mode", nargs="+", choices=MODES, default=["train-step"])
    p.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["fp32"])
    p.add_argument("--compile", nargs="?", const="yes", default="no", choices=["no", "yes", "both"],
                   help="torch.compile the model: no (default), yes (bare --compile), or both (eager and compiled)")
    p.add_argument("--compile-scope", choices=["model", "blocks"], default="model",
                   help="compile the whole model, or each Transformer block (regional: much faster to compile)")
    p.add_argument("--attention", nargs="+", default=["reference"], help="attention backend name(s)")
    p.add_argument("--checkpoint", nargs="+", default=["none"],
                   help="activation checkpointing: 'none', 'nested', or k = checkpoint every k blocks")
    p.add_argument("--optimizer", nargs="+", choices=OPTIMIZERS, default=["ours"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-study", action="store_true",
                   help=f"run each configuration with {', '.join(map(str, WARMUP_STUDY))} warm-up steps, each in a "
                        "fresh process (overrides --warmup)")
    p.add_argument("--isolate", action="store_true", help="run each configuration in a fresh process")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--problem", default="benchmarking_script", choices=PROBLEMS,
                   help="the handout problem these records answer (their folder under results/)")
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
    compiles = {"no": [False], "yes": [True], "both": [False, True]}[args.compile]
    warmups = list(WARMUP_STUDY) if args.warmup_study else [args.warmup]
    grid = itertools.product(presets, args.context_length, args.mode, args.precision, compiles, args.attention,
                             args.checkpoint, args.optimizer, warmups)
    return [BenchConfig(preset=p, context_length=c, batch_size=args.batch_size, mode=m, precision=pr, compile=co,
                        compile_scope=args.compile_scope, attention=a, checkpoint=ck, optimizer=o, warmup=w,
                        steps=args.steps, device=args.device)
            for p, c, m, pr, co, a, ck, o, w in grid]


def format_table(records: list[dict]) -> str:
    df = pd.DataFrame(records)
    cols = [c for c in TABLE_COLUMNS if c in df.columns]
    # Drop columns that do not vary and carry defaults, so the table stays readable.
    for col, default in (("checkpoint", "none"), ("optimizer", "ours"), ("compile", False)):
        if col in df.columns and (df[col] == default).all():
            cols.remove(col)
    return df[cols].to_markdown(index=False, floatfmt=".3g")


def run(args: argparse.Namespace) -> int:
    configs = configs_from_args(args)
    isolate = args.isolate or args.warmup_study
    writer = RecordWriter(args.problem, args.results_dir, configs[0].torch_device, enabled=not args.no_save)
    records = []
    for cfg in tqdm(configs, desc="bench", unit="config", disable=len(configs) < 2):
        record = run_benchmark_isolated(cfg) if isolate else run_benchmark(cfg)
        record["study"] = "warmup" if args.warmup_study else "sweep"
        records.append(record)
        writer.add(record)  # on disk as soon as measured
    print(format_table(records))
    if writer.path:
        print(f"\nrecords: {writer.path}")
    return 0
