"""End-to-end benchmark of one training step (handout problems ``benchmarking_script``,
``benchmarking_mixed_precision`` (c), ``torch_compile`` (b), ``gradient_checkpointing`` (b)).

For each configuration: build the model with random weights, make a random batch, run ``warmup``
untimed steps, then time ``steps`` steps phase by phase (forward, backward, optimizer), with a
device synchronize around every phase (``timeit.default_timer``, the handout's method) and CUDA
events recorded around the same regions as a cross-check. ``run_benchmark_isolated`` runs one
configuration in a fresh interpreter, which the warm-up study needs: otherwise a configuration
with zero warm-up steps would profit from the kernels and library handles loaded by the previous one.
Peak memory (CUDA) is the most allocated over the steps after the first (the first compiles: the compiler's
autotuning buffers are not the step's), less what was allocated when the configuration started.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import timeit
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from tqdm import tqdm

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.optimizer import AdamW
from cs336_systems.attention.auto import choose, sdpa_priority
from cs336_systems.bench.checkpointing import apply_activation_checkpointing, parse_checkpoint_spec
from cs336_systems.bench.harness import PhaseTimer, summarize
from cs336_systems.configs import (
    ModelConfig,
    activation_lower_bound,
    count_parameters,
    forward_flops_per_token,
    get_preset,
    training_flops_per_token,
)
from cs336_systems.devices import available_bytes, resolve_device
from cs336_systems.fast import CUBLAS_WORKSPACES, FFN_KERNELS, RESIDUAL_DTYPES, ROPE_KERNELS, apply_cublas_workspace
from cs336_systems.fused.linear_cross_entropy import head_loss
from cs336_systems.profiling.timing import matmul_peak_tflops

Mode = Literal["forward", "forward-backward", "train-step"]
MODES: tuple[Mode, ...] = ("forward", "forward-backward", "train-step")
PRECISIONS = ("fp32", "bf16")
# cs336_basics.optimizer.AdamW (foreach), torch.optim.AdamW(fused=True), or cs336_systems.fused.adamw.FusedAdamW
# (one Triton pass per parameter; under bf16 the Linear weights, and with residual_dtype bf16 the token embedding,
# become bf16 copies of fp32 masters)
OPTIMIZERS = ("ours", "torch-fused", "fused")
LOSSES = ("unfused", "fused")  # LM head then cross_entropy, or cs336_systems.fused.linear_cross_entropy
# our model and step, or the compiled plain-PyTorch peer (cs336_systems.bench.peer), also with CUDA graphs
IMPLS = ("ours", "peer", "peer-graphs")
PHASES = ("step", "forward", "backward", "optimizer")
# "phases": a device synchronize around each phase of a step too (the handout's breakdown; the host's launch work
# at the start of the backward and the optimizer then leaves the GPU idle); "step": around whole steps only, as a
# training loop runs them (what a ratio against a peer compares: our captured step has no phases to separate)
TIMINGS = ("phases", "step")


@dataclass(kw_only=True)
class BenchConfig:
    preset: str = "small"
    context_length: int = 512
    batch_size: int | None = None  # None: the preset's (4)
    mode: Mode = "train-step"
    precision: str = "fp32"  # fp32: no autocast (nullcontext); bf16: torch.autocast(bfloat16)
    compile: bool = False
    # "model": torch.compile the whole model (one graph of all blocks: long compiles for deep models);
    # "blocks": compile each block in place (regional compilation: identical blocks share one compiled graph)
    compile_scope: str = "model"
    attention: str = "reference"
    checkpoint: str = "none"  # activation checkpointing: "none", "nested" or k (every k blocks)
    optimizer: str = "ours"
    loss: str = "unfused"
    impl: str = "ours"  # "peer": the settings above that concern our model (compile, attention, ...) do not apply
    cuda_graph: bool = False  # the whole step as one CUDA graph (cs336_systems.step_graph): train-step, fused, CUDA
    residual_dtype: str = "fp32"  # "bf16": the token embedding a bf16 copy too (bf16 precision, train-step, fused)
    rope: str = "torch"  # "triton": RoPE by cs336_systems.fused.rope (ours, CUDA)
    ffn: str = "torch"  # "fused": the SwiGLU feed-forward by cs336_systems.fused.swiglu (ours, CUDA)
    # cuBLAS's workspace (cs336_systems.fast.apply_cublas_workspace): a setting of the process, read at its first
    # matmul, so it holds where the configuration runs in a fresh process (isolated) or is the process's first
    cublas_workspace: str = "default"
    # the MFU denominator (TFLOP/s), measured once by the caller for every configuration of a run; None: measured in
    # this process after its steps
    peak_tflops: float | None = None
    warmup: int = 5
    # after the warm-up steps, more untimed steps until they have run this long: a GPU's clock and power settle on
    # the timed work (a power-capped H100 runs a captured step's first replays up to 7% off its steady time)
    warmup_seconds: float = 0.0
    steps: int = 10
    timing: str = "phases"  # see TIMINGS
    device: str | None = None  # None: cuda if available, else cpu

    def __post_init__(self):
        get_preset(self.preset)  # raises ValueError for an unknown preset
        if self.mode not in MODES:
            raise ValueError(f"benchmarking_script: unknown mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"benchmarking_script: unknown precision {self.precision!r}; "
                             f"choose from {', '.join(PRECISIONS)}")
        if self.compile_scope not in ("model", "blocks"):
            raise ValueError(f"torch_compile: unknown compile scope {self.compile_scope!r}; choose model or blocks")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"benchmarking_script: unknown optimizer {self.optimizer!r}; "
                             f"choose from {', '.join(OPTIMIZERS)}")
        if self.loss not in LOSSES:
            raise ValueError(f"benchmarking_script: unknown loss {self.loss!r}; choose from {', '.join(LOSSES)}")
        if self.impl not in IMPLS:
            raise ValueError(f"benchmarking_script: unknown impl {self.impl!r}; choose from {', '.join(IMPLS)}")
        if self.timing not in TIMINGS:
            raise ValueError(f"benchmarking_script: unknown timing {self.timing!r}; choose from {', '.join(TIMINGS)}")
        if self.residual_dtype not in RESIDUAL_DTYPES:
            raise ValueError(f"benchmarking_script: unknown residual dtype {self.residual_dtype!r}; choose from "
                             f"{', '.join(RESIDUAL_DTYPES)}")
        if self.residual_dtype == "bf16" and (self.impl != "ours" or self.mode != "train-step"
                                              or self.precision != "bf16" or self.optimizer != "fused"):
            raise ValueError("benchmarking_script: --residual-dtype bf16 keeps the token embedding as a bf16 copy in "
                             "the fused optimizer: it needs our train step with --precision bf16 and --optimizer fused "
                             f"(got impl {self.impl}, mode {self.mode}, precision {self.precision}, optimizer "
                             f"{self.optimizer})")
        if self.rope not in ROPE_KERNELS:
            raise ValueError(f"benchmarking_script: unknown rope kernel {self.rope!r}; choose from "
                             f"{', '.join(ROPE_KERNELS)}")
        if self.rope == "triton" and (self.impl != "ours" or self.torch_device.type != "cuda"):
            raise ValueError(f"benchmarking_script: --rope triton runs our model on a CUDA device (got impl "
                             f"{self.impl}, device {self.torch_device})")
        if self.ffn not in FFN_KERNELS:
            raise ValueError(f"benchmarking_script: unknown ffn kernel {self.ffn!r}; choose from "
                             f"{', '.join(FFN_KERNELS)}")
        if self.ffn == "fused" and (self.impl != "ours" or self.torch_device.type != "cuda"):
            raise ValueError(f"benchmarking_script: --ffn fused runs our model on a CUDA device (got impl "
                             f"{self.impl}, device {self.torch_device})")
        if self.ffn == "fused" and self.precision != "bf16":
            raise ValueError(f"benchmarking_script: --ffn fused runs 16-bit kernels: it needs --precision bf16 (got "
                             f"{self.precision})")
        if self.cublas_workspace not in CUBLAS_WORKSPACES:
            raise ValueError(f"benchmarking_script: unknown cuBLAS workspace {self.cublas_workspace!r}; choose from "
                             f"{', '.join(CUBLAS_WORKSPACES)}")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"benchmarking_script: peak_tflops must be > 0 or None, got {self.peak_tflops}")
        if self.device is not None:
            resolve_device(self.device, "benchmarking_script: --device")
        if self.cuda_graph:
            if self.impl != "ours" or self.mode != "train-step" or self.optimizer != "fused":
                raise ValueError("benchmarking_script: --cuda-graph yes times our train step with --optimizer fused "
                                 f"(got impl {self.impl}, mode {self.mode}, optimizer {self.optimizer})")
            if self.warmup < 2:
                raise ValueError(f"benchmarking_script: --cuda-graph yes needs --warmup >= 2 (eager steps that compile "
                                 f"the kernels, then the capture), got {self.warmup}")
            if self.torch_device.type != "cuda":
                raise ValueError(f"benchmarking_script: --cuda-graph yes needs a CUDA device, got "
                                 f"{self.torch_device}")
        if self.warmup < 0 or self.steps < 1:
            raise ValueError(f"benchmarking_script: need --warmup >= 0 and --steps >= 1, got --warmup {self.warmup}, "
                             f"--steps {self.steps}")
        if not 0 <= self.warmup_seconds <= 600:  # also refuses nan
            raise ValueError(f"benchmarking_script: --warmup-seconds must be in [0, 600], got {self.warmup_seconds}")
        if self.context_length < 1:
            raise ValueError(f"benchmarking_script: --context-length must be >= 1, got {self.context_length}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"benchmarking_script: --batch-size must be >= 1, got {self.batch_size}")
        self.checkpoint = parse_checkpoint_spec(self.checkpoint)
        if self.checkpoint.isdigit() and int(self.checkpoint) > get_preset(self.preset).num_layers:
            raise ValueError(f"gradient_checkpointing: k={self.checkpoint} exceeds the {self.preset} preset's "
                             f"{get_preset(self.preset).num_layers} blocks")
        from cs336_basics.attention import get_attention_backend

        get_attention_backend(self.attention)  # raises ValueError for an unknown backend

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a precision's matmuls run in (and whose matmul peak is its MFU denominator)."""
    return torch.bfloat16 if precision == "bf16" else torch.float32


def autocast_context(precision: str, device: torch.device, cache_enabled: bool = True):
    """bf16: ``torch.autocast``; fp32: a no-op context (the handout's ``nullcontext``)."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache_enabled)
    return contextlib.nullcontext()


def is_oom(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, a RuntimeError of an allocator that ran out (CUDA's text, or the CPU allocator's
    "can't allocate memory"), or Python's MemoryError."""
    text = str(err).lower()
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or any(
        s in text for s in ("out of memory", "can't allocate memory", "cannot allocate memory"))


def model_flops_per_step(cfg: BenchConfig, batch: int) -> int:
    """Model FLOPs of one measured step (recomputation by checkpointing is not counted: MFU convention)."""
    model_cfg = get_preset(cfg.preset)
    per_token = (forward_flops_per_token if cfg.mode == "forward" else training_flops_per_token)(
        model_cfg, cfg.context_length)
    return per_token * batch * cfg.context_length


def _make_optimizer(cfg: BenchConfig, model: torch.nn.Module):
    if cfg.mode != "train-step":
        return None
    if cfg.optimizer == "torch-fused":
        return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cfg.torch_device.type == "cuda")
    if cfg.optimizer == "fused":
        from cs336_systems.fused.adamw import FusedAdamW, low_precision_params

        bf16 = cfg.precision == "bf16"
        return FusedAdamW(model.parameters(), lr=1e-4, compute_dtype=torch.bfloat16 if bf16 else None,
                          low_precision=low_precision_params(model, cfg.residual_dtype) if bf16 else ())
    return AdamW(model.parameters(), lr=1e-4)


def build_ours(cfg: BenchConfig, model_kwargs: dict, device: torch.device):
    """Our model with ``cfg``'s settings: (model, optimizer or None, loss_fn(x, y), step_model)."""
    model = BasicsTransformerLM(**model_kwargs, attention_backend=cfg.attention, check_inputs=False, device=device)
    if cfg.rope == "triton":
        from cs336_systems.fused.rope import use_triton_rope

        use_triton_rope(model)
    if cfg.ffn == "fused":
        from cs336_systems.fused.swiglu import use_fused_swiglu

        use_fused_swiglu(model)
    if cfg.loss == "fused":
        from cs336_systems.fused.linear_cross_entropy import defer_lm_head, linear_cross_entropy

        defer_lm_head(model)  # model(x) now returns the final hidden states; the head's weight stays in place
    apply_activation_checkpointing(model, cfg.checkpoint)
    optimizer = _make_optimizer(cfg, model)  # before compiling: the fused optimizer may turn weights into bf16
    step_model = model
    if cfg.compile and cfg.compile_scope == "blocks":
        for block in model.layers:
            block.compile()
    elif cfg.compile:
        step_model = torch.compile(model)
    loss_of_logits = head_loss(cfg.compile)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if cfg.loss == "fused":
            return linear_cross_entropy(step_model(x), model.lm_head.weight, y)
        return loss_of_logits(step_model(x), y)

    return model, optimizer, loss_fn, step_model


def _captured_step(cfg: BenchConfig, model, optimizer, loss_fn, device: torch.device):
    """The train step as a CUDA graph (``CapturedStep``'s requirements: gradients set to None inside the step,
    autocast without its cast cache), captured after at most two eager warm-up steps (they compile and initialise)
    so that the rest of the warm-up replays it: the GPU's clock and power then settle on the work that is timed. An
    H100 at its power cap runs the first replays after the capture's idle gap up to 7% off their steady time
    (docs/training_step.md, session 28)."""
    from cs336_systems.step_graph import CapturedStep

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        with autocast_context(cfg.precision, device, cache_enabled=False):
            loss = loss_fn(x, y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return CapturedStep(step, optimizer=optimizer, warmup=min(cfg.warmup - 1, 2))


def _attention_choice(cfg: BenchConfig, model_cfg, batch: int, device: torch.device, sdpa_only: bool) -> str:
    """What ``flash_auto``'s table runs at the model's attention shape on this GPU: ``flash_triton`` or an SDPA
    backend (``sdpa_only``: the SDPA backend measured fastest, which the peer's best user pins)."""
    if device.type != "cuda":
        return "sdpa"
    dtype = compute_dtype(cfg.precision)
    return choose(batch * model_cfg.num_heads, cfg.context_length, model_cfg.d_model // model_cfg.num_heads, dtype,
                  True, torch.cuda.get_device_name(device), sdpa_only=sdpa_only)


def step_memory_lower_bound(cfg: BenchConfig, model_cfg: ModelConfig) -> int:
    """Bytes ``cfg``'s step needs at least: fp32 weights, their gradients (with a backward) and AdamW's two moments
    (a train step), and the activations (``configs.activation_lower_bound``); ``model_cfg`` carries the batch and
    context."""
    n = count_parameters(model_cfg)
    backward = cfg.mode != "forward"
    state = 4 * n * (1 + backward + 2 * (cfg.mode == "train-step"))
    return int(state + activation_lower_bound(
        model_cfg, model_cfg.context_length, model_cfg.batch_size, precision=cfg.precision,
        attention=cfg.attention if cfg.impl == "ours" else "sdpa", loss=cfg.loss if cfg.impl == "ours" else "unfused",
        activation_checkpointing=cfg.checkpoint if cfg.impl == "ours" else "none", backward=backward))


def run_benchmark(cfg: BenchConfig) -> dict:
    """Run one configuration; returns a flat record (``status`` is ``ok`` or ``OOM``)."""
    device = cfg.torch_device
    model_cfg = get_preset(cfg.preset)
    batch = cfg.batch_size or model_cfg.batch_size
    model_cfg = model_cfg.replace(context_length=cfg.context_length, batch_size=batch)
    record = {**asdict(cfg), "batch_size": batch, "device": str(device),
              "cublas_workspace_config": apply_cublas_workspace(cfg.cublas_workspace)}
    if record["peak_tflops"] is None:  # measured below, after the steps
        del record["peak_tflops"]
    model = optimizer = step_model = None
    if device.type == "cpu":  # the kernel kills a process that runs out of RAM, with every record of the run
        need, (avail, where) = step_memory_lower_bound(cfg, model_cfg), available_bytes(device)
        if need > avail:
            return {**record, "status": "OOM", "error": f"not run: needs at least {need / 2**30:,.1f} GiB, "
                                                        f"{where} {avail / 2**30:,.1f} GiB free"}
    try:
        if device.type == "cuda":
            # the previous configuration's objects held in reference cycles (compiled modules, a captured step's
            # graph and its memory pool) outlive its own clean-up, which runs while its locals still refer to
            # them: collect them now, or this configuration's peak would include them
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            record["memory_before_gib"] = torch.cuda.memory_allocated(device) / 2**30
        if cfg.impl != "ours":
            from cs336_systems.bench.peer import build_peer

            sdpa = _attention_choice(cfg, model_cfg, batch, device, sdpa_only=True)
            model, optimizer, loss_fn = build_peer(model_cfg.model_kwargs(), device, compile=device.type == "cuda",
                                                   mode="reduce-overhead" if cfg.impl == "peer-graphs" else None,
                                                   sdpa_backends=sdpa_priority(sdpa))
            step_model = model
            record.update(peer_compiled=device.type == "cuda", peer_sdpa=sdpa)
            if cfg.mode != "train-step":
                optimizer = None
        else:
            model, optimizer, loss_fn, step_model = build_ours(cfg, model_cfg.model_kwargs(), device)
            if cfg.attention == "flash_auto":  # which kernels ran: the table changes as the kernels improve
                record["attention_choice"] = _attention_choice(cfg, model_cfg, batch, device, sdpa_only=False)
        x = torch.randint(0, model_cfg.vocab_size, (batch, cfg.context_length), device=device)
        y = torch.randint(0, model_cfg.vocab_size, (batch, cfg.context_length), device=device)
        timer = PhaseTimer(device)
        captured = _captured_step(cfg, model, optimizer, loss_fn, device) if cfg.cuda_graph else None
        if captured is not None:  # a replay has no phases: whatever was asked, whole steps are what is timed
            record["timing"] = "step"

        def phase(name: str, record_it: bool):
            return timer.phase(name, record_it) if cfg.timing == "phases" else contextlib.nullcontext()

        def one_step(record_it: bool) -> None:
            if captured is not None:  # one replay: its phases are not separable
                with timer.phase("step", record_it):
                    captured(x, y)
                return
            with timer.phase("step", record_it):
                if cfg.mode == "forward":
                    with phase("forward", record_it), autocast_context(cfg.precision, device), torch.no_grad():
                        step_model(x)
                    return
                with phase("forward", record_it), autocast_context(cfg.precision, device):
                    loss = loss_fn(x, y)
                with phase("backward", record_it):
                    loss.backward()
                if optimizer is not None:
                    with phase("optimizer", record_it):
                        optimizer.step()
                model.zero_grad(set_to_none=True)

        # a progress bar only for runs that last (tqdm's delay): one bar per configuration, a tick per step
        label = f"{cfg.impl} {cfg.preset}/{cfg.context_length}"
        settle_steps = 0
        for i in tqdm(range(cfg.warmup + cfg.steps), desc=label, unit="step", delay=2, leave=False):
            if i == cfg.warmup and cfg.warmup_seconds > 0:  # untimed steps until the GPU's state settles
                start = timeit.default_timer()
                while timeit.default_timer() - start < cfg.warmup_seconds:
                    one_step(False)
                    settle_steps += 1
            one_step(i >= cfg.warmup)
            if i == 0 and cfg.warmup >= 1 and device.type == "cuda":
                # the peak of the steps after the first: the first compiles, and the compiler's autotuning
                # buffers (tens of MiB) sit beside its activations; CUDA graphs are recorded after it
                torch.cuda.reset_peak_memory_stats(device)
        # the configuration's own peak: above what was allocated when it started (a previous configuration's
        # library workspaces stay: bench isolates comparisons), and before the matmul-peak measurement below
        # allocates its operands
        peak_memory = ((torch.cuda.max_memory_allocated(device) / 2**30 - record["memory_before_gib"])
                       if device.type == "cuda" else None)

        tokens = batch * cfg.context_length
        step = summarize(timer.host["step"])
        peak = cfg.peak_tflops or matmul_peak_tflops(device.type, compute_dtype(cfg.precision))
        tflops = model_flops_per_step(cfg, batch) / (step["mean_ms"] * 1e-3) / 1e12
        record.update(status="ok", n_params=sum(p.numel() for p in model.parameters()))
        for phase in PHASES:
            if phase in timer.host:
                record.update({f"{phase}_{k}": v for k, v in summarize(timer.host[phase]).items()})
                if device.type == "cuda":
                    record[f"{phase}_event_mean_ms"] = summarize(timer.event_seconds(phase))["mean_ms"]
        record.update(
            settle_steps=settle_steps,
            step_times_ms=[s * 1e3 for s in timer.host["step"]],
            tokens_per_s=tokens / (step["mean_ms"] * 1e-3),
            model_flops_per_step=model_flops_per_step(cfg, batch),
            model_tflops=tflops,
            peak_tflops=peak,
            peak_tflops_shared=cfg.peak_tflops is not None,
            mfu=tflops / peak,
            peak_memory_gib=peak_memory,
        )
    except (torch.OutOfMemoryError, RuntimeError, MemoryError) as err:
        if not is_oom(err):
            raise
        record.update(status="OOM", error=(str(err).splitlines() or [type(err).__name__])[0][:200])
    finally:
        model = optimizer = step_model = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if cfg.compile or cfg.impl != "ours":
            torch._dynamo.reset()  # a later configuration must not reuse (or hit the limit of) these graphs
    return record


def run_benchmark_isolated(cfg: BenchConfig) -> dict:
    """``run_benchmark`` in a fresh interpreter (spawn): nothing is warm from earlier configurations."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(run_benchmark, (cfg,))
