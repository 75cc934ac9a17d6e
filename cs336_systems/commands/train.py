"""``cs336-systems train``: train the LM in one process, or data-parallel / sharded under torchrun.

    torchrun --nproc-per-node 2 -m cs336_systems train --preset small --parallel bucketed --precision bf16
    torchrun --nproc-per-node 4 -m cs336_systems train --preset xl --parallel fsdp --precision bf16 \
        --checkpoint-dir runs/xl --checkpoint-every 200 [--resume]

Checkpoints always: without ``--checkpoint-dir`` the run writes to ``runs/train-<UTC start time>/`` (the final
checkpoint and ``metrics.jsonl``). SIGTERM / Ctrl-C: the current step finishes, a checkpoint is written, exit 0.
Speed settings not given (``--attention``, ``--compile``, ``--compile-scope``, ``--optimizer``, ``--loss``,
``--cuda-graph``, ``--residual-dtype``) come from ``cs336_systems.fast.fast_settings`` (fast on CUDA, the
reference path on a CPU) and are printed.
docs/training.md.
"""

from __future__ import annotations

import argparse

from cs336_systems.fast import CUBLAS_WORKSPACES, FFN_KERNELS, RESIDUAL_DTYPES, ROPE_KERNELS
from cs336_systems.parallel import STRATEGIES
from cs336_systems.parallel.ddp import GRAD_COMM_DTYPES
from cs336_systems.records import write_records
from cs336_systems.train import (
    COMPILE_SCOPES,
    LOSSES,
    OPTIMIZERS,
    PRECISIONS,
    TIME_FIELD,
    TrainConfig,
    check_writable,
    train,
)

DEFAULT_CHECKPOINT_DIR = f"runs/train-{TIME_FIELD}"


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
    p.add_argument("--device", default=None)
    p.add_argument("--attention", default=None,
                   help="attention backend name (default: the fast settings': sdpa on CUDA, reference on a CPU)")
    p.add_argument("--compile", nargs="?", const="yes", default=None, choices=["no", "yes"],
                   help="torch.compile the model in place (bare --compile: yes; default: the fast settings': yes on "
                   "CUDA, no on a CPU)")
    p.add_argument("--compile-scope", choices=COMPILE_SCOPES, default=None,
                   help="compile the whole model, or each Transformer block (regional); default: model")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="ours (cs336_basics AdamW) or fused (one pass per step; under bf16 the Linear weights are "
                   "bf16 copies of fp32 masters, which checkpoints store); default: fused on CUDA with --parallel "
                   "none, else ours")
    p.add_argument("--loss", choices=LOSSES, default=None,
                   help="unfused (LM head, then cross-entropy) or fused (chunked, no logits tensor); default: fused "
                   "on CUDA from a vocabulary of 32,768, else unfused")
    p.add_argument("--cuda-graph", choices=["no", "yes"], default=None,
                   help="capture the whole step (forward, backward, clipping, optimizer) once as a CUDA graph and "
                   "replay it: no host work per step; needs CUDA, --optimizer fused and --parallel none (default: "
                   "yes where it applies)")
    p.add_argument("--residual-dtype", choices=RESIDUAL_DTYPES, default=None,
                   help="the residual stream's dtype under --precision bf16: fp32 (autocast's) or bf16 (the fused "
                   "optimizer keeps the token embedding as a bf16 copy of an fp32 master too, as Megatron-LM and "
                   "torchtitan run it); default: bf16 where it applies (bf16, --optimizer fused), else fp32")
    p.add_argument("--rope", choices=ROPE_KERNELS, default=None,
                   help="RoPE's kernel: torch (the model's code, compiled with it) or triton "
                   "(cs336_systems.fused.rope; CUDA); default: triton on CUDA")
    p.add_argument("--ffn", choices=FFN_KERNELS, default=None,
                   help="the SwiGLU feed-forward: torch (the model's code, compiled with it) or fused "
                   "(cs336_systems.fused.swiglu: SwiGLU in the matmuls' epilogues; Hopper kernels, bf16); "
                   "default: fused on Hopper under bf16 for steps of >= 8,192 tokens a device at d_model >= 1,600, "
                   "else torch")
    p.add_argument("--cublas-workspace", choices=CUBLAS_WORKSPACES, default=None,
                   help="cuBLAS's workspace: PyTorch's default, or none (no workspace memsets before GEMMs; a "
                   "CUBLAS_WORKSPACE_CONFIG already set is kept); default: none on CUDA")
    p.add_argument("--activation-checkpointing", default="none", metavar="{none,selective,nested,K}",
                   help="recompute activations in backward to save memory (not --checkpoint-dir, which saves the "
                   "run): none; selective (save matmul and attention outputs, recompute the rest); nested; or K = "
                   "checkpoint every K blocks (default: none)")
    p.add_argument("--num-kv-heads", type=int, default=None, metavar="H",
                   help="key/value heads, a divisor of the preset's heads (grouped-query attention; 1: multi-query); "
                   "default: as many as query heads")
    p.add_argument("--attention-window", type=int, default=None, metavar="W",
                   help="sliding-window attention: each token sees the W most recent tokens, itself included "
                   "(default: all earlier tokens)")
    p.add_argument("--eos-id", type=int, default=None, metavar="ID",
                   help="end-of-document token of the packed data: attention never crosses a document boundary "
                   "(the token belongs to the document it ends; default: sequences attend across documents)")
    p.add_argument("--checkpoint-dir", default=DEFAULT_CHECKPOINT_DIR,
                   help="where checkpoints (step-NNNNNN/, DCP) and metrics.jsonl go; the end of a run and SIGTERM / "
                   f"Ctrl-C always write one; {TIME_FIELD} becomes the UTC start time (default: %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="also checkpoint every N steps (default: only at the end and on SIGTERM / Ctrl-C)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the highest complete checkpoint in --checkpoint-dir (any --parallel, any "
                   "number of ranks)")
    p.add_argument("--export", default=None, metavar="PATH",
                   help="also write the final weights as one state dict (torch.save) that "
                   "BasicsTransformerLM.load_state_dict loads, and PATH.json with the model's arguments")
    p.add_argument("--metrics", default=None, metavar="PATH",
                   help="JSON-lines step log, written as training runs (default: CHECKPOINT_DIR/metrics.jsonl)")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="also write TensorBoard event files to DIR")
    p.add_argument("--save", action="store_true",
                   help="also write the step log as records to RESULTS_DIR/train/ at the end")
    p.add_argument("--results-dir", default="results")


def run(args: argparse.Namespace) -> int:
    cfg = TrainConfig(preset=args.preset, context_length=args.context_length, batch_size=args.batch_size,
                      grad_accum=args.grad_accum, steps=args.steps, lr=args.lr, min_lr=args.min_lr,
                      warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
                      grad_clip=args.grad_clip or None, precision=args.precision, parallel=args.parallel,
                      bucket_size_mb=args.bucket_size_mb, grad_comm_dtype=args.grad_comm_dtype,
                      data=args.data, seed=args.seed, log_every=args.log_every, attention=args.attention,
                      compile=None if args.compile is None else args.compile == "yes",
                      compile_scope=args.compile_scope, optimizer=args.optimizer, loss=args.loss,
                      cuda_graph=None if args.cuda_graph is None else args.cuda_graph == "yes",
                      residual_dtype=args.residual_dtype, rope=args.rope, ffn=args.ffn,
                      cublas_workspace=args.cublas_workspace,
                      activation_checkpointing=args.activation_checkpointing, num_kv_heads=args.num_kv_heads,
                      attention_window=args.attention_window, eos_id=args.eos_id, device=args.device,
                      checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                      resume=args.resume, export=args.export, metrics=args.metrics, tensorboard=args.tensorboard)
    if args.save:
        check_writable(args.results_dir, "--results-dir", directory=True)
    summary = train(cfg)
    import torch.distributed as dist

    is_main = not dist.is_initialized() or dist.get_rank() == 0
    if args.save and is_main:
        config = {("loss_fn" if k == "loss" else k): v for k, v in summary["config"].items()}  # loss: the value
        rows = [{**config, "world_size": summary["world_size"], **r} for r in summary["rows"]]
        print(f"records: {write_records('train', rows, args.results_dir)}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0
