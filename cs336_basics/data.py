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


def document_ids(token_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Document index of every position of packed sequences ``(..., T)``: 0 up to and including the first
    ``eos_id``, then 1 up to and including the next, and so on (an end-of-document token belongs to the document
    it ends). Passed as ``doc_ids`` to ``BasicsTransformerLM``, attention never crosses a document boundary."""
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"document_ids: token ids must be an integer tensor, got {token_ids.dtype}")
    is_eos = (token_ids == eos_id).to(torch.int32)
    return is_eos.cumsum(dim=-1, dtype=torch.int32) - is_eos  # EOS tokens strictly before each position
