"""The fastest measured settings of a training step, in one place for ``bench`` and ``train``.

``fast_settings(device)`` returns what to use unless the user says otherwise: on CUDA the settings that
measured fastest on an H100 against the compiled plain-PyTorch peer (``bench --impl ours peer``; records
in ``results/training_step/``), on a CPU the reference path (no compiler, no Triton; the CPU is for
correctness, not speed). Precision is not a speed setting here: it changes the numerics, so it stays the
caller's choice; the fused optimizer keeps bf16 weight copies only under bf16.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class FastSettings:
    attention: str  # attention backend name (cs336_basics.attention)
    compile: bool  # torch.compile
    compile_scope: str  # "model" (one graph) or "blocks" (regional: each block, shared graph)
    optimizer: str  # "ours", "torch-fused" or "fused" (cs336_systems.fused.adamw.FusedAdamW)
    loss: str  # "unfused" (LM head, then cross_entropy) or "fused" (cs336_systems.fused.linear_cross_entropy)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


def fast_settings(device: torch.device | str | None = None) -> FastSettings:
    """The fastest measured settings for ``device`` (default: cuda if available)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return FastSettings(attention="sdpa", compile=True, compile_scope="blocks", optimizer="fused", loss="fused")
    return FastSettings(attention="reference", compile=False, compile_scope="model", optimizer="ours", loss="unfused")
