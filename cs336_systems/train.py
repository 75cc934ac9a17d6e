"""Training driver: our Transformer LM, one process or data-parallel under torchrun.

    cs336-systems train --preset tiny --steps 50                                  # one process
    torchrun --nproc-per-node 2 -m cs336_systems train --preset xl --parallel bucketed --precision bf16

Data: synthetic tokens by default, or a flat ``uint16`` token file read through ``np.memmap``. Either
way step ``s`` draws one *global* batch of ``batch_size * world_size`` sequences from an RNG seeded by
``(seed, s)`` and rank ``r`` takes rows ``[r * batch_size, (r + 1) * batch_size)``: ranks see disjoint
data, and a run on N ranks sees exactly the batches a one-process run with N times the batch size
sees (tests check the two train the same weights). The data position of a run is therefore its step.

Each logged step prints the loss (averaged over ranks), tokens/s over all ranks, MFU (model FLOPs
per second per device over the device's measured matmul peak) and peak memory, and appends the same
record to a JSON-lines file (and TensorBoard) as it happens.

Checkpoints (``cs336_systems.checkpoint``, DCP): every ``checkpoint_every`` steps, at the end, and when
SIGTERM / SIGINT arrives (the current step finishes, every rank stops after the same step and saves, the
run returns normally). ``resume`` continues from the highest complete checkpoint, under any strategy and
world size. Settings are validated before anything is allocated (:func:`preflight`). docs/training.md.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import os
import signal
import tempfile
import threading
import timeit
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from cs336_basics.attention import get_attention_backend, supports_attention_extras
from cs336_basics.data import document_ids
from cs336_basics.model import BasicsTransformerLM
from cs336_basics.optimizer import AdamW, get_cosine_lr
from cs336_systems import attention as _attention  # noqa: F401  (registers flash_*: train works uninstalled too)
from cs336_systems import checkpoint
from cs336_systems.bench.checkpointing import apply_activation_checkpointing, own_state_names, parse_checkpoint_spec
from cs336_systems.bench.e2e import autocast_context, compute_dtype
from cs336_systems.configs import (
    ModelConfig,
    activation_lower_bound,
    count_parameters,
    get_preset,
    training_flops_per_token,
)
from cs336_systems.devices import available_bytes, resolve_device
from cs336_systems.fast import (
    CUBLAS_WORKSPACES,
    FFN_KERNELS,
    RESIDUAL_DTYPES,
    ROPE_KERNELS,
    apply_cublas_workspace,
    fast_settings,
)
from cs336_systems.fused.linear_cross_entropy import defer_lm_head, head_loss, linear_cross_entropy
from cs336_systems.parallel import STRATEGIES, WrapOptions, full_state_dict, get_strategy, needs_process_group
from cs336_systems.parallel.ddp import GRAD_COMM_DTYPES
from cs336_systems.parallel.process_group import DistInfo, init_distributed, under_torchrun
from cs336_systems.profiling.timing import matmul_peak_tflops

PRECISIONS = ("fp32", "bf16")
OPTIMIZERS = ("ours", "fused")  # cs336_basics AdamW, or cs336_systems.fused.adamw.FusedAdamW (bench's names)
LOSSES = ("unfused", "fused")  # LM head then cross_entropy, or cs336_systems.fused.linear_cross_entropy
COMPILE_SCOPES = ("model", "blocks")  # model.compile(), or each block's .compile() (regional)
# None in TrainConfig: fast_settings picks
FAST_FIELDS = ("attention", "compile", "compile_scope", "optimizer", "loss", "cuda_graph", "residual_dtype",
               "rope", "ffn", "cublas_workspace")
TIME_FIELD = "{time}"  # in checkpoint_dir: replaced by the run's UTC start time (the same on every rank)
METRICS_FILE = "metrics.jsonl"


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
    precision: str = "fp32"  # fp32, or bf16 autocast (fp32 parameters, or bf16 copies of fp32 masters: optimizer)
    parallel: str = "none"  # a name in parallel.STRATEGIES
    bucket_size_mb: float | None = None  # bucketed / zero1: None = 25; torch-ddp / torch-zero: None = torch's
    grad_comm_dtype: str | None = None  # "bf16" / "fp16": all-reduce gradients in it (DDP strategies); None: fp32
    data: str | None = None  # uint16 token file; None: synthetic tokens
    seed: int = 0
    log_every: int = 1
    device: str | None = None  # None: cuda if available
    # Speed settings; None: cs336_systems.fast.fast_settings picks (CUDA: the fastest measured; CPU: the reference
    # path). An explicit value always wins. resolve_settings() fills them in before training.
    attention: str | None = None  # attention backend name (cs336_basics.attention)
    compile: bool | None = None  # torch.compile in place (state-dict keys unchanged)
    compile_scope: str | None = None  # "model" or "blocks"
    optimizer: str | None = None  # "ours" or "fused" (FusedAdamW: under bf16, bf16 weights with fp32 masters)
    loss: str | None = None  # "unfused" or "fused" (chunked LM head + cross-entropy, no logits tensor)
    cuda_graph: bool | None = None  # the whole step captured once and replayed (CUDA, optimizer fused, no parallel)
    residual_dtype: str | None = None  # "bf16": the token embedding a bf16 copy too (bf16, optimizer fused); "fp32"
    rope: str | None = None  # "torch" (the model's code) or "triton" (cs336_systems.fused.rope, CUDA)
    ffn: str | None = None  # "torch" (the model's code) or "fused" (cs336_systems.fused.swiglu, CUDA)
    cublas_workspace: str | None = None  # "default" or "none" (cs336_systems.fast.apply_cublas_workspace)
    activation_checkpointing: str = "none"  # "none", "selective", "nested" or k (every k blocks); not checkpoint_dir
    num_kv_heads: int | None = None  # key/value heads (grouped-query attention); None: the preset's (= num_heads)
    attention_window: int | None = None  # sliding window: keys per query, itself included; None: the preset's
    eos_id: int | None = None  # end-of-document token: attention stays within each packed document (doc_ids)
    checkpoint_dir: str | None = None  # None: no checkpoints (train() still returns the final weights)
    checkpoint_every: int | None = None  # steps between checkpoints; None: only at the end (and on SIGTERM)
    resume: bool = False  # continue from the highest complete checkpoint in checkpoint_dir
    export: str | None = None  # also write the final weights as one consolidated state dict (torch.save)
    metrics: str | None = None  # JSON-lines step log; None: <checkpoint_dir>/metrics.jsonl (none without a dir)
    tensorboard: str | None = None  # TensorBoard event directory; None: none

    def __post_init__(self):
        get_preset(self.preset)
        if self.parallel not in STRATEGIES:
            raise ValueError(f"train: unknown --parallel {self.parallel!r}; choose from {', '.join(STRATEGIES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train: unknown precision {self.precision!r}; choose from {', '.join(PRECISIONS)}")
        for name in ("steps", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train: --{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("context_length", "batch_size", "checkpoint_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"train: --{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.seed < 0:  # numpy's generator, which draws the batches, takes non-negative seeds only
            raise ValueError(f"train: --seed must be >= 0, got {self.seed}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"train: --lr must be a finite number > 0, got {self.lr}")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"train: --min-lr must be a finite number in [0, --lr = {self.lr}], got {self.min_lr}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"train: --warmup-steps must be in [0, --steps = {self.steps}], got {self.warmup_steps}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"train: --weight-decay must be a finite number >= 0, got {self.weight_decay}")
        if self.grad_clip is not None and not (math.isfinite(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"train: --grad-clip must be a finite number > 0 (0 on the command line: off), "
                             f"got {self.grad_clip}")
        if self.bucket_size_mb is not None:
            if not STRATEGIES[self.parallel].uses_buckets:
                bucketed = ", ".join(n for n, s in STRATEGIES.items() if s.uses_buckets)
                raise ValueError(f"train: --bucket-size-mb has no effect with --parallel {self.parallel}; "
                                 f"it applies to {bucketed}")
            if not self.bucket_size_mb > 0:
                raise ValueError(f"train: bucket_size_mb must be > 0, got {self.bucket_size_mb}")
        if self.grad_comm_dtype is not None and not STRATEGIES[self.parallel].uses_grad_comm_dtype:
            users = ", ".join(n for n, s in STRATEGIES.items() if s.uses_grad_comm_dtype)
            raise ValueError(f"train: --grad-comm-dtype has no effect with --parallel {self.parallel}; "
                             f"it applies to {users}")
        if self.grad_comm_dtype is not None and self.grad_comm_dtype not in GRAD_COMM_DTYPES:
            raise ValueError(f"train: grad_comm_dtype must be one of {', '.join(GRAD_COMM_DTYPES)} or None, "
                             f"got {self.grad_comm_dtype!r}")
        if self.device is not None:
            try:
                kind = torch.device(self.device).type
            except RuntimeError:
                kind = None
            if kind not in ("cpu", "cuda"):
                raise ValueError(f"train: --device {self.device!r} is not a device; use cpu, cuda or cuda:N")
        try:
            self.activation_checkpointing = parse_checkpoint_spec(self.activation_checkpointing)
        except ValueError:
            raise ValueError(f"train: unknown --activation-checkpointing {self.activation_checkpointing!r}; choose "
                             "none, selective, nested or a positive integer k (checkpoint every k blocks)") from None
        layers = get_preset(self.preset).num_layers
        if self.activation_checkpointing.isdigit() and int(self.activation_checkpointing) > layers:
            raise ValueError(f"train: --activation-checkpointing {self.activation_checkpointing} exceeds the "
                             f"{self.preset} preset's {layers} blocks; choose k in 1..{layers}, none, selective or "
                             "nested")
        model_config(self)  # --num-kv-heads, --attention-window against the preset
        vocab = get_preset(self.preset).vocab_size
        if self.eos_id is not None and (isinstance(self.eos_id, bool) or not isinstance(self.eos_id, int)
                                        or not 0 <= self.eos_id < vocab):
            raise ValueError(f"train: --eos-id must be a token id in 0..{vocab - 1} (the {self.preset} preset's "
                             f"vocabulary), got {self.eos_id!r}")
        if self.attention is not None:
            try:
                fn = get_attention_backend(self.attention)
            except ValueError as err:
                raise ValueError(f"train: --attention: {err}") from None
            if self.uses_attention_extras and not supports_attention_extras(fn):
                raise ValueError(f"train: --attention {self.attention} takes no window= / doc_ids= (grouped-query "
                                 "heads, --attention-window, --eos-id); use one that does, e.g. sdpa or reference")
        for name, allowed in (("compile_scope", COMPILE_SCOPES), ("optimizer", OPTIMIZERS), ("loss", LOSSES),
                              ("residual_dtype", RESIDUAL_DTYPES), ("rope", ROPE_KERNELS),
                              ("ffn", FFN_KERNELS), ("cublas_workspace", CUBLAS_WORKSPACES)):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ValueError(f"train: unknown --{name.replace('_', '-')} {value!r}; choose from "
                                 f"{', '.join(allowed)}")
        for name in ("compile", "optimizer", "loss", "activation_checkpointing", "cuda_graph",
                     "residual_dtype", "ffn"):
            reason = unsupported(self.parallel, name, getattr(self, name))
            if reason is not None:
                raise ValueError(f"train: {reason}")
        if self.cuda_graph and self.optimizer not in (None, "fused"):
            raise ValueError(f"train: --cuda-graph yes needs --optimizer fused (the optimizer that reads each step's "
                             f"values from the GPU), not {self.optimizer}")
        if self.residual_dtype == "bf16" and (self.precision != "bf16" or self.optimizer not in (None, "fused")):
            raise ValueError(f"train: --residual-dtype bf16 keeps the token embedding as a bf16 copy in the fused "
                             f"optimizer: it needs --precision bf16 and --optimizer fused (got {self.precision}, "
                             f"{self.optimizer or 'the default optimizer'})")
        if self.resume and (self.checkpoint_dir is None or TIME_FIELD in self.checkpoint_dir):
            raise ValueError("train: --resume needs --checkpoint-dir DIR (the directory of the run to continue)")
        if self.checkpoint_every is not None and self.checkpoint_dir is None:
            raise ValueError("train: --checkpoint-every needs --checkpoint-dir DIR")


    @property
    def uses_attention_extras(self) -> bool:
        """Whether the attention needs a backend that takes ``window=`` / ``doc_ids=`` and grouped k / v."""
        m = model_config(self)
        return m.kv_heads != m.num_heads or m.attention_window is not None or self.eos_id is not None


def model_config(cfg: TrainConfig) -> ModelConfig:
    """The preset of ``cfg`` with its attention options (``ValueError`` naming the flag for a bad one)."""
    preset = get_preset(cfg.preset)
    changes = {k: getattr(cfg, k) for k in ("num_kv_heads", "attention_window") if getattr(cfg, k) is not None}
    try:
        return preset.replace(**changes) if changes else preset
    except ValueError as err:
        flag = "--num-kv-heads" if "num_kv_heads" in str(err) else "--attention-window"
        raise ValueError(f"train: {flag}: {str(err).removeprefix('ModelConfig.')} (preset {cfg.preset})") from None


def unsupported(parallel: str, name: str, value) -> str | None:
    """Why ``--name value`` does not work with ``--parallel parallel`` (None: it does). The fused optimizer keeps
    its bf16 copies and fp32 masters in one process's parameters, which no strategy synchronises or shards; the
    fused loss reads ``lm_head.weight`` outside the wrapped forward, which sharding strategies free between
    uses; compiling a sharded model was not tested; our fsdp frees gathered weights that activation checkpointing's
    recomputation needs (it fails in backward)."""
    sharded = STRATEGIES[parallel].shards_gradients
    if name == "activation_checkpointing" and value != "none" and parallel == "fsdp":
        others = ", ".join(n for n in STRATEGIES if n != "fsdp")
        return (f"--activation-checkpointing {value} does not work with --parallel fsdp (its recomputation needs "
                f"weights our FSDP has freed); use torch-fsdp2 or another of {others}")
    if name == "optimizer" and value == "fused" and parallel != "none":
        return f"--optimizer fused works with --parallel none only, not {parallel}; use --optimizer ours"
    if name == "loss" and value == "fused" and sharded:
        unsharded = ", ".join(n for n, s in STRATEGIES.items() if not s.shards_gradients)
        return f"--loss fused does not work with --parallel {parallel}; use --loss unfused or one of {unsharded}"
    if name == "cuda_graph" and value and parallel != "none":
        return f"--cuda-graph yes works with --parallel none only, not {parallel}; use --cuda-graph no"
    if name == "ffn" and value == "fused" and sharded:
        unsharded = ", ".join(n for n, s in STRATEGIES.items() if not s.shards_gradients)
        return (f"--ffn fused reads the feed-forward's weights outside their modules' forward, which --parallel "
                f"{parallel} gathers; use --ffn torch or one of {unsharded}")
    if name == "residual_dtype" and value == "bf16" and parallel != "none":
        return f"--residual-dtype bf16 works with --parallel none only (--optimizer fused), not {parallel}"
    if name == "compile" and value and sharded:
        unsharded = ", ".join(n for n, s in STRATEGIES.items() if not s.shards_gradients)
        return f"--compile yes is not supported with --parallel {parallel}; use --compile no or one of {unsharded}"
    return None


# where a fast setting does not apply
_SAFE = {"compile": False, "optimizer": "ours", "loss": "unfused", "cuda_graph": False, "residual_dtype": "fp32",
         "ffn": "torch"}


def resolve_settings(cfg: TrainConfig, device: torch.device) -> tuple[TrainConfig, str]:
    """``cfg`` with every speed setting it leaves at None taken from ``fast_settings(device, vocab)`` (a fast
    setting the strategy cannot use becomes the reference one, and the line says why), and one line saying
    what was picked. Explicit settings are kept as given."""
    if cfg.cuda_graph and device.type != "cuda":
        raise ValueError(f"train: --cuda-graph yes needs a CUDA device, got {device}; use --cuda-graph no")
    if cfg.rope == "triton" and device.type != "cuda":
        raise ValueError(f"train: --rope triton needs a CUDA device, got {device}; use --rope torch")
    if cfg.ffn == "fused" and device.type != "cuda":
        raise ValueError(f"train: --ffn fused needs a CUDA device, got {device}; use --ffn torch")
    if cfg.ffn == "fused" and cfg.precision != "bf16":
        raise ValueError(f"train: --ffn fused runs 16-bit kernels: it needs --precision bf16 (got {cfg.precision})")
    preset = get_preset(cfg.preset)
    tokens = (cfg.batch_size or preset.batch_size) * (cfg.context_length or preset.context_length)
    fast = fast_settings(device, preset.vocab_size, preset.d_model, tokens)
    picked, notes = {}, []
    for name in FAST_FIELDS:
        if getattr(cfg, name) is not None:
            continue
        value = getattr(fast, name)
        if unsupported(cfg.parallel, name, value) is not None:
            notes.append(f"{name}={value} not with --parallel {cfg.parallel}")
            value = _SAFE[name]
        if name == "attention" and cfg.uses_attention_extras \
                and not supports_attention_extras(get_attention_backend(value)):
            notes.append(f"attention={value} takes no window= / doc_ids=")
            value = "sdpa"
        if name == "cuda_graph" and value and (picked.get("optimizer") or cfg.optimizer) != "fused":
            notes.append(f"cuda_graph=True not with optimizer={picked.get('optimizer') or cfg.optimizer}")
            value = False
        if name == "residual_dtype" and value == "bf16" and (
                cfg.precision != "bf16" or (picked.get("optimizer") or cfg.optimizer) != "fused"):
            value = "fp32"  # autocast's: bf16 applies only under bf16 with the fused optimizer
        if name == "rope" and value == "triton" and device.type != "cuda":
            value = "torch"  # the kernel is CUDA's
        if name == "ffn" and value == "fused" and (device.type != "cuda" or cfg.precision != "bf16"):
            value = "torch"  # 16-bit kernels, CUDA's
        picked[name] = value
    if not picked:
        return cfg, "train: settings as given (nothing left to fast_settings): " + _describe(cfg)
    line = (f"train: fast settings for {device.type}: " + ", ".join(f"{k}={v}" for k, v in picked.items())
            + (f" ({'; '.join(notes)})" if notes else ""))
    return replace(cfg, **picked), line


def _describe(cfg: TrainConfig) -> str:
    return ", ".join(f"{k}={getattr(cfg, k)}" for k in FAST_FIELDS)


# -- pre-flight: every check that needs the machine or the files, before anything is allocated ---------------

def _planned_device(cfg: TrainConfig, info: DistInfo | None) -> torch.device:
    if info is not None:
        return info.device
    kind = torch.device(cfg.device).type if cfg.device else ("cuda" if torch.cuda.is_available() else "cpu")
    if under_torchrun():
        return torch.device(kind, int(os.environ.get("LOCAL_RANK", "0"))) if kind == "cuda" else torch.device("cpu")
    return torch.device(cfg.device) if cfg.device else torch.device(kind)


def _check_device(cfg: TrainConfig, device: torch.device) -> None:
    if device.type != "cuda":
        return
    if under_torchrun() and cfg.device and torch.device(cfg.device).index is not None:
        raise ValueError(f"train: --device {cfg.device}: under torchrun give a device type (cuda or cpu); "
                         "each rank uses cuda:LOCAL_RANK")
    resolve_device(cfg.device or str(device), "train: --device")


def _world(info: DistInfo | None) -> tuple[int, int]:
    """(world size, ranks on this host)."""
    if info is not None:
        return info.world_size, int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    if not under_torchrun():
        return 1, 1
    try:
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError as err:
        raise ValueError(f"train: WORLD_SIZE / LOCAL_WORLD_SIZE must be integers >= 1 ({err})") from None
    if world < 1 or local < 1:
        raise ValueError(f"train: the world size must be >= 1, got WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local}")
    return world, local


def check_token_file(path: str, vocab_size: int, context_length: int, chunk: int = 1 << 26) -> int:
    """A flat ``uint16`` token file usable for ``context_length``: returns its length in tokens."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"train: --data {path}: no such file")
    if p.is_dir():
        raise ValueError(f"train: --data {path} is a directory; give a flat uint16 token file")
    size = p.stat().st_size
    if size == 0:
        raise ValueError(f"train: --data {path} is empty; give a flat uint16 token file")
    if size % 2:
        raise ValueError(f"train: --data {path} has {size} bytes, not a whole number of uint16 tokens (2 bytes)")
    n = size // 2
    if n < context_length + 1:
        raise ValueError(f"train: --data {path} has {n} tokens, fewer than --context-length + 1 = "
                         f"{context_length + 1}; give a longer file or a shorter --context-length")
    tokens = np.memmap(p, dtype=np.uint16, mode="r")
    for lo in range(0, n, chunk):  # the whole file: one bad id anywhere would stop training later
        top = int(tokens[lo:lo + chunk].max())
        if top >= vocab_size:
            where = lo + int(np.argmax(np.asarray(tokens[lo:lo + chunk]) >= vocab_size))
            raise ValueError(f"train: --data {path} holds token id {top} (first bad id at token {where}), "
                             f"outside the vocabulary of the preset (ids 0..{vocab_size - 1})")
    return n


def check_writable(path: str | Path, flag: str, *, directory: bool) -> None:
    """``path`` (a directory, or a file's folder) exists and is writable, or can be created: its nearest existing
    ancestor is a writable directory that takes a new entry (tried with a temporary folder, removed at once:
    permission bits pass for root, while /proc or a read-only mount refuse), so that a bad output path fails
    before training rather than after it. Leaves nothing behind."""
    p = Path(path)
    if p.exists() and directory != p.is_dir():
        raise ValueError(f"train: {flag} {path} is {'a file' if directory else 'a directory'}; give "
                         f"{'a directory' if directory else 'a file path'}")
    target = p if directory else p.parent
    probe = target
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"train: {flag} {path}: {probe} is a file, so the folder cannot be created")
    if not os.access(probe, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"train: {flag} {path}: {probe if probe != p else p} is not writable")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".cs336-write-probe-", dir=probe))
    except OSError as e:
        raise ValueError(f"train: {flag} {path}: {probe} refuses new entries ({e.strerror})") from None


def memory_lower_bound(cfg: TrainConfig, model_cfg: ModelConfig, T: int, B: int, world: int) -> int:
    """Bytes a rank needs at least: fp32 weights, gradients and AdamW moments (sharded as the strategy shards
    them) and the step's activations (``configs.activation_lower_bound``). A lower bound: a configuration above
    it cannot fit; one below it may still not."""
    n = count_parameters(model_cfg)
    strategy = get_strategy(cfg.parallel)
    if strategy.shards_gradients:
        state = 16 * n / world
    elif cfg.parallel in ("zero1", "torch-zero"):
        state = 8 * n + 8 * n / world
    else:
        state = 16 * n
    return int(state + activation_lower_bound(model_cfg, T, B, precision=cfg.precision, attention=cfg.attention,
                                              loss=cfg.loss,
                                              activation_checkpointing=cfg.activation_checkpointing))


def preflight(cfg: TrainConfig, info: DistInfo | None = None) -> None:
    """Every check of the machine and the files, before any allocation (one-line ``ValueError`` each)."""
    device = _planned_device(cfg, info)
    _check_device(cfg, device)
    world, local_world = _world(info)
    model_cfg = model_config(cfg)
    T = cfg.context_length or model_cfg.context_length
    B = cfg.batch_size or model_cfg.batch_size
    if cfg.data is not None:
        check_token_file(cfg.data, model_cfg.vocab_size, T)
    if cfg.checkpoint_dir is not None:
        check_writable(cfg.checkpoint_dir, "--checkpoint-dir", directory=True)
        if not cfg.resume and TIME_FIELD not in cfg.checkpoint_dir:
            found = checkpoint.latest_checkpoint(cfg.checkpoint_dir)
            if found is not None:
                raise ValueError(f"train: --checkpoint-dir {cfg.checkpoint_dir} already holds {found.name}; add "
                                 "--resume to continue from it, or choose another directory")
    if cfg.metrics is not None:
        check_writable(cfg.metrics, "--metrics", directory=False)
    if cfg.export is not None:
        check_writable(cfg.export, "--export", directory=False)
    if cfg.tensorboard is not None:
        check_writable(cfg.tensorboard, "--tensorboard", directory=True)
        try:
            import tensorboard  # noqa: F401 - torch.utils.tensorboard needs it
        except ImportError:
            raise ValueError("train: --tensorboard needs the tensorboard package (pip install tensorboard)") from None
    need = memory_lower_bound(cfg, model_cfg.replace(context_length=max(T, model_cfg.context_length)), T, B, world)
    avail, where = available_bytes(device, local_world)
    if need > avail:
        raise ValueError(f"train: --context-length {T} x --batch-size {B} ({cfg.preset}, {cfg.precision}, "
                         f"--attention {cfg.attention}, --parallel {cfg.parallel}) needs at least "
                         f"{need / 2**30:,.1f} GiB per rank, but {where} {avail / 2**30:,.1f} GiB free; choose a "
                         "smaller --context-length or --batch-size")


class TokenBatches:
    """Global batches by step, sharded by rank (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, vocab_size: int, context_length: int, batch_size: int, rank: int,
                 world_size: int, device: torch.device):
        self.seed, self.vocab, self.T, self.B = cfg.seed, vocab_size, context_length, batch_size
        self.rank, self.world, self.device, self.micro = rank, world_size, device, cfg.grad_accum
        self.tokens = np.memmap(cfg.data, dtype=np.uint16, mode="r") if cfg.data else None  # checked by preflight

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


class StopSignal:
    """SIGTERM / SIGINT set a flag that the loop reads after each step (a second one acts as usual: the
    previous handler is restored after the first). Only the main thread can install handlers."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signum
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class MetricsLog:
    """Rank 0's step records, appended to a JSON-lines file (flushed per line) and TensorBoard as they come."""

    def __init__(self, path: Path | None, tensorboard: str | None, start_step: int):
        self.file = self.writer = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            kept = []
            if start_step > 0 and path.exists():  # a resumed run: drop the records of steps it will redo
                for line in path.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        if json.loads(line)["step"] < start_step:
                            kept.append(line + "\n")
            self.file = open(path, "w")  # noqa: SIM115 - open for the whole run, closed by close()
            self.file.writelines(kept)
            self.file.flush()
        if tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(tensorboard, purge_step=start_step if start_step > 0 else None)

    def write(self, row: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()
        if self.writer is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.writer.add_scalar(f"train/{k}", v, row["step"])
            self.writer.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.writer is not None:
            self.writer.close()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree(value, rank: int, distributed: bool):
    """Rank 0's ``value`` on every rank."""
    if not distributed:
        return value
    box = [value if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# What makes a checkpoint's weights fit (the last two: None in checkpoints written before they existed).
MODEL_FIELDS = ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta", "num_kv_heads",
                "attention_window")


def train(cfg: TrainConfig, info: DistInfo | None = None, log=print) -> dict:
    """Run ``cfg``; returns a summary (per-step log rows of this run, the final model on the CPU, where the
    last checkpoint went, and the signal that stopped the run early, if any). Speed settings left at None are
    picked by :func:`resolve_settings` (the summary's ``config`` holds what was used)."""
    cfg, settings_line = resolve_settings(cfg, _planned_device(cfg, info))
    apply_cublas_workspace(cfg.cublas_workspace, where="train")  # before the process's first matmul
    preflight(cfg, info)
    distributed = info is not None or under_torchrun() or needs_process_group(cfg.parallel)
    if distributed and info is None:
        if not under_torchrun():
            raise ValueError(f"train: --parallel {cfg.parallel} needs several processes; run it under "
                             "`torchrun --nproc-per-node N -m cs336_systems train ...`")
        info = init_distributed(device_type=torch.device(cfg.device).type if cfg.device else None)
    rank, world = (info.rank, info.world_size) if info else (0, 1)
    device = info.device if info else _planned_device(cfg, None)
    if world > 1 and not needs_process_group(cfg.parallel):
        raise ValueError(f"train: {world} processes but --parallel {cfg.parallel}: ranks would train apart")

    model_cfg = model_config(cfg)
    T = cfg.context_length or model_cfg.context_length
    B = cfg.batch_size or model_cfg.batch_size
    model_cfg = model_cfg.replace(context_length=max(T, model_cfg.context_length))
    ckpt_dir = cfg.checkpoint_dir
    if ckpt_dir is not None and TIME_FIELD in ckpt_dir:
        ckpt_dir = _agree(ckpt_dir.replace(TIME_FIELD, _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")),
                          rank, distributed)
    resume_from = _agree(checkpoint.latest_checkpoint(ckpt_dir) if cfg.resume else None, rank, distributed)
    start_step, notes = 0, []
    if resume_from is not None:
        saved = checkpoint.read_train_state(resume_from)
        start_step = saved["step"]
        mine = {k: getattr(model_cfg, k) for k in MODEL_FIELDS}
        if any(saved["model"].get(k) != v for k, v in mine.items()):
            diff = ", ".join(f"{k} {saved['model'].get(k)} there, {v} here" for k, v in mine.items()
                             if saved["model"].get(k) != v)
            raise ValueError(f"train: checkpoint {resume_from} is of another model ({diff}); resume with "
                             f"--preset {saved['config']['preset']}")
        for k in ("seed", "steps", "lr", "min_lr", "warmup_steps", "data"):
            if saved["config"].get(k) != getattr(cfg, k):
                notes.append(f"{k} {saved['config'].get(k)} -> {getattr(cfg, k)}")
        for k in ("precision", "optimizer", "loss", "activation_checkpointing", "eos_id", "residual_dtype", "rope",
                  "ffn"):
            # keys of later versions
            if k in saved["config"] and saved["config"][k] != getattr(cfg, k):
                notes.append(f"{k} {saved['config'][k]} -> {getattr(cfg, k)}")
        if saved["global_batch"] != B * cfg.grad_accum * world:
            notes.append(f"global batch {saved['global_batch']} -> {B * cfg.grad_accum * world} sequences")

    torch.manual_seed(cfg.seed)  # every rank builds the same init; the wrapper broadcasts rank 0's anyway
    model = BasicsTransformerLM(**model_cfg.model_kwargs(), attention_backend=cfg.attention,
                                check_inputs=cfg.data is not None, device=device)
    n_params = sum(p.numel() for p in model.parameters())  # before FSDP replaces weights by shards
    if cfg.rope == "triton":
        from cs336_systems.fused.rope import use_triton_rope

        use_triton_rope(model)
    if cfg.ffn == "fused":
        from cs336_systems.fused.swiglu import use_fused_swiglu

        use_fused_swiglu(model)
    if cfg.loss == "fused":
        defer_lm_head(model)  # model(x) returns the final hidden states; lm_head.weight keeps its key
    # Activation checkpointing wraps the blocks (layers.3.x -> layers.3.blocks.0.x): checkpoints, the export and
    # the returned weights keep the model's own names through own_names (wrapped name -> own name).
    own_names = own_state_names(model, lambda m: apply_activation_checkpointing(m, cfg.activation_checkpointing))
    strategy = get_strategy(cfg.parallel)
    bf16 = cfg.precision == "bf16"
    # FSDP variants gather weights in bf16 under bf16 (autocast would otherwise save full fp32 copies)
    # and reduce gradients in fp32: the average is exact to fp32, at twice the bf16 traffic. The DDP wrappers
    # leave the casts to autocast (BucketedDDP's compute_dtype copies were not faster on 2 H200s and cost 2 bytes
    # per weight: docs/parallelism.md).
    wrapped = strategy.wrap(model, WrapOptions(bucket_size_mb=cfg.bucket_size_mb,
                                               compute_dtype=torch.bfloat16 if bf16 and strategy.shards_gradients
                                               else None,
                                               reduce_dtype=torch.float32 if bf16 else None,
                                               grad_comm_dtype=GRAD_COMM_DTYPES.get(cfg.grad_comm_dtype)))
    if cfg.optimizer == "fused":  # --parallel none only (unsupported()): the wrapper leaves the parameters alone
        from cs336_systems.fused.adamw import FusedAdamW, low_precision_params

        # under bf16 the Linear weights (and with residual_dtype bf16 the token embedding) become bf16 copies of
        # fp32 masters (checkpoints store the masters)
        optimizer = FusedAdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                               compute_dtype=torch.bfloat16 if bf16 else None,
                               low_precision=low_precision_params(model, cfg.residual_dtype) if bf16 else ())
    else:
        optimizer = strategy.make_optimizer(model.parameters(), AdamW, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if resume_from is not None:
        checkpoint.load(resume_from, wrapped, optimizer, rank, distributed, names=own_names)
    if cfg.compile:  # in place, after the optimizer (which may turn weights into bf16): state-dict keys unchanged
        for part in (model.layers if cfg.compile_scope == "blocks" else [model]):
            part.compile()
    # doc_ids (packed documents, --eos-id) reach every block through the wrappers' and the model's forward.
    if cfg.loss == "fused":
        head = model.lm_head.weight
        loss_fn = lambda x, y, d: linear_cross_entropy(wrapped(x, d), head, y)
    else:
        loss_of_logits = head_loss(cfg.compile)
        loss_fn = lambda x, y, d: loss_of_logits(wrapped(x, d), y)
    # Our FSDP has no no_sync(): it reduce-scatters every micro-batch and the shard gradients add up.
    no_sync = getattr(wrapped, "no_sync", contextlib.nullcontext)
    data = TokenBatches(cfg, model_cfg.vocab_size, T, B, rank, world, device)
    autocast = functools.partial(autocast_context, cfg.precision, device)
    tokens_per_step = B * T * cfg.grad_accum * world
    flops_per_step_per_device = training_flops_per_token(model_cfg, T) * B * T * cfg.grad_accum
    peak = matmul_peak_tflops(device.type, compute_dtype(cfg.precision))
    metrics_path = Path(cfg.metrics) if cfg.metrics else (Path(ckpt_dir) / METRICS_FILE if ckpt_dir else None)
    train_state = {"model": {k: getattr(model_cfg, k) for k in MODEL_FIELDS}, "config": asdict(cfg),
                   "global_batch": B * cfg.grad_accum * world}
    if rank == 0:
        log(f"train: {cfg.preset} ({n_params / 1e6:.1f}M params), {world} rank(s) x batch {B} x {cfg.grad_accum} "
            f"micro x context {T}, parallel={cfg.parallel}, {cfg.precision}, device {device}, "
            f"activation checkpointing {cfg.activation_checkpointing}"
            + (f", {model_cfg.kv_heads} key/value heads" if model_cfg.kv_heads != model_cfg.num_heads else "")
            + (f", attention window {model_cfg.attention_window}" if model_cfg.attention_window else "")
            + (f", documents split at token {cfg.eos_id}" if cfg.eos_id is not None else ""))
        log(settings_line)
        if resume_from is not None:
            log(f"resuming from {resume_from} (step {start_step} of {cfg.steps})"
                + (f"; changed since: {'; '.join(notes)}" if notes else ""))
            if start_step >= cfg.steps:
                log(f"nothing to train: the checkpoint is at step {start_step}, --steps is {cfg.steps}")
        elif cfg.resume:
            log(f"resume: no complete checkpoint in {ckpt_dir}; starting from step 0")
        if metrics_path is not None or cfg.tensorboard:
            log("metrics: " + ", ".join(str(p) for p in (metrics_path, cfg.tensorboard) if p))
    metrics = MetricsLog(metrics_path, cfg.tensorboard, start_step) if rank == 0 else None

    def save(step: int) -> Path | None:
        if ckpt_dir is None:
            return None
        path = checkpoint.save(ckpt_dir, step, wrapped, optimizer, train_state, rank, world, distributed,
                               names=own_names)
        if rank == 0:
            log(f"checkpoint: {path}")
        return path

    def run_step(xs, ys, docs, autocast_ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward over the micro-batches (all but the last inside no_sync()), gradient
        synchronisation, clipping and the optimizer: the summed loss and the gradient norm."""
        loss_sum = torch.zeros((), device=device)
        for micro in range(cfg.grad_accum):
            last = micro == cfg.grad_accum - 1
            with (contextlib.nullcontext() if last else no_sync()):
                with autocast_ctx():
                    loss = loss_fn(xs[micro], ys[micro], None if docs is None else docs[micro]) / cfg.grad_accum
                loss.backward()
            loss_sum += loss.detach()
        wrapped.finish_gradient_synchronization()
        grad_norm = strategy.clip_gradients(wrapped, cfg.grad_clip or math.inf)
        optimizer.step()
        return loss_sum, grad_norm

    graphed = None
    if cfg.cuda_graph:
        from cs336_systems.step_graph import CapturedStep

        model.check_inputs = False  # preflight checked the token file; the check would synchronise in the graph
        # autocast's weight-cast cache would hold tensors of the capture past it (CapturedStep's requirements)
        graph_autocast = functools.partial(autocast_context, cfg.precision, device, cache_enabled=False)

        def graph_step(xs: torch.Tensor, ys: torch.Tensor, *docs: torch.Tensor):
            """One whole step on (grad_accum, B, T) inputs, gradients allocated inside the graph."""
            optimizer.zero_grad(set_to_none=True)
            return run_step(xs, ys, docs[0] if docs else None, graph_autocast)

        graphed = CapturedStep(graph_step, optimizer=optimizer, warmup=2)

    rows, last_saved, stopped, done = [], resume_from, None, start_step
    try:
        with StopSignal() as stop:
            for step in range(start_step, cfg.steps):
                _sync(device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                t0 = timeit.default_timer()
                lr = get_cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                wrapped.on_train_batch_start()
                xs, ys = zip(*(data.get(step, micro) for micro in range(cfg.grad_accum)))
                if graphed is not None:
                    xs, ys = torch.stack(xs), torch.stack(ys)
                    loss_sum, grad_norm = graphed(xs, ys, *(() if cfg.eos_id is None
                                                           else (document_ids(xs, cfg.eos_id),)))
                else:
                    docs = None if cfg.eos_id is None else [document_ids(x, cfg.eos_id) for x in xs]
                    loss_sum, grad_norm = run_step(xs, ys, docs, autocast)
                    optimizer.zero_grad(set_to_none=True)
                _sync(device)
                dt = timeit.default_timer() - t0
                # Outside the timed step: the mean loss over ranks and whether any rank got a stop signal
                # (all ranks must stop after the same step to save one checkpoint together).
                flags = torch.stack([loss_sum, torch.tensor(float(stop.received is not None), device=device)])
                if world > 1:
                    dist.all_reduce(flags)
                loss_value, stop_now = flags[0].item() / world, flags[1].item() > 0
                if step % cfg.log_every == 0 or step == cfg.steps - 1 or stop_now:
                    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
                    row = {"step": step, "loss": loss_value, "lr": lr, "grad_norm": grad_norm.item(), "step_s": dt,
                           "tokens_per_s": tokens_per_step / dt, "mfu": flops_per_step_per_device / dt / 1e12 / peak,
                           "peak_memory_gib": memory}
                    rows.append(row)
                    if rank == 0:
                        metrics.write({**row, "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")})
                        mem = f" | mem {memory:.2f} GiB" if memory is not None else ""
                        log(f"step {step:5d}/{cfg.steps} | loss {loss_value:.4f} | lr {lr:.2e} | "
                            f"grad norm {row['grad_norm']:.3f} | {dt * 1e3:8.1f} ms | "
                            f"{row['tokens_per_s']:,.0f} tok/s | MFU {row['mfu']:.1%}{mem}")
                if not math.isfinite(loss_value):
                    raise RuntimeError(f"train: loss became {loss_value} at step {step}")
                done = step + 1
                if stop_now:
                    stopped = signal.Signals(stop.received).name if stop.received is not None else "a peer's signal"
                    break
                if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
                    last_saved = save(done)
            else:
                done = max(start_step, cfg.steps)
            if ckpt_dir is not None and (last_saved is None or last_saved.name != checkpoint.step_dir_name(done)):
                last_saved = save(done)
    finally:
        if metrics is not None:
            metrics.close()
    final_state = full_state_dict(wrapped)  # a collective under sharding
    if hasattr(optimizer, "master_state_dict"):  # FusedAdamW (--parallel none): fp32 masters, not bf16 copies
        final_state = optimizer.master_state_dict(model)
    final_state = {own_names.get(k, k): v.cpu() for k, v in final_state.items()}
    wrapped.close()
    if cfg.export and rank == 0:
        checkpoint.export_state_dict(final_state, cfg.export, model_cfg.model_kwargs())
        log(f"export: {cfg.export} (BasicsTransformerLM(**json.load(open('{cfg.export}.json'))).load_state_dict"
            f"(torch.load('{cfg.export}')))")
    if rank == 0:
        if stopped:
            log(f"stopped by {stopped} after step {done - 1}: "
                + (f"checkpoint {last_saved}; continue with --resume --checkpoint-dir {ckpt_dir}" if last_saved
                   else "no --checkpoint-dir, the weights are in the returned summary only"))
        elif ckpt_dir is None:
            log("final weights: returned by train() only (no --checkpoint-dir)")
        else:
            log(f"final weights: {last_saved} (train further with --resume --checkpoint-dir {ckpt_dir} --steps N)")
    return {"config": asdict(cfg), "world_size": world, "rows": rows, "final_state": final_state,
            "start_step": start_step, "checkpoint": str(last_saved) if last_saved else None,
            "checkpoint_dir": ckpt_dir, "stopped": stopped}
