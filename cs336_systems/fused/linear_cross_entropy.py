"""LM head + cross-entropy without the ``(N, V)`` logits: loss and both gradients in one pass.

``linear_cross_entropy(h, weight, targets)`` equals ``cross_entropy(h @ weight.T, targets)`` (mean over
tokens). The rows of ``h`` are taken ``chunk_rows`` at a time; each chunk's ``(chunk_rows, V)`` logits are
computed in fp32 (fp32 GEMM output on CUDA), and in the same pass turned into the loss and the gradient of
the logits ``(softmax - onehot) / N``, which two more GEMMs turn into the chunk's rows of ``dh`` and its
share of ``dW``. Every chunk holds whole vocabulary rows, so the log-sum-exp is exact in one pass (no
online rescaling, no second pass over the vocabulary) and nothing of size ``N x V`` is ever alive. The
gradients are computed in the forward (they are all backward needs), so backward only scales them by the
incoming gradient of the loss.

Memory beyond inputs and outputs: one chunk of fp32 logits (``chunk_rows * V * 4`` bytes, bounded by
``chunk_bytes``), ``dh`` (like ``h``) and ``dW`` (fp32 while it accumulates over chunks). Under autocast
``h`` and ``weight`` are cast to the autocast dtype first (a no-op for bf16 weights). Supported: any float
dtype on CPU and CUDA, ``h`` of shape ``(..., D)`` with ``targets`` of shape ``(...)``; not supported:
ignore-index, label smoothing, z-loss.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cs336_basics.nn_utils import cross_entropy

DEFAULT_CHUNK_BYTES = 1 << 30  # fp32 logits of one chunk: 1 GiB


_OUT_DTYPE_GEMM = True  # torch.mm(..., out_dtype=float32) on CUDA; off once a torch build lacks it


def _mm_fp32(a: Tensor, b: Tensor, acc: Tensor | None = None) -> Tensor:
    """a @ b (or acc += a @ b) with an fp32 (fp64) result. On CUDA a low-precision product is accumulated and
    written in fp32 by the GEMM itself; elsewhere it is rounded to its dtype, then widened."""
    global _OUT_DTYPE_GEMM
    wide = torch.float64 if a.dtype == torch.float64 else torch.float32
    if a.dtype == wide:
        return a @ b if acc is None else acc.addmm_(a, b)
    if a.is_cuda and _OUT_DTYPE_GEMM:
        try:
            if acc is None:
                return torch.mm(a, b, out_dtype=torch.float32)
            return torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        except (RuntimeError, TypeError):
            _OUT_DTYPE_GEMM = False
    return (a @ b).to(wide) if acc is None else acc.add_(a @ b)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, chunk_rows: int) -> Tensor:
        n = h.shape[0]
        acc_dtype = torch.float64 if h.dtype == torch.float64 else torch.float32
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.empty_like(h) if need_dh else None
        dw = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_dw else None
        loss = torch.zeros((), dtype=acc_dtype, device=h.device)
        wt = weight.t()
        for start in range(0, n, chunk_rows):
            hc, tc = h[start:start + chunk_rows], targets[start:start + chunk_rows]
            logits = _mm_fp32(hc, wt)  # (c, V), fp32
            lse = torch.logsumexp(logits, dim=-1)  # (c,)
            target_logit = logits.gather(1, tc[:, None]).squeeze(1)
            loss += (lse - target_logit).sum()
            if dh is None and dw is None:
                continue
            # d(mean loss)/d(logits) = (softmax - onehot) / N, computed in place over the logits buffer
            grad = logits.sub_(lse[:, None]).exp_()
            grad.scatter_add_(1, tc[:, None], torch.full_like(lse[:, None], -1.0))
            grad = grad.mul_(1.0 / n).to(h.dtype)
            if dh is not None:
                dh[start:start + chunk_rows] = grad @ weight
            if dw is not None:
                _mm_fp32(grad.t(), hc, acc=dw)
        ctx.save_for_backward(dh, None if dw is None else dw.to(weight.dtype))
        return (loss / n).to(torch.float32 if h.dtype != torch.float64 else h.dtype)

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        dh, dw = ctx.saved_tensors
        return (None if dh is None else dh * grad_loss.to(dh.dtype),
                None if dw is None else dw * grad_loss.to(dw.dtype), None, None)


def linear_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Tensor:
    """Mean cross-entropy of ``targets`` under the logits ``h @ weight.T``, never materialising the logits.

    h: ``(..., D)``; weight: ``(V, D)``; targets: ``(...)`` integer ids in ``[0, V)``. Returns a 0-dim fp32 loss
    (fp64 for fp64 inputs).
    """
    if h.shape[-1] != weight.shape[-1] or weight.dim() != 2:
        raise ValueError(f"linear_cross_entropy: h {tuple(h.shape)} and weight {tuple(weight.shape)} must be "
                         "(..., D) and (V, D)")
    if h.shape[:-1] != targets.shape:
        raise ValueError(f"linear_cross_entropy: h {tuple(h.shape)} does not match targets {tuple(targets.shape)}")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"linear_cross_entropy: targets must be integer ids, got {targets.dtype}")
    if chunk_bytes < 1:
        raise ValueError(f"linear_cross_entropy: chunk_bytes must be positive, got {chunk_bytes}")
    if torch.is_autocast_enabled(h.device.type):
        dtype = torch.get_autocast_dtype(h.device.type)
        h, weight = h.to(dtype), weight.to(dtype)
    elif h.dtype != weight.dtype:
        raise ValueError(f"linear_cross_entropy: h is {h.dtype} but weight is {weight.dtype} (outside autocast)")
    h2, t = h.reshape(-1, h.shape[-1]), targets.reshape(-1).long()
    chunk_rows = max(1, chunk_bytes // (4 * weight.shape[0]))
    with torch.autocast(h.device.type, enabled=False):
        return _LinearCrossEntropy.apply(h2, weight, t, chunk_rows)


class DeferredHead(nn.Module):
    """Stands in for a model's ``lm_head``: holds the same ``weight`` (state-dict keys unchanged) and returns its
    input, so the model returns final hidden states for :func:`linear_cross_entropy` to finish."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.weight = head.weight

    def forward(self, x: Tensor) -> Tensor:
        return x


def defer_lm_head(model: nn.Module) -> nn.Module:
    """Replace ``model.lm_head`` by a :class:`DeferredHead` in place; returns ``model``. The loss is then
    ``linear_cross_entropy(model(x), model.lm_head.weight, y)``."""
    head = getattr(model, "lm_head", None)
    if head is None or getattr(head, "weight", None) is None or getattr(head, "bias", None) is not None:
        raise ValueError("linear_cross_entropy: the model needs an `lm_head` with a weight and no bias")
    model.lm_head = DeferredHead(head)
    return model


def _cross_entropy_fp32(logits: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten().long())


def head_loss(compile: bool):
    """The unfused loss on the LM head's logits: ``cs336_basics.nn_utils.cross_entropy``, or with ``compile``
    (where the model is compiled) the same mean loss as PyTorch's log-softmax + NLL on the fp32-upcast logits,
    compiled: Inductor fuses the upcast, log-sum-exp and target pick into one kernel and the backward into
    ``softmax - onehot`` written once in the logits' dtype. Eager autograd of our loss, or Inductor on it (its
    ``amax`` and ``gather`` backward scatter into fp32 buffers), keeps two or more fp32 temporaries the size of the
    logits alive at the start of backward, where a step's memory peaks (small/512 on an H100:
    ``scripts/device/memory_peak.py``)."""
    if not compile:
        return cross_entropy
    compiled = torch.compile(_cross_entropy_fp32)

    def loss(logits: Tensor, targets: Tensor) -> Tensor:
        if logits.shape[:-1] != targets.shape:
            raise ValueError(f"cross_entropy: logits {tuple(logits.shape)} do not match targets "
                             f"{tuple(targets.shape)}")
        return compiled(logits, targets)

    return loss
