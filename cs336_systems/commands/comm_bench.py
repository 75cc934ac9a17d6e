"""``cs336-systems comm-bench``: all-reduce latency and bandwidth (distributed_communication_single_node).

Without torchrun it starts the processes itself, one group per world size (single node): gloo on CPU
for every requested size of group, NCCL for those the GPUs can hold. Under torchrun
(``torchrun --nproc-per-node N -m cs336_systems comm-bench --backend nccl``) it measures that one
group of N. Records go to ``results/distributed_communication_single_node/``.
"""

from __future__ import annotations

import argparse

import torch
from tqdm import tqdm

from cs336_systems.bench.comm import DEFAULT_SIZES_MB, PROBLEM, CommBenchConfig, run_comm_bench
from cs336_systems.bench.harness import markdown_table
from cs336_systems.parallel.process_group import under_torchrun
from cs336_systems.records import write_records

TABLE_COLUMNS = ["backend", "world_size", "size_mb", "latency_median_ms", "latency_std_ms", "algbw_gbps",
                 "busbw_gbps"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", nargs="+", choices=["gloo", "nccl"], default=None,
                   help="default: gloo, plus nccl when there are >= 2 GPUs")
    p.add_argument("--world-sizes", nargs="+", type=int, default=[2, 4, 6],
                   help="group sizes to launch (ignored under torchrun); NCCL sizes above the GPU count are skipped")
    p.add_argument("--sizes-mb", nargs="+", type=float, default=list(DEFAULT_SIZES_MB))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--timeout-s", type=float, default=600.0, help="a group that runs longer is killed")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--no-save", action="store_true", help="print the table only")


def configs_from_args(args: argparse.Namespace) -> list[CommBenchConfig]:
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backends = args.backend or (["gloo", "nccl"] if n_gpus >= 2 else ["gloo"])
    if under_torchrun():
        import os

        world_sizes = [int(os.environ["WORLD_SIZE"])]
    else:
        world_sizes = args.world_sizes
    configs = []
    for backend in backends:
        for ws in world_sizes:
            if backend == "nccl" and ws > n_gpus and not under_torchrun():
                print(f"comm-bench: skipping NCCL with {ws} processes: {n_gpus} GPUs")
                continue
            configs.append(CommBenchConfig(backend=backend, world_size=ws, sizes_mb=tuple(args.sizes_mb),
                                           warmup=args.warmup, iters=args.iters, timeout_s=args.timeout_s))
    if not configs:
        raise ValueError("comm-bench: nothing to run (NCCL needs at least 2 GPUs)")
    return configs


def format_table(records: list[dict]) -> str:
    return markdown_table(records, TABLE_COLUMNS)


def run(args: argparse.Namespace) -> int:
    configs = configs_from_args(args)
    records: list[dict] = []
    main = True
    for cfg in tqdm(configs, desc="comm-bench", unit="group", disable=len(configs) < 2):
        rows = run_comm_bench(cfg)
        if rows is None:
            main = False
            continue
        records.extend(rows)
    if not main:
        return 0
    print(format_table(records))
    if not args.no_save:
        for device_type in sorted({r["device_type"] for r in records}):
            rows = [r for r in records if r["device_type"] == device_type]
            path = write_records(PROBLEM, rows, args.results_dir, device=torch.device(device_type))
            print(f"records: {path}")
    return 0
