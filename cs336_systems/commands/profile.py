"""``cs336-systems profile``: kernel summary tables per scope from torch.profiler (nsys_profile)."""

from __future__ import annotations

import argparse
import itertools

import pandas as pd
from tqdm import tqdm

from cs336_systems.bench.e2e import PRECISIONS
from cs336_systems.bench.profile import SCOPES, ProfileConfig, run_profile
from cs336_systems.bench.recording import RecordWriter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", nargs="+", default=["small"])
    p.add_argument("--context-length", nargs="+", type=int, default=[512])
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--scope", nargs="+", choices=SCOPES, default=list(SCOPES))
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--attention", default="reference_nvtx",
                   help="attention backend (reference_nvtx carries the score / softmax / final-matmul ranges)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top-k", type=int, default=12, help="kernel table rows to keep per scope")
    p.add_argument("--trace-dir", default=None, help="write gzipped Chrome traces (chrome://tracing, Perfetto) here")
    p.add_argument("--device", default=None)
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true")


def run(args: argparse.Namespace) -> int:
    configs = [ProfileConfig(preset=p, context_length=c, batch_size=args.batch_size, scope=s, precision=args.precision,
                             attention=args.attention, warmup=args.warmup, steps=args.steps, top_k=args.top_k,
                             device=args.device, trace_dir=args.trace_dir)
               for p, c, s in itertools.product(args.preset, args.context_length, args.scope)]
    writer = RecordWriter("nsys_profile", args.results_dir, configs[0].torch_device, enabled=not args.no_save)
    for cfg in tqdm(configs, desc="profile", unit="config"):
        rec = run_profile(cfg)
        writer.add(rec)
        if rec["status"] != "ok":
            print(f"\n{cfg.preset} ctx {cfg.context_length} {cfg.scope}: {rec['status']}")
            continue
        print(f"\n## {cfg.preset} ctx {cfg.context_length} {cfg.scope} ({cfg.precision}): "
              f"{rec['kernel_ms_per_step']:.2f} ms of kernels per step, GEMM share {rec['gemm_share']:.1%}")
        print(pd.DataFrame(rec["kernels"])[["kernel", "calls_per_step", "total_ms", "avg_us", "pct"]]
              .assign(kernel=lambda d: d.kernel.str.slice(0, 80)).to_markdown(index=False, floatfmt=".3g"))
    if writer.path:
        print(f"\nrecords: {writer.path}")
    return 0
