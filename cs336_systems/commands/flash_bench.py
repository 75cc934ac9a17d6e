"""``cs336-systems flash-bench``: FlashAttention-2 against its peers (flash_benchmarking, leaderboard).

``--only features``: issue 21's shapes (``FEATURE_SHAPES``: grouped-query heads, a sliding window, packed
documents) with ours, FlexAttention and the SDPA backends that apply, forward and forward+backward in one
process on the same inputs (``bench/flash_features.py``); records go to ``results/flash_features``.

``--only shapes``: issue 18's shapes (``MODEL_SHAPES``: the models' attention, both leaderboards, the
per-call floor) with ours and every peer called eagerly, forward and forward+backward, in one process on
the same inputs, and a table of ours / fastest peer.

Default: the handout's sweep (batch 1, causal, sequence lengths 128..65,536, head dims 16..128, bf16 and
fp32; forward, backward, forward+backward) for every implementation, then the leaderboard
configuration (16 heads x 16,384 x 64, bf16, ``torch.compile(apply)``, ``o.sum().backward()``) and the two
other target shapes with every peer timed in the same run. ``--quick``: a small sweep. ``--only``:
just the sweep or just the leaderboard. Records go to ``results/flash_benchmarking`` and
``results/flash_leaderboard``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from cs336_systems.attention.auto import auto_tables
from cs336_systems.bench.flash import (
    DTYPES,
    IMPLEMENTATIONS,
    LEADERBOARD_SHAPES,
    MODEL_SHAPES,
    PEERS,
    auto_table,
    merge_auto_table,
    seq_lens_pow2,
    sweep_shapes,
    time_impl,
    time_interleaved,
    versus_peers,
)
from cs336_systems.bench.flash_features import FEATURE_IMPLS, FEATURE_SHAPES, run_shape, versus_fastest_peer
from cs336_systems.bench.recording import RecordWriter
from cs336_systems.records import write_records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small sweep: seq 1k..16k, d 64 and 128, bf16")
    p.add_argument("--only", choices=["sweep", "leaderboard", "shapes", "features"], default=None)
    p.add_argument("--feature", nargs="+", choices=list(FEATURE_SHAPES), default=list(FEATURE_SHAPES),
                   help="with --only features: which of issue 21's shapes")
    p.add_argument("--feature-impl", nargs="+", choices=FEATURE_IMPLS, default=None,
                   help="with --only features: implementations (default: ours, flex and the SDPA backends that "
                        "apply to the shape)")
    p.add_argument("--feature-rep-ms", type=float, default=300.0,
                   help="do_bench rep per measurement with --only features")
    p.add_argument("--shape", nargs="+", choices=list(MODEL_SHAPES), default=list(MODEL_SHAPES),
                   help="with --only shapes: which of issue 18's shapes")
    p.add_argument("--auto-table", default=None,
                   help="with --only shapes: also write the flash_auto backend's choice table for this GPU model "
                        "into this JSON file (an existing file keeps the other models' tables)")
    p.add_argument("--from-records", default=None, metavar="JSONL",
                   help="with --only shapes --auto-table: write the table from a shapes run's records instead of "
                        "measuring (no GPU needed)")
    p.add_argument("--shape-rep-ms", type=float, default=300.0,
                   help="do_bench rep per implementation and mode with --only shapes, split over the rounds")
    p.add_argument("--shape-rounds", type=int, default=5,
                   help="with --only shapes: interleaved rounds (every implementation once a round, the order "
                        "rotated); the median of the rounds is recorded")
    p.add_argument("--sustained-seconds", type=float, default=0.0,
                   help="with --only shapes: also time each implementation back to back for this many seconds a "
                        "round and mode (no L2 flush): the GPU at its power cap, as in a training step (0: off)")
    p.add_argument("--sustained-rounds", type=int, default=2,
                   help="with --sustained-seconds: interleaved rounds; the median is recorded")
    p.add_argument("--impl", nargs="+", default=list(IMPLEMENTATIONS), choices=IMPLEMENTATIONS)
    p.add_argument("--seq-len", nargs="+", type=int, default=None, help="default: powers of two 128..65536")
    p.add_argument("--head-dim", nargs="+", type=int, default=[16, 32, 64, 128])
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["bf16", "fp32"])
    p.add_argument("--rep-ms", type=float, default=40.0, help="do_bench rep per measurement in the sweep")
    p.add_argument("--lb-rep-ms", type=float, default=2000.0,
                   help="do_bench rep for the leaderboard shapes (the handout uses 10,000)")
    p.add_argument("--lb-shape", nargs="+", choices=list(LEADERBOARD_SHAPES), default=list(LEADERBOARD_SHAPES))
    p.add_argument("--results-dir", default="results")


SHOW = ["impl", "batch", "heads", "seq_len", "head_dim", "dtype", "status", "forward_ms", "backward_ms",
        "forward_backward_ms", "forward_backward_tflops"]


def _table(rows: list[dict], columns: list[str]) -> str:
    df = pd.DataFrame(rows)
    return df[[c for c in columns if c in df.columns]].to_markdown(index=False, floatfmt=".3f")


def run(args: argparse.Namespace) -> int:
    if args.from_records:
        return _table_from_records(args)
    if args.shape_rounds < 1 or args.shape_rep_ms <= 0:
        raise ValueError(f"flash-bench: --shape-rounds must be >= 1 and --shape-rep-ms > 0, got "
                         f"{args.shape_rounds} and {args.shape_rep_ms}")
    for flag, values in (("--seq-len", args.seq_len or []), ("--head-dim", args.head_dim)):
        if any(v < 1 for v in values):
            raise ValueError(f"flash-bench: {flag} takes sizes >= 1, got {' '.join(map(str, values))}")
    for flag in ("rep_ms", "lb_rep_ms", "feature_rep_ms"):
        if not getattr(args, flag) > 0:  # also refuses nan
            raise ValueError(f"flash-bench: --{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    if not 0 <= args.sustained_seconds <= 600 or args.sustained_rounds < 1:
        raise ValueError(f"flash-bench: --sustained-seconds must be in [0, 600] and --sustained-rounds >= 1, got "
                         f"{args.sustained_seconds} and {args.sustained_rounds}")
    if not torch.cuda.is_available():
        raise ValueError("flash-bench needs a CUDA GPU (the Triton kernels and the SDPA peers are GPU code)")
    device = torch.device("cuda")
    if args.only == "shapes":
        return _shapes(args, device)
    if args.only == "features":
        return _features(args, device)
    if args.only != "leaderboard":
        if args.quick:
            shapes = sweep_shapes([1024, 4096, 16384], [64, 128], ["bf16"])
        else:
            shapes = sweep_shapes(args.seq_len or seq_lens_pow2(), args.head_dim, args.dtype)
        rows, group = [], []
        jobs = [(s, impl) for s in shapes for impl in args.impl]
        for i, (shape, impl) in enumerate(tqdm(jobs, desc="flash_benchmarking", unit="cfg")):
            group.append(time_impl(impl, shape, device, rep_ms=args.rep_ms, warmup_ms=min(25.0, args.rep_ms),
                                   sweep=True))
            last = i + 1 == len(jobs)
            if last or (jobs[i + 1][0].dtype, jobs[i + 1][0].head_dim) != (shape.dtype, shape.head_dim):
                # one file per (dtype, head dim): an interrupted sweep keeps what it measured
                path = write_records("flash_benchmarking", group, args.results_dir, device)
                rows.extend(group)
                group = []
        print(_table(rows, SHOW))
        print(f"wrote {path.parent}")
    if args.only != "sweep":
        from cs336_systems.profiling.timing import matmul_peak_tflops

        peak = matmul_peak_tflops("cuda", torch.bfloat16)
        # row by row: a run cut at its time limit keeps what it measured
        rows, writer = [], RecordWriter("flash_leaderboard", args.results_dir, device)
        jobs = [(name, impl) for name in args.lb_shape for impl in args.impl]
        for name, impl in tqdm(jobs, desc="flash_leaderboard", unit="cfg"):
            row = time_impl(impl, LEADERBOARD_SHAPES[name], device, modes=("forward", "forward_backward"),
                            warmup_ms=min(1000.0, args.lb_rep_ms / 4), rep_ms=args.lb_rep_ms,
                            compile_apply=impl != "torch_tiled", backward_of="sum")
            row.update(config=name, matmul_peak_tflops=peak)
            rows.append(row)
            writer.add(row)
        print(f"bf16 matmul peak measured: {peak:.0f} TFLOP/s")
        print(_table(rows, ["config", *SHOW]))
        print(f"wrote {writer.path}")
    return 0


def _table_from_records(args: argparse.Namespace) -> int:
    """``--from-records``: the flash_auto table of a committed ``--only shapes`` run."""
    if args.only != "shapes" or not args.auto_table:
        raise ValueError("flash-bench: --from-records goes with --only shapes --auto-table PATH")
    path = Path(args.from_records)
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"flash-bench: cannot read records from {path}: {err}") from err
    rows = [r for r in rows if r.get("suite") == "issue18_shapes"]
    devices = {r.get("provenance", {}).get("device") for r in rows}
    if not rows or len(devices) != 1 or None in devices:
        raise ValueError(f"flash-bench: {path} holds no records of one --only shapes run (suite issue18_shapes, "
                         "one device)")
    table = auto_table(rows, devices.pop(), str(path))
    _write_auto_table(Path(args.auto_table), table)
    print(f"wrote {args.auto_table} ({len(table['shapes'])} shapes from {path})")
    return 0


def _existing_auto_tables(path: Path) -> dict | None:
    """The table file at ``path`` (None where there is none); a ValueError for a file that is not one, so that a
    run never overwrites it."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # a JSONDecodeError is a ValueError
        raise ValueError(f"flash-bench: --auto-table {path} not overwritten: not a flash_auto table file "
                         f"({err})") from err
    try:
        auto_tables(data)
    except ValueError as err:
        raise ValueError(f"flash-bench: --auto-table {path} not overwritten: {err}") from err
    return data


def _write_auto_table(path: Path, table: dict) -> None:
    """``table`` into the table file at ``path``: the entry of its GPU model replaced or added, the others kept."""
    path.write_text(json.dumps(merge_auto_table(_existing_auto_tables(path), table), indent=1) + "\n")


def _shapes(args: argparse.Namespace, device: torch.device) -> int:
    if args.auto_table:
        _existing_auto_tables(Path(args.auto_table))  # a file it would refuse to write: before measuring
    impls = ["triton", *[p for p in PEERS if p in args.impl]] if "triton" in args.impl else list(args.impl)
    rows, writer = [], RecordWriter("flash_leaderboard", args.results_dir, device)
    for name in tqdm(args.shape, desc="flash_shapes", unit="shape"):
        group = [{**row, "config": name, "suite": "issue18_shapes"}
                 for row in time_interleaved(impls, MODEL_SHAPES[name], device, rounds=args.shape_rounds,
                                             warmup_ms=min(100.0, args.shape_rep_ms / 3), rep_ms=args.shape_rep_ms,
                                             kernel_time=device.type == "cuda", sustained_s=args.sustained_seconds,
                                             sustained_rounds=args.sustained_rounds)]
        for row in group:  # written shape by shape: a run cut at its time limit keeps the shapes it measured
            writer.add(row)
        rows += group
    path = writer.path
    if args.auto_table:
        _write_auto_table(Path(args.auto_table), auto_table(rows, torch.cuda.get_device_name(device), str(path)))
        print(f"wrote {args.auto_table}")
    print(_table(rows, ["config", *SHOW, "forward_backward_kernel_ms"]))
    print(_table(versus_peers(rows), ["config", "forward_ours_ms", "forward_best_peer", "forward_best_ms",
                                      "forward_ratio", "forward_backward_ours_ms", "forward_backward_best_peer",
                                      "forward_backward_best_ms", "forward_backward_ratio"]))
    if device.type == "cuda":
        print(_table(versus_peers(rows, modes=("forward_kernel", "forward_backward_kernel")),
                     ["config", "forward_kernel_ratio", "forward_backward_kernel_best_peer",
                      "forward_backward_kernel_ratio"]))
    if args.sustained_seconds > 0:
        print(_table(versus_peers(rows, modes=("forward_sustained", "forward_backward_sustained")),
                     ["config", "forward_sustained_ratio", "forward_backward_sustained_best_peer",
                      "forward_backward_sustained_ratio"]))
    print(f"wrote {path}")
    return 0


FEATURE_SHOW = ["config", "impl", "role", "status", "visible_fraction", "forward_ms", "forward_backward_ms",
                "forward_backward_tflops", "max_abs_diff"]


def _features(args: argparse.Namespace, device: torch.device) -> int:
    writer = RecordWriter("flash_features", args.results_dir, device)  # as measured: a cut run keeps its rows
    rows = []
    for name in tqdm(args.feature, desc="flash_features", unit="shape"):
        rows += run_shape(name, FEATURE_SHAPES[name], device, args.feature_impl,
                          warmup_ms=min(100.0, args.feature_rep_ms / 3), rep_ms=args.feature_rep_ms,
                          on_row=writer.add)
    print(_table(rows, FEATURE_SHOW))
    print(_table(versus_fastest_peer(rows), ["config", "forward_ours_ms", "forward_best_peer", "forward_best_ms",
                                             "forward_ratio", "forward_backward_ours_ms", "forward_backward_best_peer",
                                             "forward_backward_best_ms", "forward_backward_ratio"]))
    print(f"wrote {writer.path}")
    return 0
