"""The 2026 leaderboard (handout section 9): one full training step of the ``8b`` model.

The step is the handout's: ``BasicsTransformerLM`` in bf16 (parameters, gradients and AdamW state all
bf16, as its ``Config`` prescribes), causal, batch 2 x 32,768, forward, cross-entropy (the mean over the
batch's tokens), backward, AdamW. The model's inputs and outputs are unchanged; what we change is how the
step is computed:

- attention through our FlashAttention-2 kernel (``attention`` backend, ``flash_triton`` by default);
- the LM head and the loss fused over vocabulary chunks (no batch x seq x vocab logits);
- the AdamW update in one fused kernel per parameter group;
- activation checkpointing placed by a :class:`MemoryPlan`: every block is checkpointed except as
  many of the last blocks as the device's memory allows.

``impl="naive"`` is the handout's own step at the same size (full logits, reference attention, our
foreach AdamW): on one GPU at full size it runs out of memory, which is recorded as its result.

``nproc > 1`` runs the same step data parallel, one slice of the batch per process (one sequence per GPU
at the handout's batch of 2): ``parallel="zero1"`` (the default) all-reduces the bf16 gradients in buckets
during backward and shards the AdamW state over the ranks (each rank updates the parameters it owns and
broadcasts them); ``"bucketed"`` keeps a full optimizer on every rank. Each rank's loss is the mean over its
tokens, so the averaged gradient is the whole batch's mean loss's gradient, as in one process. The memory
plan is per rank; the step time is the slowest rank's, over the same number of steps on every rank.

The plan is arithmetic on the configuration (bytes per tensor class), printed before any allocation;
a configuration that does not fit is refused with a ``ValueError``. The record puts the measured peak
beside it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from cs336_systems.configs import ModelConfig, count_parameters, get_preset, training_flops_per_token
from cs336_systems.records.schema import LEADERBOARD_2026, LEADERBOARD_2026_QUALITY

PROBLEM, QUALITY_PROBLEM = LEADERBOARD_2026, LEADERBOARD_2026_QUALITY
IMPLS = ("ours", "naive")
PARALLEL = ("zero1", "bucketed")  # data-parallel layouts of --nproc > 1 (cs336_systems.parallel.strategies)
HANDOUT_WARMUP_MS, HANDOUT_REP_MS = 10_000.0, 30_000.0  # the handout's do_bench arguments
GIB = 2**30

# The CPU miniature: the 8b preset's proportions (d_ff / d_model = 2.6875, head dim = d_model / 32 * 4)
# at widths the Triton interpreter runs in seconds.
MINIATURE = dict(vocab_size=1000, context_length=32, d_model=64, d_ff=172, num_layers=3, num_heads=4, batch_size=2)


ROUNDINGS = ("stochastic", "nearest")  # FusedAdamW's rounding of bf16 state (see the quality guard)


@dataclass(kw_only=True)
class LeaderboardConfig:
    """One leaderboard run. ``layers`` / ``context_length`` / ``batch_size`` shrink the model for quick runs."""

    preset: str = "8b"
    layers: int | None = None
    context_length: int | None = None
    batch_size: int | None = None
    device: str | None = None
    impl: str = "ours"
    attention: str | None = None  # None: flash_triton (our kernel); naive: the handout's reference
    warmup_ms: float = 1.0  # do_bench's warm-up and repetition budgets; the handout's are 10,000 / 30,000
    rep_ms: float = 1.0
    memory_margin: float = 0.10  # the plan leaves this fraction of device memory free (the target is 5%)
    seed: int = 0
    rounding: str = "stochastic"  # how ours stores bf16 parameters and AdamW moments: stochastic or nearest
    nproc: int = 1  # data-parallel processes (one GPU each); the batch is split among them
    parallel: str = "zero1"  # the data-parallel layout when nproc > 1 (PARALLEL)
    bucket_size_mb: float = 256.0  # gradient all-reduce buckets (MiB)

    def __post_init__(self):
        if self.impl not in IMPLS:
            raise ValueError(f"leaderboard: impl must be one of {', '.join(IMPLS)}, got {self.impl!r}")
        for name in ("layers", "context_length", "batch_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"leaderboard: {name} must be a positive integer, got {value!r}")
        for name in ("warmup_ms", "rep_ms"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"leaderboard: {name} must be a positive number of milliseconds, got {value!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"leaderboard: seed must be a non-negative integer, got {self.seed!r}")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"leaderboard: rounding must be one of {', '.join(ROUNDINGS)}, got {self.rounding!r}")
        if not 0.0 <= self.memory_margin < 1.0:
            raise ValueError(f"leaderboard: memory_margin must lie in [0, 1), got {self.memory_margin!r}")
        if not isinstance(self.nproc, int) or isinstance(self.nproc, bool) or self.nproc < 1:
            raise ValueError(f"leaderboard: nproc must be a positive integer, got {self.nproc!r}")
        if self.parallel not in PARALLEL:
            raise ValueError(f"leaderboard: parallel must be one of {', '.join(PARALLEL)}, got {self.parallel!r}")
        if not (isinstance(self.bucket_size_mb, int | float) and math.isfinite(self.bucket_size_mb)
                and self.bucket_size_mb > 0):
            raise ValueError(f"leaderboard: bucket_size_mb must be a positive number, got {self.bucket_size_mb!r}")
        if self.nproc > 1 and self.impl != "ours":
            raise ValueError(f"leaderboard: --nproc {self.nproc} runs our step only; the handout's naive step is "
                             "single-process (impl ours)")

    @property
    def torch_device(self) -> torch.device:
        from cs336_systems.devices import resolve_device

        return resolve_device(self.device)

    @property
    def attention_backend(self) -> str:
        return self.attention or ("reference" if self.impl == "naive" else "flash_triton")

    def model_config(self) -> ModelConfig:
        """The preset (the miniature on a CPU) with this run's overrides."""
        cfg = get_preset(self.preset)
        if self.torch_device.type == "cpu":
            cfg = cfg.replace(**MINIATURE)
        overrides = {k: v for k, v in dict(num_layers=self.layers, context_length=self.context_length,
                                           batch_size=self.batch_size).items() if v is not None}
        cfg = cfg.replace(**overrides)
        if cfg.batch_size % self.nproc:
            raise ValueError(f"leaderboard: the batch of {cfg.batch_size} sequences does not split evenly over "
                             f"{self.nproc} processes; use --batch-size a multiple of --nproc")
        return cfg

    def rank_model_config(self) -> ModelConfig:
        """The model configuration one process runs: the batch divided among the ``nproc`` processes."""
        cfg = self.model_config()
        return cfg.replace(batch_size=cfg.batch_size // self.nproc)


# --- the memory plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of each class of tensor, the step's peak they add up to, and how many blocks run without
    checkpointing.

    The peak (``total``) is the larger of two moments, not the sum of every class: at the start of backward
    (the loss's working set beside every block's saved activations; gradients barely begun) and while the
    checkpointed blocks are recomputed (the un-checkpointed blocks' activations already freed; the
    gradients growing as the kept block inputs are consumed, so at most the larger of the two, plus one
    block's recomputation). Parameters, AdamW state and workspaces are there throughout."""

    parameters: int
    gradients: int
    optimizer_state: int
    checkpointed_activations: int  # block inputs kept by the checkpointed blocks
    full_activations: int  # everything the un-checkpointed blocks save for backward
    layer_recompute_peak: int  # one block recomputed plus its gradients, at the backward's peak
    loss_chunks: int  # the fused head + loss working set (or the full logits for the naive step)
    workspace: int  # library workspaces, the RoPE tables, the batch, allocator slack
    uncheckpointed_blocks: int
    device_bytes: int | None  # None: no limit known (CPU)
    block_saved: int = 0  # what one block saves for backward
    block_saved_measured: bool = False  # measured on the device (measure_block_saved_bytes), not estimated

    @property
    def backward_start(self) -> int:
        """Activation-side bytes at the start of backward."""
        return self.checkpointed_activations + self.full_activations + self.loss_chunks

    @property
    def recomputation(self) -> int:
        """Activation-side bytes while the checkpointed blocks are recomputed."""
        return max(self.checkpointed_activations, self.gradients) + self.layer_recompute_peak

    @property
    def total(self) -> int:
        return (self.parameters + self.optimizer_state + self.workspace
                + max(self.backward_start, self.recomputation))

    def rows(self) -> list[tuple[str, float]]:
        return [(f.name.replace("_", " "), getattr(self, f.name) / GIB) for f in dataclasses.fields(self)
                if f.name in _PLAN_TERMS] + [("total", self.total / GIB)]

    def describe(self) -> str:
        lines = ["memory plan (GiB):"] + [f"  {name:<26} {gib:9.2f}" for name, gib in self.rows()]
        moment = "the start of backward" if self.backward_start >= self.recomputation else "the recomputation"
        lines.append(f"  (total: parameters, AdamW state and workspace, plus the activations and gradients at "
                     f"{moment}, the larger of the two moments)")
        if self.device_bytes is not None:
            lines.append(f"  {'device memory':<26} {self.device_bytes / GIB:9.2f}  "
                         f"({self.total / self.device_bytes:.0%} planned)")
        lines.append(f"  one block saves {self.block_saved / GIB:.2f} GiB for backward "
                     f"({'measured' if self.block_saved_measured else 'estimated'}); blocks without "
                     f"checkpointing: {self.uncheckpointed_blocks}")
        return "\n".join(lines)

    def as_record(self) -> dict:
        return {**{f"plan_{name.replace(' ', '_')}_gib": gib for name, gib in self.rows()},
                "plan_uncheckpointed_blocks": self.uncheckpointed_blocks,
                "plan_block_saved_gib": self.block_saved / GIB, "plan_block_saved_measured": self.block_saved_measured}


_PLAN_TERMS = ("parameters", "gradients", "optimizer_state", "checkpointed_activations", "full_activations",
               "layer_recompute_peak", "loss_chunks", "workspace")


def block_saved_bytes_per_token(cfg: ModelConfig) -> int:
    """Bytes one bf16 block saves for backward per token with a flash-style attention kernel (an estimate; the
    run measures it): in bf16 the two norm outputs, q, k, v before and after RoPE, the attention output and the
    output projection's input, SwiGLU's four d_ff-wide tensors; in fp32 the norms' upcast inputs and RoPE's
    upcast q and k halves; the logsumexp per head."""
    d, f = cfg.d_model, cfg.d_ff
    return 2 * (2 * d + 6 * d + 2 * d + 4 * f) + 4 * (2 * d + 2 * d + cfg.num_heads)


def plan_memory(cfg: ModelConfig, *, impl: str = "ours", device_bytes: int | None = None,
                margin: float = 0.10, loss_chunk_bytes: int = 2**30,
                block_saved_bytes: int | None = None, optimizer_shards: int = 1,
                comm_bytes: int = 0) -> MemoryPlan:
    """The memory plan of one step of ``cfg`` on one process (bf16 everything; see the module docstring).

    ``ours`` checkpoints every block but the last ``k``, with ``k`` as large as ``device_bytes`` allows
    after ``margin``; ``naive`` saves every block's activations and the full logits (fp32 log-softmax too).
    ``block_saved_bytes``: one block's saved activations as measured (:func:`measure_block_saved_bytes`);
    ``None`` estimates them (:func:`block_saved_bytes_per_token`). Data parallel: ``cfg`` carries the
    process's share of the batch, ``optimizer_shards`` ranks share the AdamW state (zero1), and
    ``comm_bytes`` is the communication buffers' share (gradient buckets, parameter broadcasts).
    """
    n_params = count_parameters(cfg)
    el = 2  # bf16
    tokens = cfg.batch_size * cfg.context_length
    measured = block_saved_bytes is not None
    per_block_saved = block_saved_bytes if measured else block_saved_bytes_per_token(cfg) * tokens
    residual = tokens * cfg.d_model * el
    # The backward of one block holds its saved tensors, their gradients (about as large) and the
    # residual-stream gradient; the attention kernel's fp32 dQ accumulator is 2x a bf16 q.
    recompute_peak = 2 * per_block_saved + 2 * residual + tokens * cfg.d_model * 4
    workspace = (2 * GIB if device_bytes is not None else 0) + comm_bytes
    common = dict(parameters=n_params * el, gradients=n_params * el,
                  optimizer_state=-(-2 * n_params * el // optimizer_shards),
                  workspace=workspace, device_bytes=device_bytes, block_saved=per_block_saved,
                  block_saved_measured=measured)
    if impl == "naive":
        logits = tokens * cfg.vocab_size * (el + 4 + 4)  # bf16 logits, fp32 upcast and log-softmax
        scores = cfg.batch_size * cfg.num_heads * cfg.context_length**2 * (el + 4)  # reference attention
        return MemoryPlan(checkpointed_activations=0, full_activations=cfg.num_layers * per_block_saved,
                          layer_recompute_peak=scores, loss_chunks=logits,
                          uncheckpointed_blocks=cfg.num_layers, **common)
    # The fused head + loss: a chunk of fp32 logits and its gradient, dW accumulated in fp32 and its bf16 copy
    # (the head's gradient: the first one backward makes, there at the start of backward), dh.
    chunk = min(loss_chunk_bytes, tokens * cfg.vocab_size * 4)
    loss = 2 * chunk + cfg.vocab_size * cfg.d_model * (4 + el) + residual
    budget = None if device_bytes is None else int(device_bytes * (1 - margin))

    def with_blocks(k: int) -> MemoryPlan:
        return MemoryPlan(checkpointed_activations=(cfg.num_layers - k) * residual,
                          full_activations=k * per_block_saved, layer_recompute_peak=recompute_peak,
                          loss_chunks=loss, uncheckpointed_blocks=k, **common)

    k = cfg.num_layers  # un-checkpointed blocks: as many as fit
    while k > 0 and budget is not None and with_blocks(k).total > budget:
        k -= 1
    return with_blocks(k)


def measure_block_saved_bytes(cfg: ModelConfig, device: torch.device, attention: str) -> int:
    """Bytes one Transformer block of ``cfg`` saves for backward, measured: one block at the real shape runs a
    forward under ``saved_tensors_hooks`` (its parameters left out). Costs one block's forward and memory."""
    import cs336_systems.attention  # noqa: F401  (registers our kernels' backend names)
    from cs336_basics.model import RotaryEmbedding, TransformerBlock
    from cs336_systems.profiling.saved_tensors import saved_tensor_bytes

    rope = RotaryEmbedding(cfg.context_length, cfg.head_dim, cfg.rope_theta, device=device)
    block = TransformerBlock(cfg.d_model, cfg.num_heads, cfg.d_ff, rope, attention, device=device,
                             dtype=torch.bfloat16, num_kv_heads=cfg.num_kv_heads, attention_window=cfg.attention_window)
    x = torch.randn(cfg.batch_size, cfg.context_length, cfg.d_model, device=device, dtype=torch.bfloat16,
                    requires_grad=True)
    positions = torch.arange(cfg.context_length, device=device)
    saved = saved_tensor_bytes(block, x, positions, exclude=list(block.parameters()))
    del block, x, rope
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return saved


def check_fits(plan: MemoryPlan, margin: float) -> None:
    if plan.device_bytes is not None and plan.total > plan.device_bytes * (1 - margin):
        raise ValueError(f"leaderboard: the step needs about {plan.total / GIB:.1f} GiB by the memory plan but the "
                         f"device has {plan.device_bytes / GIB:.1f} GiB (with a {margin:.0%} margin: "
                         f"{plan.device_bytes * (1 - margin) / GIB:.1f}); reduce --layers, --context-length or "
                         "--batch-size")


# --- the step ----------------------------------------------------------------------------------


@dataclass
class Step:
    """A built training step: ``run()`` does one full step; the phases are exposed for the breakdown.

    Data parallel, ``ddp`` is the wrapper around ``model``: it averages the gradients over the ranks during
    backward (each rank's loss is the mean over its own tokens)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    inputs: torch.Tensor
    targets: torch.Tensor
    impl: str
    own_names: dict[str, str] | None = None  # wrapped state-dict key -> the model's own (checkpointed blocks)
    ddp: torch.nn.Module | None = None

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.ddp is not None:
            self.ddp.on_train_batch_start()

    def forward(self) -> torch.Tensor:
        # ours: final hidden states (the head is deferred to the loss)
        return (self.model if self.ddp is None else self.ddp)(self.inputs)

    def loss(self, out: torch.Tensor) -> torch.Tensor:
        if self.impl == "naive":
            from cs336_basics.nn_utils import cross_entropy

            return cross_entropy(out, self.targets).sum()
        from cs336_systems.fused.linear_cross_entropy import linear_cross_entropy

        return linear_cross_entropy(out, self.model.lm_head.weight, self.targets)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        if self.ddp is not None:
            self.ddp.finish_gradient_synchronization()

    def run(self) -> None:
        self.zero_grad()
        self.backward(self.loss(self.forward()))
        self.optimizer.step()


def in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def build_step(cfg: LeaderboardConfig, plan: MemoryPlan, rank: int = 0) -> Step:
    """The model (bf16, causal), its optimizer and one random batch, as the handout's test builds them.

    Inside a process group (of ``cfg.nproc`` processes; one under ``torchrun --nproc-per-node 1`` runs the same
    code) the model is wrapped by ``cfg.parallel``'s strategy and this ``rank`` takes its slice of the batch."""
    import cs336_systems.attention  # noqa: F401  (registers our kernels' backend names)
    from cs336_basics.model import BasicsTransformerLM
    from cs336_systems.bench.checkpointing import CheckpointedBlocks, own_state_names

    device, model_cfg = cfg.torch_device, cfg.model_config()
    torch.manual_seed(cfg.seed)
    model = BasicsTransformerLM(**model_cfg.model_kwargs(), attention_backend=cfg.attention_backend, device=device,
                                dtype=torch.bfloat16, check_inputs=False)
    data = torch.randint(model_cfg.vocab_size, (2, model_cfg.batch_size, model_cfg.context_length), device=device)
    per_rank = model_cfg.batch_size // cfg.nproc
    data = data[:, rank * per_rank:(rank + 1) * per_rank].contiguous()
    inputs, targets = data[0], data[1]
    if cfg.impl == "naive":
        from cs336_basics.optimizer import AdamW

        return Step(model, AdamW(model.parameters()), inputs, targets, cfg.impl)
    from cs336_systems.fused.adamw import FusedAdamW
    from cs336_systems.fused.linear_cross_entropy import defer_lm_head

    defer_lm_head(model)
    n_checkpointed = model_cfg.num_layers - plan.uncheckpointed_blocks

    def checkpoint_first_blocks(m: torch.nn.Module) -> None:
        for i in range(n_checkpointed):
            m.layers[i] = CheckpointedBlocks([m.layers[i]])

    own_names = own_state_names(model, checkpoint_first_blocks)
    adamw = dict(stochastic_rounding=cfg.rounding == "stochastic", seed=cfg.seed)
    if not in_process_group():
        return Step(model, FusedAdamW(model.parameters(), **adamw), inputs, targets, cfg.impl, own_names)
    from cs336_systems.parallel.strategies import WrapOptions, get_strategy

    strategy = get_strategy(cfg.parallel)
    ddp = strategy.wrap(model, WrapOptions(bucket_size_mb=cfg.bucket_size_mb))
    optimizer = strategy.make_optimizer(model.parameters(), FusedAdamW, **adamw)
    return Step(model, optimizer, inputs, targets, cfg.impl, own_names, ddp=ddp)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase_breakdown(step: Step, device: torch.device, repeats: int = 2) -> dict[str, float]:
    """Median milliseconds of forward, loss, backward and optimizer over ``repeats`` steps, each phase
    between two synchronisations (so the phases add up to slightly more than a step)."""
    times: dict[str, list[float]] = {"forward": [], "loss": [], "backward": [], "optimizer": []}
    for _ in range(repeats):
        step.zero_grad()
        marks = [time.perf_counter()]
        out = step.forward()
        _sync(device)
        marks.append(time.perf_counter())
        loss = step.loss(out)
        _sync(device)
        marks.append(time.perf_counter())
        step.backward(loss)
        _sync(device)
        marks.append(time.perf_counter())
        step.optimizer.step()
        _sync(device)
        marks.append(time.perf_counter())
        del out, loss
        for name, t0, t1 in zip(times, marks, marks[1:]):
            times[name].append((t1 - t0) * 1e3)
    return {f"{name}_ms": sorted(v)[len(v) // 2] for name, v in times.items()}


def bench_ms(fn, device: torch.device, warmup_ms: float, rep_ms: float) -> float:
    """The handout's timing: ``triton.testing.do_bench`` (median) on CUDA; on a CPU its method with the host
    clock (at least one warm-up and one timed run)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    t0 = time.perf_counter()
    fn()
    estimate_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(max(0, int(warmup_ms / estimate_ms) - 1)):
        fn()
    times = []
    for _ in range(max(1, int(rep_ms / estimate_ms))):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def bench_ms_ranks(fn, device: torch.device, warmup_ms: float, rep_ms: float, min_reps: int = 3) -> float:
    """``bench_ms`` for a step that runs in every process of a group: every rank runs the same number of
    steps (counts from the slowest rank's estimate, as do_bench derives them from its own), each step timed
    between synchronisations; a step's time is the slowest rank's, and the result their median."""
    import torch.distributed as dist

    def timed() -> float:
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        return (time.perf_counter() - t0) * 1e3

    timed()  # the first step compiles and allocates
    estimate = torch.tensor([timed()], dtype=torch.float64, device=device)
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
    for _ in range(max(0, int(warmup_ms / float(estimate)) - 1)):
        fn()
    times = torch.tensor([timed() for _ in range(max(min_reps, int(rep_ms / float(estimate))))],
                         dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return float(times.median())


def _reduce(value: float, op: str, device: torch.device) -> float:
    """``value`` combined over the process group (``"max"`` or ``"sum"``); itself outside one."""
    import torch.distributed as dist

    if not in_process_group():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return float(t)


def device_memory_bytes(device: torch.device) -> int | None:
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def compile_cache_files() -> int:
    """Files in Triton's and Inductor's on-disk caches (``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` or
    their defaults): 0 at the start of a run means it compiled everything itself (the handout's 10-minute
    rule is about such a cold run)."""
    import getpass
    import os
    import tempfile
    from pathlib import Path

    inductor = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    dirs = [os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache",
            os.environ.get("TORCHINDUCTOR_CACHE_DIR") or inductor]
    return sum(1 for d in map(Path, dirs) if d.is_dir() for f in d.rglob("*") if f.is_file())


def comm_buffer_bytes(cfg: LeaderboardConfig, model_cfg: ModelConfig, distributed: bool) -> int:
    """Transient communication buffers of one data-parallel rank (``distributed``: inside a process group, even
    one of a single process): two gradient buckets being packed and reduced, and (zero1) the parameter
    broadcasts in flight (``ShardedOptimizer``'s default buckets), none larger than all the bf16 gradients."""
    if not distributed:
        return 0
    grads = 2 * count_parameters(model_cfg)
    broadcasts = min(2 * 64 * 2**20, grads) if cfg.parallel == "zero1" else 0
    return min(int(2 * cfg.bucket_size_mb * 2**20), grads) + broadcasts


def run_leaderboard(cfg: LeaderboardConfig, *, log=print) -> dict:
    """Plan, build, time and measure one configuration; returns its record (``status`` ``ok`` or ``OOM``).

    Inside a process group of ``cfg.nproc`` processes (``run_distributed``) every process calls this; each
    returns the same record (times, peak memory and the matmul peak combined over the ranks). An
    out-of-memory error there is raised, not recorded: the other ranks would wait for it in a collective."""
    import torch.distributed as dist

    started = time.perf_counter()
    cache_files = compile_cache_files()
    device, model_cfg, rank_cfg = cfg.torch_device, cfg.model_config(), cfg.rank_model_config()
    distributed = in_process_group()
    if (dist.get_world_size() if distributed else 1) != cfg.nproc:
        raise ValueError(f"leaderboard: nproc={cfg.nproc} runs inside a process group of that size (cs336-systems "
                         "leaderboard --nproc N starts one, or torchrun --nproc-per-node N)")
    rank = dist.get_rank() if distributed else 0
    log = log if rank == 0 else (lambda *a, **k: None)
    shards = dict(optimizer_shards=cfg.nproc if distributed and cfg.parallel == "zero1" else 1,
                  comm_bytes=comm_buffer_bytes(cfg, model_cfg, distributed))
    plan = plan_memory(rank_cfg, impl=cfg.impl, device_bytes=device_memory_bytes(device), margin=cfg.memory_margin,
                       **shards)
    where = f"{cfg.nproc} processes ({cfg.parallel}), {device.type}" if distributed else str(device)
    log(f"leaderboard: {cfg.impl} step of {model_cfg.name} ({model_cfg.num_layers} layers, batch "
        f"{model_cfg.batch_size} x {model_cfg.context_length}, bf16) on {where}")
    per = "per process " if distributed else ""
    log(per + plan.describe())
    tokens = model_cfg.batch_size * model_cfg.context_length
    record = {"impl": cfg.impl, "preset": model_cfg.name, "layers": model_cfg.num_layers,
              "context_length": model_cfg.context_length, "batch_size": model_cfg.batch_size,
              "d_model": model_cfg.d_model, "vocab_size": model_cfg.vocab_size,
              "attention": cfg.attention_backend, **({"rounding": cfg.rounding} if cfg.impl == "ours" else {}),
              "nproc": cfg.nproc, **({"parallel": cfg.parallel, "bucket_size_mb": cfg.bucket_size_mb}
                                     if distributed else {}),
              "compile_cache_files_at_start": cache_files,
              "warmup_ms": cfg.warmup_ms, "rep_ms": cfg.rep_ms, **plan.as_record()}
    if cfg.impl == "ours":
        check_fits(plan, cfg.memory_margin)  # on the estimate: refuse before allocating anything
        saved = measure_block_saved_bytes(rank_cfg, device, cfg.attention_backend)
        plan = plan_memory(rank_cfg, device_bytes=plan.device_bytes, margin=cfg.memory_margin,
                           block_saved_bytes=saved, **shards)
        log("with one block's saved activations measured:\n" + per + plan.describe())
        check_fits(plan, cfg.memory_margin)
        record.update(plan.as_record())
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step = None
    try:
        step = build_step(cfg, plan, rank)
        if distributed:
            step_ms = bench_ms_ranks(step.run, device, cfg.warmup_ms, cfg.rep_ms)
        else:
            step_ms = bench_ms(step.run, device, cfg.warmup_ms, cfg.rep_ms)
        phases = phase_breakdown(step, device, repeats=1 if step_ms > 5000 or device.type == "cpu" else 3)
        phases = {k: _reduce(v, "max", device) for k, v in phases.items()}
        peak_memory = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None
        if peak_memory is not None:
            peak_memory = _reduce(peak_memory, "max", device)  # the fullest rank's
    except (torch.OutOfMemoryError, RuntimeError, MemoryError) as err:  # an allocator's failure (is_oom)
        from cs336_systems.bench.e2e import is_oom

        if distributed or not is_oom(err):
            raise
        log(f"leaderboard: {cfg.impl}: out of memory ({str(err).splitlines()[0][:120]})")
        return {**record, "status": "OOM", "error": str(err).splitlines()[0][:300],
                "wall_s": time.perf_counter() - started}
    finally:
        del step
    flops = training_flops_per_token(model_cfg, model_cfg.context_length, causal=True) * tokens
    from cs336_systems.profiling.timing import matmul_peak_tflops

    peak_tflops = _reduce(matmul_peak_tflops(device.type, torch.bfloat16), "sum", device)  # all GPUs' together
    achieved = flops / (step_ms * 1e-3) / 1e12
    record.update(status="ok", step_ms=step_ms, tokens_per_s=tokens / (step_ms * 1e-3), model_tflop=flops / 1e12,
                  achieved_tflops=achieved, matmul_peak_tflops=peak_tflops, mfu=achieved / peak_tflops,
                  peak_memory_gib=peak_memory,  # read before the matmul-peak measurement allocates its operands
                  device_memory_gib=(plan.device_bytes / GIB if plan.device_bytes else None),
                  wall_s=time.perf_counter() - started, **phases)
    return record


def compare_logits(cfg: LeaderboardConfig) -> dict:
    """Our step's model against the handout's on the same weights and batch (a reduced size): the loss, and
    the logits our hidden states give through the same head, agree up to bf16 rounding."""
    from cs336_basics.model import BasicsTransformerLM
    from cs336_basics.nn_utils import cross_entropy

    device, model_cfg = cfg.torch_device, cfg.model_config()
    ours = build_step(dataclasses.replace(cfg, impl="ours", nproc=1), plan_memory(model_cfg))
    torch.manual_seed(cfg.seed)
    naive = BasicsTransformerLM(**model_cfg.model_kwargs(), attention_backend="reference", device=device,
                                dtype=torch.bfloat16, check_inputs=False)
    naive.load_state_dict({ours.own_names[k]: v for k, v in ours.model.state_dict().items()})
    with torch.no_grad():
        hidden = ours.forward()
        ours_logits = (hidden @ ours.model.lm_head.weight.T).float()
        ours_loss = float(ours.loss(hidden))
        ref_logits = naive(ours.inputs).float()
        ref_loss = float(cross_entropy(ref_logits, ours.targets))
    err = float((ours_logits - ref_logits).norm() / ref_logits.norm())
    return {"logits_rel_error": err, "loss_ours": ours_loss, "loss_reference": ref_loss}


# --- the quality guard -------------------------------------------------------------------------


def markov_batches(vocab_size: int, batch_size: int, context_length: int, seed: int, branching: int = 4):
    """Endless ``(inputs, targets)`` batches from a fixed random Markov chain: each token is followed by one of
    ``branching`` successors, uniformly, so a model can learn it down to ``ln(branching)`` nats per token."""
    import numpy as np

    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab_size, size=(vocab_size, branching))
    while True:
        seq = np.empty((batch_size, context_length + 1), dtype=np.int64)
        seq[:, 0] = rng.integers(0, vocab_size, size=batch_size)
        choice = rng.integers(0, branching, size=(batch_size, context_length))
        for t in range(context_length):
            seq[:, t + 1] = successors[seq[:, t], choice[:, t]]
        batch = torch.from_numpy(seq)
        yield batch[:, :-1], batch[:, 1:]


def quality_guard(device: torch.device | str, *, preset: str = "small", steps: int = 300, context_length: int = 256,
                  batch_size: int = 8, lr: float = 1e-3, seed: int = 0, stochastic_rounding: bool = True,
                  log=print) -> dict:
    """Train ``preset`` twice on the same Markov-chain batches: with the leaderboard's precision (bf16
    parameters, gradients and AdamW state, stochastically rounded unless ``stochastic_rounding=False``; fused
    loss and fused AdamW) and with the fp32-master reference (fp32 parameters and state, bf16 autocast, full
    logits, our AdamW). Returns both final losses (mean of the last 10 steps) and their relative difference."""
    import cs336_systems.attention  # noqa: F401  (registers our kernels' backend names)
    from cs336_basics.model import BasicsTransformerLM
    from cs336_basics.nn_utils import cross_entropy
    from cs336_basics.optimizer import AdamW
    from cs336_systems.fused.adamw import FusedAdamW
    from cs336_systems.fused.linear_cross_entropy import defer_lm_head, linear_cross_entropy

    device = torch.device(device)
    model_cfg = get_preset(preset, context_length=context_length)
    attention = "flash_triton" if device.type == "cuda" else "sdpa"
    final = {}
    for name in ("bf16", "fp32_master"):
        torch.manual_seed(seed)
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        model = BasicsTransformerLM(**model_cfg.model_kwargs(), attention_backend=attention, device=device,
                                    dtype=dtype, check_inputs=False)
        if name == "bf16":
            defer_lm_head(model)
            optimizer = FusedAdamW(model.parameters(), lr=lr, stochastic_rounding=stochastic_rounding, seed=seed)
        else:
            optimizer = AdamW(model.parameters(), lr=lr)
        batches, losses = markov_batches(model_cfg.vocab_size, batch_size, context_length, seed), []
        for _ in range(steps):
            x, y = (t.to(device) for t in next(batches))
            optimizer.zero_grad(set_to_none=True)
            if name == "bf16":
                loss = linear_cross_entropy(model(x), model.lm_head.weight, y)
            else:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        final[name] = sum(losses[-10:]) / len(losses[-10:])
        log(f"quality guard: {name}: loss {losses[0]:.3f} -> {final[name]:.3f} after {steps} steps")
        del model, optimizer
    return {"preset": preset, "steps": steps, "context_length": context_length, "batch_size": batch_size, "lr": lr,
            "seed": seed, "stochastic_rounding": stochastic_rounding,
            "final_loss_bf16": final["bf16"], "final_loss_fp32_master": final["fp32_master"],
            "relative_difference": final["bf16"] / final["fp32_master"] - 1.0}


def run_leaderboard_ranks(info, configs: list[LeaderboardConfig]) -> list[dict]:
    """One process of a data-parallel leaderboard run (``process_group.run_distributed``'s worker): every
    configuration in turn; rank 0 logs."""
    return [run_leaderboard(cfg) for cfg in configs]
