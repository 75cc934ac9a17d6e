"""Attention alone, forward and backward, across head dims and sequence lengths (handout problems
``pytorch_attention`` and ``torch_compile`` (a)).

Batch 8, no head dimension (inputs ``(B, T, d)``), causal. For each backend (any registered
attention backend, eager or under ``torch.compile``): warm up, time ``reps`` forward passes, then
measure the memory in use before the backward pass (one forward's saved tensors), and time ``reps``
backward passes, with a synchronize after every pass. Out-of-memory is recorded and the sweep goes on.

The memory accounting is done in code: the bytes autograd saves per (query, key) score element
are measured with saved-tensor hooks on a small problem and extrapolated (they scale with T^2).
"""

from __future__ import annotations

import gc
import timeit
from dataclasses import asdict, dataclass

import torch

from cs336_basics.attention import get_attention_backend
from cs336_systems.bench.e2e import is_oom
from cs336_systems.bench.harness import summarize, synchronize
from cs336_systems.profiling.saved_tensors import saved_tensor_bytes
from cs336_systems.records.schema import ATTENTION_HEAD_DIMS, ATTENTION_SEQ_LENS

HEAD_DIMS, SEQ_LENS = ATTENTION_HEAD_DIMS, ATTENTION_SEQ_LENS  # the handout's grid


@dataclass(kw_only=True)
class AttentionBenchConfig:
    backend: str = "reference"
    compile: bool = False
    head_dim: int = 64
    seq_len: int = 1024
    batch_size: int = 8
    dtype: str = "fp32"
    causal: bool = True
    warmup: int = 5
    reps: int = 100
    device: str | None = None

    def __post_init__(self):
        get_attention_backend(self.backend)
        if min(self.head_dim, self.seq_len, self.batch_size, self.reps) < 1 or self.warmup < 0:
            raise ValueError("pytorch_attention: head_dim, seq_len, batch_size, reps must be >= 1, warmup >= 0")
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"pytorch_attention: unknown dtype {self.dtype!r}; choose fp32 or bf16")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float32 if self.dtype == "fp32" else torch.bfloat16


_COMPILED: dict[str, object] = {}


def attention_callable(backend: str, compile: bool):
    fn = get_attention_backend(backend)
    if not compile:
        return fn
    if backend not in _COMPILED:
        _COMPILED[backend] = torch.compile(fn)
    return _COMPILED[backend]


def saved_bytes_model(backend: str, causal: bool, dtype: torch.dtype = torch.float32, d: int = 16,
                      device: str = "cpu") -> dict[str, float]:
    """Bytes autograd saves for one (B=1) attention call, fitted as ``a * T^2 + b * T`` from two small T."""
    fn = get_attention_backend(backend)
    sizes = (16, 32)
    saved = []
    for t in sizes:
        q, k, v = (torch.randn(1, t, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        saved.append(saved_tensor_bytes(fn, q, k, v, causal))
    (t1, t2), (s1, s2) = sizes, saved
    # s = a t^2 + b t  =>  solve the 2x2 system
    a = (s2 / t2 - s1 / t1) / (t2 - t1)
    b = s1 / t1 - a * t1
    return {"bytes_per_score": a, "bytes_per_token": b}


def memory_accounting(cfg: AttentionBenchConfig, model: dict[str, float] | None = None) -> dict[str, float]:
    """Predicted memory (GiB) of one configuration: inputs/outputs/grads, saved-for-backward, and the
    largest score-sized temporaries alive at once during the forward."""
    model = model or saved_bytes_model(cfg.backend, cfg.causal, cfg.torch_dtype)
    b, t, d = cfg.batch_size, cfg.seq_len, cfg.head_dim
    elt = torch.finfo(cfg.torch_dtype).bits // 8
    qkv_out = 4 * b * t * d * elt
    saved = b * (model["bytes_per_score"] * t * t + model["bytes_per_token"] * t)
    one_score_matrix = b * t * t * elt
    return {"qkv_and_output_gib": qkv_out / 2**30, "saved_for_backward_gib": saved / 2**30,
            "one_score_matrix_gib": one_score_matrix / 2**30,
            "saved_score_matrices": model["bytes_per_score"] / elt,
            "predicted_before_backward_gib": (qkv_out + saved) / 2**30}


def run_attention_benchmark(cfg: AttentionBenchConfig) -> dict:
    device = cfg.torch_device
    record = {**asdict(cfg)}
    fn = attention_callable(cfg.backend, cfg.compile)
    q = k = v = out = grad = None
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        shape = (cfg.batch_size, cfg.seq_len, cfg.head_dim)
        q, k, v = (torch.randn(shape, device=device, dtype=cfg.torch_dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(shape, device=device, dtype=cfg.torch_dtype)
        for _ in range(cfg.warmup):
            fn(q, k, v, cfg.causal).backward(grad)
        synchronize(device)
        fwd = []
        for _ in range(cfg.reps):  # with autograd recording, as before a backward (and as compiled in warm-up)
            t0 = timeit.default_timer()
            fn(q, k, v, cfg.causal)
            synchronize(device)
            fwd.append(timeit.default_timer() - t0)
        bwd = []
        mem_before_backward = None
        for i in range(cfg.reps):
            out = fn(q, k, v, cfg.causal)
            synchronize(device)
            if i == 0 and device.type == "cuda":
                mem_before_backward = torch.cuda.memory_allocated(device) / 2**30
            t0 = timeit.default_timer()
            out.backward(grad)
            synchronize(device)
            bwd.append(timeit.default_timer() - t0)
            out = None
            q.grad = k.grad = v.grad = None
        record.update(status="ok", **{f"forward_{k_}": v_ for k_, v_ in summarize(fwd).items()},
                      **{f"backward_{k_}": v_ for k_, v_ in summarize(bwd).items()},
                      memory_before_backward_gib=mem_before_backward,
                      peak_memory_gib=(torch.cuda.max_memory_allocated(device) / 2**30
                                       if device.type == "cuda" else None))
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        record.update(status="OOM", error=str(err).splitlines()[0][:200])
    finally:
        del q, k, v, out, grad
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record
