"""``cs336-systems attention-bench``: attention forward/backward timing and memory over head dims x
sequence lengths, eager vs torch.compile, any registered backend (pytorch_attention, torch_compile a)."""

from __future__ import annotations

import argparse
import itertools

import pandas as pd
import torch
from tqdm import tqdm

import cs336_systems.attention  # noqa: F401  (registers flash_torch / flash_triton without package metadata)
from cs336_systems.bench.attention import (
    HEAD_DIMS,
    SEQ_LENS,
    AttentionBenchConfig,
    memory_accounting,
    run_attention_benchmark,
    saved_bytes_model,
)
from cs336_systems.bench.recording import RecordWriter

COLUMNS = ["backend", "compile", "head_dim", "seq_len", "status", "forward_mean_ms", "backward_mean_ms",
           "memory_before_backward_gib"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", nargs="+", default=["reference"], help="attention backend name(s)")
    p.add_argument("--compile", nargs="?", const="yes", default="both", choices=["no", "yes", "both"])
    p.add_argument("--head-dim", nargs="+", type=int, default=list(HEAD_DIMS))
    p.add_argument("--seq-len", nargs="+", type=int, default=list(SEQ_LENS))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--no-causal", action="store_true", help="full (non-causal) attention")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--device", default=None)
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true")


def run(args: argparse.Namespace) -> int:
    compiles = {"no": [False], "yes": [True], "both": [False, True]}[args.compile]
    configs = [AttentionBenchConfig(backend=b, compile=c, head_dim=d, seq_len=t, batch_size=args.batch_size,
                                    dtype=args.dtype, causal=not args.no_causal, warmup=args.warmup, reps=args.reps,
                                    device=args.device)
               for b, c, d, t in itertools.product(args.backend, compiles, args.head_dim, args.seq_len)]
    writer = RecordWriter("pytorch_attention", args.results_dir, configs[0].torch_device, enabled=not args.no_save)
    records = []
    for cfg in tqdm(configs, desc="attention", unit="config"):
        records.append(run_attention_benchmark(cfg))
        writer.add(records[-1])
    # Memory accounting beside the measurement, for the smallest OOM configuration (else the largest run).
    by_size = sorted(zip(configs, records), key=lambda cr: (cr[0].seq_len, cr[0].head_dim))
    ooms = [cr for cr in by_size if cr[1]["status"] == "OOM"]
    target_cfg, target_rec = (ooms[0] if ooms else by_size[-1])
    model = saved_bytes_model(target_cfg.backend, target_cfg.causal, target_cfg.torch_dtype)
    accounting = {**memory_accounting(target_cfg, model), **model, "status": target_rec["status"],
                  "backend": target_cfg.backend, "compile": target_cfg.compile, "head_dim": target_cfg.head_dim,
                  "seq_len": target_cfg.seq_len, "batch_size": target_cfg.batch_size,
                  "measured_before_backward_gib": target_rec.get("memory_before_backward_gib"),
                  "device_memory_gib": (torch.cuda.get_device_properties(configs[0].torch_device).total_memory
                                        / 2**30 if configs[0].torch_device.type == "cuda" else None)}
    predicted = [memory_accounting(cfg, model)["predicted_before_backward_gib"] for cfg in configs]
    for rec, pred in zip(records, predicted):
        rec["predicted_before_backward_gib"] = pred
    df = pd.DataFrame(records)
    print(df[[c for c in [*COLUMNS, "predicted_before_backward_gib"] if c in df.columns]]
          .to_markdown(index=False, floatfmt=".3g"))
    print(f"\nmemory accounting ({'smallest OOM' if ooms else 'largest'} configuration: d={target_cfg.head_dim}, "
          f"T={target_cfg.seq_len}):")
    print(pd.Series(accounting).to_markdown())
    writer.add({"kind": "memory_accounting", **accounting})
    if writer.path:
        print(f"\nrecords: {writer.path}")
    return 0
