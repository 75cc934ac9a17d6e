"""Activation (gradient) checkpointing applied to a finished ``BasicsTransformerLM`` from outside.

The model knows nothing of checkpointing: :func:`apply_activation_checkpointing` replaces the
entries of ``model.layers`` with wrapper modules that run a group of blocks under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``. The model's forward loop
(``for layer in self.layers: x = layer(x, positions)``) is unchanged.

Strategies (``spec``):

* ``"none"``: leave the model alone.
* ``"<k>"`` (a positive integer): checkpoint every group of ``k`` consecutive blocks. Forward keeps
  only the group inputs (N/k residual-stream tensors); backward recomputes one group at a time, so the
  peak activation memory is about ``N/k * |x| + k * R`` (``R``: residuals of one block), smallest near
  ``k = sqrt(N * |x| / R)``; compute is one extra forward.
* ``"nested"``: recursive bisection. Each half of a segment is checkpointed, and inside the
  recomputation of a half its two quarters are checkpointed again, down to single blocks. At any time
  only O(log N) segment inputs plus one block's residuals are alive: O(log N) peak activation memory
  for O(N log N) forward compute (each block is recomputed once per level of the recursion).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


def _run_blocks(blocks: nn.ModuleList | list[nn.Module], x: Tensor, positions: Tensor | None) -> Tensor:
    for block in blocks:
        x = block(x, positions)
    return x


class CheckpointedBlocks(nn.Module):
    """A group of consecutive Transformer blocks run under one non-reentrant checkpoint."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: Tensor, token_positions: Tensor | None = None) -> Tensor:
        if not torch.is_grad_enabled():  # inference: nothing is saved anyway
            return _run_blocks(self.blocks, x, token_positions)
        return checkpoint(_run_blocks, self.blocks, x, token_positions, use_reentrant=False)


class NestedCheckpointedBlocks(nn.Module):
    """All blocks under recursive bisection checkpointing (O(log N) live segment inputs)."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def _segment(self, lo: int, hi: int, x: Tensor, positions: Tensor | None) -> Tensor:
        if hi - lo == 1:
            return self.blocks[lo](x, positions)
        mid = (lo + hi) // 2
        x = checkpoint(self._segment, lo, mid, x, positions, use_reentrant=False)
        return checkpoint(self._segment, mid, hi, x, positions, use_reentrant=False)

    def forward(self, x: Tensor, token_positions: Tensor | None = None) -> Tensor:
        if not torch.is_grad_enabled():
            return _run_blocks(self.blocks, x, token_positions)
        return self._segment(0, len(self.blocks), x, token_positions)


def parse_checkpoint_spec(spec: str | int | None) -> str:
    """Normalise a strategy: ``None``/``"none"``/``0`` -> ``"none"``; ``"nested"``; a positive int -> its string."""
    if spec is None:
        return "none"
    s = str(spec).strip().lower()
    if s in ("none", "0", ""):
        return "none"
    if s == "nested":
        return s
    if s.isdigit() and int(s) >= 1:
        return str(int(s))
    raise ValueError(f"gradient_checkpointing: unknown strategy {spec!r}; use 'none', 'nested' or a positive "
                     "integer k (checkpoint every k blocks)")


def apply_activation_checkpointing(model: nn.Module, spec: str | int | None) -> nn.Module:
    """Wrap ``model.layers`` in place according to ``spec`` (see the module docstring); returns ``model``."""
    spec = parse_checkpoint_spec(spec)
    if spec == "none":
        return model
    if not isinstance(getattr(model, "layers", None), nn.ModuleList):
        raise ValueError("gradient_checkpointing: the model has no ModuleList `layers` of blocks to wrap")
    blocks = list(model.layers)
    if spec == "nested":
        model.layers = nn.ModuleList([NestedCheckpointedBlocks(blocks)])
        return model
    k = int(spec)
    if k > len(blocks):
        raise ValueError(f"gradient_checkpointing: k={k} exceeds the number of blocks ({len(blocks)})")
    model.layers = nn.ModuleList(CheckpointedBlocks(blocks[i:i + k]) for i in range(0, len(blocks), k))
    return model
