"""Diagnostic: what an overlapped gradient average costs the compute it overlaps, NCCL vs copy engines.

Run under torchrun with 2 processes on a 2-GPU machine (experiments/x2_run_plans/x2.sh plan g, at commit
5b0e5a9; from this folder: ``PYTHONPATH=.:../.. torchrun --nproc-per-node 2 ce_probe.py``). Each rank:

1. times a bf16 GEMM loop shaped like the xl backward's (4096 x 1600 x 6400, 200 launches) alone;
2. the same loop while 2 GiB of fp32 "gradients" (8 buckets of 256 MiB) are averaged on a side stream
   by NCCL all-reduce (``ReduceOp.AVG``) issued at the start;
3. the same with :class:`CopyEngineAllReduce` (symmetric memory, copy engines);
4. each average alone, for its duration (and the copy engines' achieved bandwidth).

Prints medians over repeats on rank 0 (printed, not recorded: the benchmark records are ddp-bench's).
"""

from __future__ import annotations

import os
import statistics

import torch
import torch.distributed as dist
from copy_engine import CopyEngineAllReduce  # this folder (not part of the package)

BUCKETS, BUCKET_ELEMS = 8, 64 * 2**20  # 8 x 256 MiB of fp32


def main(repeats: int = 7) -> None:
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", device_id=dev)
    a = torch.randn(4096, 1600, device=dev, dtype=torch.bfloat16)
    b = torch.randn(1600, 6400, device=dev, dtype=torch.bfloat16)
    nccl_bufs = [torch.randn(BUCKET_ELEMS, device=dev) for _ in range(BUCKETS)]
    ce = CopyEngineAllReduce([BUCKET_ELEMS] * BUCKETS, torch.float32, dev)
    for i in range(BUCKETS):
        ce.view(i).normal_()
    side = torch.cuda.Stream(dev)

    def gemms() -> None:
        for _ in range(200):
            a @ b

    def nccl():  # queue on the side stream; returns the join
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for t in nccl_bufs:
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
        return lambda: torch.cuda.current_stream().wait_stream(side)

    def copy_engine():
        works = [ce.start(i) for i in range(BUCKETS)]
        return lambda: [w.wait() for w in works]

    def timed(comm, compute: bool) -> float:
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        join = comm() if comm else None  # communication first, on its side stream
        if compute:
            gemms()
        if join:
            join()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    cases = {"gemms alone": (None, True), "nccl alone": (nccl, False), "copy-engine alone": (copy_engine, False),
             "gemms + nccl": (nccl, True), "gemms + copy-engine": (copy_engine, True)}
    for args in cases.values():
        timed(*args)  # warm-up (NCCL communicator, Triton compile)
    results = {name: statistics.median(timed(*args) for _ in range(repeats)) for name, args in cases.items()}
    if rank == 0:
        gib = BUCKETS * BUCKET_ELEMS * 4 / 2**30
        for name, ms in results.items():
            print(f"{name:22s} {ms:8.2f} ms")
        print(f"average of {gib:.0f} GiB fp32 over 2 ranks: NCCL {gib / results['nccl alone'] * 1e3:.0f} GiB/s, "
              f"copy engines {gib / results['copy-engine alone'] * 1e3:.0f} GiB/s (algorithm bandwidth)")
        for kind in ("nccl", "copy-engine"):
            extra = results[f"gemms + {kind}"] - results["gemms alone"]
            print(f"GEMMs slowed by {kind}: +{extra:.2f} ms over {results['gemms alone']:.2f} ms "
                  f"({kind} alone {results[f'{kind} alone']:.2f} ms)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
