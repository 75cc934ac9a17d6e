"""Activation (gradient) checkpointing applied to a finished ``BasicsTransformerLM`` from outside.

The model knows nothing of checkpointing: :func:`apply_activation_checkpointing` replaces the
entries of ``model.layers`` with wrapper modules that run a group of blocks under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``. The model's forward loop
(``for layer in self.layers: x = layer(x, positions[, doc_ids])``) is unchanged; the wrappers pass
``doc_ids`` (packed documents) on to their blocks.

Strategies (``spec``):

* ``"none"``: leave the model alone.
* ``"<k>"`` (a positive integer): checkpoint every group of ``k`` consecutive blocks. Forward keeps
  only the group inputs (N/k residual-stream tensors); backward recomputes one group at a time, so the
  peak activation memory is about ``N/k * |x| + k * R`` (``R``: residuals of one block), smallest near
  ``k = sqrt(N * |x| / R)``; compute is one extra forward.
* ``"selective"``: every block under its own checkpoint with a selective policy
  (:func:`save_matmuls_policy`): the outputs of matrix products and of the attention kernel are saved,
  everything else (norms, RoPE, SiLU and gating, residual adds, dtype casts) is recomputed in backward.
  The saved tensors are the expensive-to-recompute ones; the recomputed ones are cheap elementwise work
  whose fp32 temporaries are most of a block's saved bytes under autocast.
* ``"nested"``: recursive bisection. Each half of a segment is checkpointed, and inside the
  recomputation of a half its two quarters are checkpointed again, down to single blocks. At any time
  only O(log N) segment inputs plus one block's residuals are alive: O(log N) peak activation memory
  for O(N log N) forward compute (each block is recomputed once per level of the recursion).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

STRATEGIES = ("none", "selective", "nested", "<k>")

_aten = torch.ops.aten
# Outputs worth keeping: compute-bound to recompute, and only as large as the activations they produce.
SAVED_OPS = frozenset(getattr(_aten, name).default for name in (
    "mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward")
    if hasattr(_aten, name))


def save_matmuls_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Selective checkpointing policy: save matmul and attention outputs, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    """The ``context_fn`` for ``torch.utils.checkpoint.checkpoint`` that applies :func:`save_matmuls_policy`."""
    return create_selective_checkpoint_contexts(save_matmuls_policy)


def _run_blocks(blocks: nn.ModuleList | list[nn.Module], x: Tensor, positions: Tensor | None,
                doc_ids: Tensor | None = None) -> Tensor:
    for block in blocks:
        x = block(x, positions) if doc_ids is None else block(x, positions, doc_ids)
    return x


class CheckpointedBlocks(nn.Module):
    """A group of consecutive Transformer blocks run under one non-reentrant checkpoint."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: Tensor, token_positions: Tensor | None = None, doc_ids: Tensor | None = None) -> Tensor:
        if not torch.is_grad_enabled():  # inference: nothing is saved anyway
            return _run_blocks(self.blocks, x, token_positions, doc_ids)
        return checkpoint(_run_blocks, self.blocks, x, token_positions, doc_ids, use_reentrant=False)


class SelectiveCheckpointedBlock(nn.Module):
    """One Transformer block under a selective checkpoint (:func:`save_matmuls_policy`)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.blocks = nn.ModuleList([block])

    def forward(self, x: Tensor, token_positions: Tensor | None = None, doc_ids: Tensor | None = None) -> Tensor:
        if not torch.is_grad_enabled():
            return _run_blocks(self.blocks, x, token_positions, doc_ids)
        return checkpoint(_run_blocks, self.blocks, x, token_positions, doc_ids, use_reentrant=False,
                          context_fn=selective_context)


class NestedCheckpointedBlocks(nn.Module):
    """All blocks under recursive bisection checkpointing (O(log N) live segment inputs)."""

    def __init__(self, blocks: list[nn.Module]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def _segment(self, lo: int, hi: int, x: Tensor, positions: Tensor | None, doc_ids: Tensor | None) -> Tensor:
        if hi - lo == 1:
            return _run_blocks(self.blocks[lo:hi], x, positions, doc_ids)
        mid = (lo + hi) // 2
        x = checkpoint(self._segment, lo, mid, x, positions, doc_ids, use_reentrant=False)
        return checkpoint(self._segment, mid, hi, x, positions, doc_ids, use_reentrant=False)

    def forward(self, x: Tensor, token_positions: Tensor | None = None, doc_ids: Tensor | None = None) -> Tensor:
        if not torch.is_grad_enabled():
            return _run_blocks(self.blocks, x, token_positions, doc_ids)
        return self._segment(0, len(self.blocks), x, token_positions, doc_ids)


def parse_checkpoint_spec(spec: str | int | None) -> str:
    """Normalise a strategy: ``None``/``"none"``/``0`` -> ``"none"``; ``"selective"``; ``"nested"``; a positive
    int -> its string."""
    if spec is None:
        return "none"
    s = str(spec).strip().lower()
    if s in ("none", "0", ""):
        return "none"
    if s in ("nested", "selective"):
        return s
    if s.isdigit() and int(s) >= 1:
        return str(int(s))
    raise ValueError(f"gradient_checkpointing: unknown strategy {spec!r}; use 'none', 'selective', 'nested' or a "
                     "positive integer k (checkpoint every k blocks)")


def own_state_names(model: nn.Module, wrap: Callable[[nn.Module], object]) -> dict[str, str]:
    """Run ``wrap(model)`` (which puts blocks inside checkpoint wrappers, renaming ``layers.3.x`` to
    ``layers.3.blocks.0.x``) and return wrapped state-dict key -> the model's own key, matched by tensor."""
    own = {id(t): k for k, t in model.state_dict(keep_vars=True).items()}
    wrap(model)
    return {k: own[id(t)] for k, t in model.state_dict(keep_vars=True).items()}


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
    if spec == "selective":
        model.layers = nn.ModuleList(SelectiveCheckpointedBlock(b) for b in blocks)
        return model
    k = int(spec)
    if k > len(blocks):
        raise ValueError(f"gradient_checkpointing: k={k} exceeds the number of blocks ({len(blocks)})")
    model.layers = nn.ModuleList(CheckpointedBlocks(blocks[i:i + k]) for i in range(0, len(blocks), k))
    return model
