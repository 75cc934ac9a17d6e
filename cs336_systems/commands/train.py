"""``cs336-systems train``: train the LM in one process, or data-parallel / sharded under torchrun.

    torchrun --nproc-per-node 2 -m cs336_systems train --preset small --parallel bucketed --precision bf16
    torchrun --nproc-per-node 4 -m cs336_systems train --preset xl --parallel fsdp --precision bf16
"""

from __future__ import annotations

import argparse

from cs336_systems.parallel import STRATEGIES
from cs336_systems.parallel.ddp import GRAD_COMM_DTYPES
from cs336_systems.records import write_records
from cs336_systems.train import PRECISIONS, TrainConfig, train


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny")
    p.add_argument("--context-length", type=int, default=None, help="default: the preset's")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per rank per micro-batch")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--min-lr", type=float, default=3e-5)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0,
                   help="max global L2 norm of the gradients (over all ranks' shards under fsdp / torch-fsdp2); "
                   "0 disables clipping")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32")
    p.add_argument("--parallel", choices=list(STRATEGIES), default="none", metavar="STRATEGY",
                   help="; ".join(f"{name}: {s.help}" for name, s in STRATEGIES.items())
                   + " (all but 'none' under torchrun; fsdp / torch-fsdp2 gather weights in bf16 under "
                   "--precision bf16 and reduce gradients in fp32)")
    p.add_argument("--bucket-size-mb", type=float, default=None,
                   help="gradient bucket size for bucketed / zero1 (default 25) and torch-ddp / torch-zero "
                   "(default: torch's)")
    p.add_argument("--grad-comm-dtype", choices=list(GRAD_COMM_DTYPES), default=None,
                   help="all-reduce gradients in this dtype (half the bytes of fp32; averages rounded to it) with "
                   "overlap, bucketed, zero1, torch-ddp, torch-zero (default: the gradients' fp32)")
    p.add_argument("--data", default=None, help="uint16 token file (np.memmap); default: synthetic tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--attention", default="reference")
    p.add_argument("--device", default=None)
    p.add_argument("--save", action="store_true", help="write the per-step log to results/train/")
    p.add_argument("--results-dir", default="results")


def run(args: argparse.Namespace) -> int:
    cfg = TrainConfig(preset=args.preset, context_length=args.context_length, batch_size=args.batch_size,
                      grad_accum=args.grad_accum, steps=args.steps, lr=args.lr, min_lr=args.min_lr,
                      warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
                      grad_clip=args.grad_clip or None, precision=args.precision, parallel=args.parallel,
                      bucket_size_mb=args.bucket_size_mb, grad_comm_dtype=args.grad_comm_dtype,
                      data=args.data, seed=args.seed, log_every=args.log_every,
                      attention=args.attention, device=args.device)
    summary = train(cfg)
    import torch.distributed as dist

    is_main = not dist.is_initialized() or dist.get_rank() == 0
    if args.save and is_main:
        rows = [{**summary["config"], "world_size": summary["world_size"], **r} for r in summary["rows"]]
        print(f"records: {write_records('train', rows, args.results_dir)}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0
