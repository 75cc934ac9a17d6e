"""The fastest measured settings of a training step, in one place for ``bench`` and ``train``.

``fast_settings(device, vocab_size, d_model, tokens)`` returns what to use unless the user says otherwise: on CUDA
the settings that measured fastest on an H100 against the compiled plain-PyTorch peer (``bench --impl ours
peer``; records in ``results/training_step/``), on a CPU the reference path (no compiler, no Triton; the CPU is for
correctness, not speed). Precision is not a speed setting here: it changes the numerics, so it stays the
caller's choice; the fused optimizer keeps bf16 weight copies only under bf16. The residual stream's dtype
under bf16 is one: bf16 where the fused optimizer applies, as Megatron-LM and torchtitan run it (the
300-step loss check in ``results/training_step/`` holds it to the fp32-residual run's loss).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

# the residual stream's dtype under bf16 (the names of bench's and train's --residual-dtype): autocast's fp32, or
# bf16 with the token embedding a bf16 copy in the fused optimizer (cs336_systems.fused.adamw.is_compute_weight)
RESIDUAL_DTYPES = ("fp32", "bf16")
# RoPE's kernel (the names of bench's and train's --rope): the model's PyTorch code (compiled or eager), or
# cs336_systems.fused.rope's Triton kernel (CUDA)
ROPE_KERNELS = ("torch", "triton")
# the SwiGLU feed-forward (the names of bench's and train's --ffn): the model's PyTorch code (compiled or eager), or
# cs336_systems.fused.swiglu (the elementwise passes in the matmuls' epilogues; Gluon kernels on Hopper)
FFN_KERNELS = ("torch", "fused")
# cuBLAS's workspace (the names of bench's and train's --cublas-workspace): PyTorch's default, or none
# (CUBLAS_WORKSPACE_CONFIG=:0:0), where cuBLAS picks GEMM algorithms that need no workspace and issues no memset
# of it before each call (apply_cublas_workspace)
CUBLAS_WORKSPACES = ("default", "none")
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"


@dataclass(frozen=True, kw_only=True)
class FastSettings:
    attention: str  # attention backend name (cs336_basics.attention)
    compile: bool  # torch.compile
    compile_scope: str  # "model" (one graph) or "blocks" (regional: each block, shared graph)
    optimizer: str  # "ours", "torch-fused" or "fused" (cs336_systems.fused.adamw.FusedAdamW)
    loss: str  # "unfused" (LM head, then cross_entropy) or "fused" (cs336_systems.fused.linear_cross_entropy)
    cuda_graph: bool  # the whole step as one CUDA graph (cs336_systems.step_graph; needs optimizer "fused")
    residual_dtype: str  # one of RESIDUAL_DTYPES; applies under bf16 with optimizer "fused"
    rope: str  # one of ROPE_KERNELS
    ffn: str  # one of FFN_KERNELS
    cublas_workspace: str  # one of CUBLAS_WORKSPACES (apply_cublas_workspace)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


# Attention "flash_auto" (cs336_systems.attention.auto): per shape, the fastest of our kernel and SDPA's backends
# measured on this GPU model. On an H100 with torch 2.11 that is SDPA's cuDNN backend at every model shape, which
# SDPA's own dispatch already picks there (so the two run the same kernels: xl/2048 240.4 vs 240.5 ms a step);
# the table keeps the choice measured where a version or GPU dispatches otherwise.
# The bf16 residual stream: xl/2048 230.5 ms and 50.9 GiB against 236.2 ms and 53.2 GiB with the fp32 one (H100,
# same bench run, each in its own process: results/training_step/20261124-205737-*).
# RoPE's Triton kernel: 76 us of kernels for q and k, forward and backward, at xl/2048 against Inductor's 109 (H100,
# same process: scripts/device/rope_bench.py), about 1.5 ms of kernel time a step; whole steps within their noise
# (xl/2048 228.3 vs 228.2 ms, std 4: results/training_step/20261124-223043-*; docs/training_step.md, session 15).
# No cuBLAS workspace: at xl/2048 on an H100 most of the step's GEMMs came with a memset of the workspace (674 a
# step, each with a graph node's gap before it: 1.7 ms); without one the captured step measured 223.7 against 228.0
# ms, median of 20 replays each, same lease (scripts/device/graph_step_profile.py --variant noworkspace / base;
# docs/training_step.md, session 25).
# The fused LM head + loss measured slower than the compiled unfused one at vocabulary 10,000 (small/512 on an
# H100, same run: 28.8 vs 25.8 ms per step), where the logits are small; it is what lets large vocabularies fit
# (8b: 151,936 x 65,536 tokens, 18.5 GiB of bf16 logits). The threshold between the two is a judgement, not a
# measurement.
FUSED_LOSS_MIN_VOCAB = 32_768
# The fused SwiGLU feed-forward (H100, bench's defaults otherwise, 12 warm-up steps and 20 timed, one process each,
# same lease: results/training_step/20261127-170450-*, -170926-*, -173001-*): xl/2048 (8,192 tokens a step,
# d_model 1,600) 227.1 against 229.6 ms; xl/512 (2,048 tokens) 71.0 against 71.1, and 70.8 against 71.0 with the
# backward's five-stage ring; small/512 (d_model 768) 6.96 against 6.54. Its kernels win where the GEMMs are large
# (docs/training_step.md, session 29), so it is the default there only.
FUSED_FFN_MIN_TOKENS = 8_192
FUSED_FFN_MIN_D_MODEL = 1_600


def _fused_ffn_applies(device: torch.device, d_model: int | None, tokens: int | None) -> bool:
    """Whether the fused feed-forward is the fast pick: a Hopper GPU (its kernels' architecture) and a step at least
    as large as where it measured faster."""
    if d_model is None or tokens is None or d_model < FUSED_FFN_MIN_D_MODEL or tokens < FUSED_FFN_MIN_TOKENS:
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def fast_settings(device: torch.device | str | None = None, vocab_size: int | None = None,
                  d_model: int | None = None, tokens: int | None = None) -> FastSettings:
    """The fastest measured settings for ``device`` (default: cuda if available), a model's vocabulary and width,
    and the tokens of one step on one device (batch x context); the last three are optional (None: the settings
    that depend on them take their general pick)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        loss = "fused" if vocab_size is not None and vocab_size >= FUSED_LOSS_MIN_VOCAB else "unfused"
        ffn = "fused" if _fused_ffn_applies(device, d_model, tokens) else "torch"
        return FastSettings(attention="flash_auto", compile=True, compile_scope="model", optimizer="fused",
                            loss=loss, cuda_graph=True, residual_dtype="bf16", rope="triton", ffn=ffn,
                            cublas_workspace="none")
    return FastSettings(attention="reference", compile=False, compile_scope="model", optimizer="ours", loss="unfused",
                        cuda_graph=False, residual_dtype="fp32", rope="torch", ffn="torch",
                        cublas_workspace="default")


def apply_cublas_workspace(choice: str, *, where: str = "cublas_workspace") -> str:
    """Make this process's cuBLAS use ``choice``'s workspace; returns the ``CUBLAS_WORKSPACE_CONFIG`` in force
    ("" for PyTorch's default). PyTorch reads the variable once, when the process's first cuBLAS call sizes the
    workspace, so this must run before any matmul on the GPU (child processes inherit it). A value the user set
    is kept: "none" only fills it in where it is unset, and not under ``torch.use_deterministic_algorithms(True)``
    (whose cuBLAS check accepts only ":4096:8" and ":16:8"); "default" changes nothing."""
    if choice not in CUBLAS_WORKSPACES:
        raise ValueError(f"{where}: unknown cuBLAS workspace {choice!r}; choose from {', '.join(CUBLAS_WORKSPACES)}")
    if choice == "none" and not torch.are_deterministic_algorithms_enabled():
        os.environ.setdefault(CUBLAS_WORKSPACE_ENV, ":0:0")
    return os.environ.get(CUBLAS_WORKSPACE_ENV, "")
