"""Training driver: our Transformer LM, one process or data-parallel under torchrun.

    cs336-systems train --preset tiny --steps 50                                  # one process
    torchrun --nproc-per-node 2 -m cs336_systems train --preset xl --parallel bucketed --precision bf16

Data: synthetic tokens by default, or a flat ``uint16`` token file read through ``np.memmap``. Either
way step ``s`` draws one *global* batch of ``batch_size * world_size`` sequences from an RNG seeded by
``(seed, s)`` and rank ``r`` takes rows ``[r * batch_size, (r + 1) * batch_size)``: ranks see disjoint
data, and a run on N ranks sees exactly the batches a one-process run with N times the batch size
sees (tests check the two train the same weights).

Each logged step prints the loss (averaged over ranks), tokens/s over all ranks, MFU (model FLOPs
per second per device over the device's measured matmul peak) and peak memory.
"""

from __future__ import annotations

import contextlib
import math
import timeit
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.optimizer import AdamW, get_cosine_lr
from cs336_systems.configs import get_preset, training_flops_per_token
from cs336_systems.parallel import STRATEGIES, WrapOptions, full_state_dict, get_strategy, needs_process_group
from cs336_systems.parallel.ddp import GRAD_COMM_DTYPES
from cs336_systems.parallel.process_group import DistInfo, init_distributed, under_torchrun
from cs336_systems.profiling.timing import matmul_peak_tflops

PRECISIONS = ("fp32", "bf16")


@dataclass(kw_only=True)
class TrainConfig:
    preset: str = "tiny"
    context_length: int | None = None  # None: the preset's
    batch_size: int | None = None  # sequences per rank per micro-batch; None: the preset's
    grad_accum: int = 1  # micro-batches per step (all but the last inside no_sync())
    steps: int = 20
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 0
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0  # global L2 norm (over all ranks' shards), applied after gradients are averaged
    precision: str = "fp32"  # fp32, or bf16 autocast (parameters and optimizer state stay fp32)
    parallel: str = "none"  # a name in parallel.STRATEGIES
    bucket_size_mb: float | None = None  # bucketed / zero1: None = 25; torch-ddp / torch-zero: None = torch's
    grad_comm_dtype: str | None = None  # "bf16" / "fp16": all-reduce gradients in it (DDP strategies); None: fp32
    data: str | None = None  # uint16 token file; None: synthetic tokens
    seed: int = 0
    log_every: int = 1
    attention: str = "reference"
    device: str | None = None  # None: cuda if available

    def __post_init__(self):
        get_preset(self.preset)
        if self.parallel not in STRATEGIES:
            raise ValueError(f"train: unknown --parallel {self.parallel!r}; choose from {', '.join(STRATEGIES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train: unknown precision {self.precision!r}; choose from {', '.join(PRECISIONS)}")
        for name in ("steps", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("context_length", "batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"train: {name} must be >= 1, got {getattr(self, name)}")
        if self.data is not None and not Path(self.data).is_file():
            raise ValueError(f"train: token file {self.data!r} does not exist")
        if self.bucket_size_mb is not None:
            if not STRATEGIES[self.parallel].uses_buckets:
                bucketed = ", ".join(n for n, s in STRATEGIES.items() if s.uses_buckets)
                raise ValueError(f"train: --bucket-size-mb has no effect with --parallel {self.parallel}; "
                                 f"it applies to {bucketed}")
            if not self.bucket_size_mb > 0:
                raise ValueError(f"train: bucket_size_mb must be > 0, got {self.bucket_size_mb}")
        if self.grad_comm_dtype is not None and not STRATEGIES[self.parallel].uses_grad_comm_dtype:
            users = ", ".join(n for n, s in STRATEGIES.items() if s.uses_grad_comm_dtype)
            raise ValueError(f"train: --grad-comm-dtype has no effect with --parallel {self.parallel}; it applies to "
                             f"{users}")
        if self.grad_comm_dtype is not None and self.grad_comm_dtype not in GRAD_COMM_DTYPES:
            raise ValueError(f"train: grad_comm_dtype must be one of {', '.join(GRAD_COMM_DTYPES)} or None, "
                             f"got {self.grad_comm_dtype!r}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"train: grad_clip must be > 0 or None, got {self.grad_clip}")


class TokenBatches:
    """Global batches by step, sharded by rank (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, vocab_size: int, context_length: int, batch_size: int, rank: int,
                 world_size: int, device: torch.device):
        self.seed, self.vocab, self.T, self.B = cfg.seed, vocab_size, context_length, batch_size
        self.rank, self.world, self.device, self.micro = rank, world_size, device, cfg.grad_accum
        self.tokens = np.memmap(cfg.data, dtype=np.uint16, mode="r") if cfg.data else None
        if self.tokens is not None:
            if len(self.tokens) < context_length + 1:
                raise ValueError(f"train: {cfg.data} has {len(self.tokens)} tokens, fewer than context_length + 1")
            top = int(self.tokens[: min(len(self.tokens), 1 << 20)].max())
            if top >= vocab_size:
                raise ValueError(f"train: {cfg.data} holds token id {top} >= vocab_size {vocab_size}")

    def get(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank's share of micro-batch ``micro`` of step ``step``: inputs and targets, ``(B, T)`` int64."""
        rng = np.random.default_rng((self.seed, step, micro))
        n = self.B * self.world
        if self.tokens is None:
            window = rng.integers(0, self.vocab, size=(n, self.T + 1))
        else:
            starts = rng.integers(0, len(self.tokens) - self.T, size=n)
            window = np.asarray(self.tokens[starts[:, None] + np.arange(self.T + 1)[None, :]])
        mine = torch.from_numpy(window[self.rank * self.B:(self.rank + 1) * self.B].astype(np.int64))
        mine = mine.to(self.device, non_blocking=True)
        return mine[:, :-1], mine[:, 1:]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(cfg: TrainConfig, info: DistInfo | None = None, log=print) -> dict:
    """Run ``cfg``; returns a summary (per-step log rows and the final model on the CPU)."""
    distributed = info is not None or under_torchrun() or needs_process_group(cfg.parallel)
    if distributed and info is None:
        if not under_torchrun():
            raise ValueError(f"train: --parallel {cfg.parallel} needs several processes; run it under "
                             "`torchrun --nproc-per-node N -m cs336_systems train ...`")
        info = init_distributed(device_type=cfg.device)
    rank, world = (info.rank, info.world_size) if info else (0, 1)
    device = info.device if info else torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if world > 1 and not needs_process_group(cfg.parallel):
        raise ValueError(f"train: {world} processes but --parallel {cfg.parallel}: ranks would train apart")

    model_cfg = get_preset(cfg.preset)
    T = cfg.context_length or model_cfg.context_length
    B = cfg.batch_size or model_cfg.batch_size
    model_cfg = model_cfg.replace(context_length=max(T, model_cfg.context_length))
    torch.manual_seed(cfg.seed)  # every rank builds the same init; the wrapper broadcasts rank 0's anyway
    model = BasicsTransformerLM(**model_cfg.model_kwargs(), attention_backend=cfg.attention,
                                check_inputs=cfg.data is not None, device=device)
    n_params = sum(p.numel() for p in model.parameters())  # before FSDP replaces weights by shards
    strategy = get_strategy(cfg.parallel)
    bf16 = cfg.precision == "bf16"
    # FSDP variants gather weights in bf16 under bf16 (autocast would otherwise save full fp32 copies)
    # and reduce gradients in fp32: the average is exact to fp32, at twice the bf16 traffic. The DDP wrappers
    # leave the casts to autocast (bf16 weight copies were not faster on 2 H200s: experiments/bf16_weight_copies).
    wrapped = strategy.wrap(model, WrapOptions(bucket_size_mb=cfg.bucket_size_mb,
                                               compute_dtype=torch.bfloat16 if bf16 and strategy.shards_gradients
                                               else None,
                                               reduce_dtype=torch.float32 if bf16 else None,
                                               grad_comm_dtype=GRAD_COMM_DTYPES.get(cfg.grad_comm_dtype)))
    optimizer = strategy.make_optimizer(model.parameters(), AdamW, lr=cfg.lr, weight_decay=cfg.weight_decay)
    # Our FSDP has no no_sync(): it reduce-scatters every micro-batch and the shard gradients add up.
    no_sync = getattr(wrapped, "no_sync", contextlib.nullcontext)
    data = TokenBatches(cfg, model_cfg.vocab_size, T, B, rank, world, device)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if cfg.precision == "bf16" \
        else contextlib.nullcontext
    tokens_per_step = B * T * cfg.grad_accum * world
    flops_per_step_per_device = training_flops_per_token(model_cfg, T) * B * T * cfg.grad_accum
    peak = matmul_peak_tflops(device.type, torch.bfloat16 if cfg.precision == "bf16" else torch.float32)
    if rank == 0:
        log(f"train: {cfg.preset} ({n_params / 1e6:.1f}M params), {world} rank(s) x batch {B} x {cfg.grad_accum} "
            f"micro x context {T}, parallel={cfg.parallel}, {cfg.precision}, device {device}")

    rows = []
    for step in range(cfg.steps):
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = timeit.default_timer()
        lr = get_cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        wrapped.on_train_batch_start()
        loss_sum = torch.zeros((), device=device)
        for micro in range(cfg.grad_accum):
            x, y = data.get(step, micro)
            last = micro == cfg.grad_accum - 1
            with (contextlib.nullcontext() if last else no_sync()):
                with autocast():
                    loss = cross_entropy(wrapped(x), y) / cfg.grad_accum
                loss.backward()
            loss_sum += loss.detach()
        wrapped.finish_gradient_synchronization()
        if cfg.grad_clip is not None:
            strategy.clip_gradients(wrapped, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        dt = timeit.default_timer() - t0
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            if world > 1:  # a logging-only collective, outside the timed step
                dist.all_reduce(loss_sum)
                loss_sum /= world
            memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            row = {"step": step, "loss": loss_sum.item(), "lr": lr, "step_s": dt,
                   "tokens_per_s": tokens_per_step / dt, "mfu": flops_per_step_per_device / dt / 1e12 / peak,
                   "peak_memory_gib": memory}
            rows.append(row)
            if rank == 0:
                mem = f" | mem {row['peak_memory_gib']:.2f} GiB" if row["peak_memory_gib"] is not None else ""
                log(f"step {step:5d} | loss {row['loss']:.4f} | lr {lr:.2e} | {dt * 1e3:8.1f} ms | "
                    f"{row['tokens_per_s']:,.0f} tok/s | MFU {row['mfu']:.1%}{mem}")
        if not math.isfinite(loss_sum.item()):
            raise RuntimeError(f"train: loss became {loss_sum.item()} at step {step}")
    final_state = {k: v.cpu() for k, v in full_state_dict(wrapped).items()}  # a collective under sharding
    wrapped.close()
    return {"config": asdict(cfg), "world_size": world, "rows": rows, "final_state": final_state}
