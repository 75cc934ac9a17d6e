"""Where a training step spends its time (handout problem ``nsys_profile``), with ``torch.profiler``.

Nsight Systems does not run on our GPU machines, so this answers the same questions from
``torch.profiler``: for each scope (forward only, forward + backward, full train step) a kernel
summary table (kernel, calls, total, average, share), the share of GEMM kernels, and, inside
attention, the device time of the score matmul, the softmax and the final matmul beside their FLOP
ratio. The same run carries NVTX ranges (``warmup`` / ``measured``, ``forward`` / ``backward`` /
``optimizer``, and the attention ranges of the ``reference_nvtx`` backend), so

    nsys profile --trace=cuda,nvtx --pytorch=functions-trace --capture-range=nvtx \
        --nvtx-capture=measured cs336-systems profile --preset small

gives the Nsight view where nsys exists.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import cs336_systems.profiling.nvtx  # noqa: F401  (registers reference_nvtx)
from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.optimizer import AdamW
from cs336_systems.bench.e2e import PRECISIONS, autocast_context, is_oom
from cs336_systems.bench.harness import PhaseTimer, summarize
from cs336_systems.configs import get_preset
from cs336_systems.profiling.kernels import gemm_share, kernel_rows, range_times_ms
from cs336_systems.profiling.nvtx import ATTENTION_RANGES, annotate
from cs336_systems.profiling.quiet import quiet_profile

SCOPES = ("forward", "forward-backward", "train-step")
STEP_RANGES = ("warmup", "measured", "forward", "backward", "optimizer", "attention", *ATTENTION_RANGES)
SOFTMAX_FLOPS_PER_SCORE = 5  # our softmax per score element: max, subtract, exp, sum, divide


@dataclass(kw_only=True)
class ProfileConfig:
    preset: str = "small"
    context_length: int = 512
    batch_size: int | None = None
    scope: str = "train-step"
    precision: str = "fp32"
    attention: str = "reference_nvtx"
    warmup: int = 3
    steps: int = 5
    top_k: int = 12  # kernel table rows kept in the record
    device: str | None = None
    trace_dir: str | None = None  # write a gzipped Chrome trace here (None: no trace)

    def __post_init__(self):
        get_preset(self.preset)
        if self.scope not in SCOPES:
            raise ValueError(f"nsys_profile: unknown scope {self.scope!r}; choose from {', '.join(SCOPES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"nsys_profile: unknown precision {self.precision!r}")
        if self.warmup < 0 or self.steps < 1 or self.context_length < 1:
            raise ValueError("nsys_profile: need warmup >= 0, steps >= 1, context_length >= 1")
        from cs336_basics.attention import get_attention_backend

        get_attention_backend(self.attention)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def attention_flops(batch: int, heads: int, seq: int, head_dim: int) -> dict[str, int]:
    """FLOPs of one attention call over the full (T x T) score matrix: QK^T and PV are 2*T*T*d each;
    the softmax ``SOFTMAX_FLOPS_PER_SCORE`` per score."""
    scores = batch * heads * seq * seq
    return {"scores": 2 * scores * head_dim, "softmax": SOFTMAX_FLOPS_PER_SCORE * scores,
            "final_matmul": 2 * scores * head_dim}


def run_profile(cfg: ProfileConfig) -> dict:
    """Profile ``cfg.steps`` steps of one scope; returns one record (``status`` ok / OOM)."""
    device = cfg.torch_device
    on_gpu = device.type == "cuda"
    model_cfg = get_preset(cfg.preset)
    batch = cfg.batch_size or model_cfg.batch_size
    model_cfg = model_cfg.replace(context_length=cfg.context_length, batch_size=batch)
    record = {**asdict(cfg), "batch_size": batch}
    model = optimizer = None
    try:
        model = BasicsTransformerLM(**model_cfg.model_kwargs(), attention_backend=cfg.attention,
                                    check_inputs=False, device=device)
        optimizer = AdamW(model.parameters(), lr=1e-4) if cfg.scope == "train-step" else None
        x = torch.randint(0, model_cfg.vocab_size, (batch, cfg.context_length), device=device)
        y = torch.randint(0, model_cfg.vocab_size, (batch, cfg.context_length), device=device)

        def one_step(timer: PhaseTimer | None = None) -> None:
            def phase(name):
                return timer.phase(name) if timer is not None else contextlib.nullcontext()

            if cfg.scope == "forward":
                with phase("forward"), annotate("forward"), autocast_context(cfg.precision, device), \
                        torch.no_grad():
                    model(x)
                return
            with phase("forward"), annotate("forward"), autocast_context(cfg.precision, device):
                loss = cross_entropy(model(x), y)
            with phase("backward"), annotate("backward"):
                loss.backward()
            if optimizer is not None:
                with phase("optimizer"), annotate("optimizer"):
                    optimizer.step()
            model.zero_grad(set_to_none=True)

        with annotate("warmup"):
            for _ in range(cfg.warmup):
                one_step()
        # Unprofiled timing with the handout's method, to compare with the profiler's view.
        timer = PhaseTimer(device)
        for _ in range(cfg.steps):
            with timer.phase("step"):
                one_step(timer)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if on_gpu:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with quiet_profile(activities=activities, record_shapes=False) as prof, annotate("measured"):
            for _ in range(cfg.steps):
                one_step()
            if on_gpu:
                torch.cuda.synchronize(device)

        rows = kernel_rows(prof, exclude_names=STEP_RANGES, on_gpu=on_gpu)
        ranges = range_times_ms(prof, STEP_RANGES, on_gpu)
        flops = attention_flops(batch, model_cfg.num_heads, cfg.context_length, model_cfg.head_dim)
        attn_ms = {n.split("/")[1]: ranges[n]["total_ms"] / cfg.steps for n in ATTENTION_RANGES}
        total_kernel_ms = sum(r["total_ms"] for r in rows)
        top = rows[0] if rows else None
        record.update(
            status="ok",
            unprofiled={ph: summarize(v)["mean_ms"] for ph, v in timer.host.items()},
            kernel_ms_per_step=total_kernel_ms / cfg.steps,
            phase_device_ms={ph: ranges[ph]["total_ms"] / cfg.steps for ph in ("forward", "backward", "optimizer")},
            gemm_share=gemm_share(rows),
            n_kernel_names=len(rows),
            kernels=[{**r, "calls_per_step": r["calls"] / cfg.steps} for r in rows[: cfg.top_k]],
            top_kernel=top["kernel"] if top else None,
            top_kernel_calls_per_step=(top["calls"] / cfg.steps) if top else None,
            attention_ms_per_step=attn_ms,
            attention_flops_per_step={k: v * model_cfg.num_layers for k, v in flops.items()},
            on_gpu=on_gpu,
        )
        if cfg.trace_dir:
            trace_dir = Path(cfg.trace_dir)
            trace_dir.mkdir(parents=True, exist_ok=True)
            raw = trace_dir / f"trace-{cfg.preset}-ctx{cfg.context_length}-{cfg.scope}-{cfg.precision}.json"
            prof.export_chrome_trace(str(raw))
            with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
            record["trace"] = f"{raw.name}.gz"
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        record.update(status="OOM", error=str(err).splitlines()[0][:200])
    finally:
        model = optimizer = None
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
    return record
