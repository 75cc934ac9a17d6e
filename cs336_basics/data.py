"""Random language-modelling batches from a 1-D array of token ids (an ``np.memmap`` works)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch


def get_batch(
    dataset: npt.NDArray, batch_size: int, context_length: int, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` windows; return inputs and next-token targets, each ``(batch, context)`` int64.

    Only the sampled windows are read, so a multi-GB memmap is never loaded whole.
    """
    if dataset.ndim != 1:
        raise ValueError(f"get_batch: dataset must be 1-D, got shape {dataset.shape}")
    if batch_size < 1 or context_length < 1:
        raise ValueError(f"get_batch: batch_size and context_length must be >= 1, got {batch_size}, {context_length}")
    if len(dataset) < context_length + 1:
        raise ValueError(
            f"get_batch: dataset of {len(dataset)} tokens is too short for context_length {context_length}"
        )
    starts = np.random.randint(0, len(dataset) - context_length, size=batch_size)
    idx = starts[:, None] + np.arange(context_length + 1)[None, :]
    window = torch.from_numpy(np.asarray(dataset[idx]).astype(np.int64))  # (B, T+1)
    x, y = window[:, :-1], window[:, 1:]
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous().to(device), y.contiguous().to(device)
