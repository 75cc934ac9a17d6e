"""``cs336-systems precision``: the accumulation loops, the toy model's observed autocast dtypes,
and LayerNorm's range problem in fp16 (mixed_precision_accumulation, benchmarking_mixed_precision a/b)."""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from cs336_systems.bench.precision import (
    AUTOCAST_DTYPES,
    accumulation_loops,
    layernorm_range_check,
    observed_autocast_dtypes,
)
from cs336_systems.records import write_records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="where the toy model runs (default: cuda if available)")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true")


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loops = accumulation_loops()
    print("## mixed_precision_accumulation\n")
    print(pd.DataFrame(loops).to_markdown(index=False, floatfmt=".10g"))
    dtypes = [observed_autocast_dtypes(a, device) for a in AUTOCAST_DTYPES]
    print(f"\n## benchmarking_mixed_precision (a): observed dtypes on {device}\n")
    print(pd.DataFrame(dtypes).set_index("autocast").T.to_markdown())
    ln = layernorm_range_check(device)
    print("\n## benchmarking_mixed_precision (b): variance of N(0, 300^2) activations\n")
    print(pd.DataFrame(ln).to_markdown(index=False, floatfmt=".6g"))
    if not args.no_save:
        p1 = write_records("mixed_precision_accumulation", [{"kind": "accumulation", **r} for r in loops],
                           args.results_dir, device="cpu")
        p2 = write_records("benchmarking_mixed_precision",
                           [{"kind": "toy_dtypes", **r} for r in dtypes]
                           + [{"kind": "layernorm_range", **r} for r in ln],
                           args.results_dir, device=device)
        print(f"\nrecords: {p1}\n         {p2}")
    return 0
