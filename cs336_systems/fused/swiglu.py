"""The SwiGLU feed-forward with its elementwise work inside the matmuls (``--ffn fused``; CUDA, Hopper).

``use_fused_swiglu(model)`` makes every ``cs336_basics.model.SwiGLU`` compute ``w2(silu(w1 x) * w3 x)`` with
:func:`swiglu_ffn`: the forward's ``a = x W1^T`` and ``b = x W3^T`` come from one warp-specialised dual GEMM that
writes ``h = silu(a) * b`` (and a, b for the backward) from its registers, and the backward's ``dh = dy W2`` from a
GEMM whose epilogue reads a and b and writes ``da`` and ``db``, so neither h's elementwise pass nor dh's round trip
through memory is left (``cs336_systems.fused.swiglu_gemm``). The remaining matmuls (``y = h W2^T``, dx, dW1, dW2,
dW3) stay cuBLAS's. The two kernels are ``torch.library`` custom ops, so ``torch.compile`` keeps them
as calls in its graph and a captured step replays them.

Arithmetic: a, b and dh are rounded to the input dtype as the unfused path stores them; silu, the product and the
gradients run in fp32 and are rounded once (as Inductor's fused elementwise kernels do). Where the Gluon kernels do
not apply (not sm_90, fp32, misaligned rows: ``swiglu_gemm.supported``), the same ops run that arithmetic with
PyTorch: the CPU tests check the autograd wiring with it, the GPU tests the kernels against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cs336_basics.model import SwiGLU
from cs336_systems.fused import install_kernel


def _gluon():
    """The Gluon kernels' module, or None where this Triton has no Gluon Hopper dialect."""
    try:
        from cs336_systems.fused import swiglu_gemm
    except ImportError:  # pragma: no cover - Triton without triton.experimental.gluon
        return None
    return swiglu_gemm


def _up(t: Tensor) -> Tensor:
    """``t`` in the elementwise arithmetic's dtype: fp32, or fp64 for fp64 inputs."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _gate_reference(x: Tensor, w1: Tensor, w3: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    a, b = x @ w1.T, x @ w3.T
    return (F.silu(_up(a)) * _up(b)).to(x.dtype), a, b


def _gate_backward_reference(dy: Tensor, w2: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    dh = _up(dy @ w2)
    af, bf = _up(a), _up(b)
    sig = torch.sigmoid(af)
    return (dh * bf * sig * (1 + af * (1 - sig))).to(a.dtype), (dh * af * sig).to(b.dtype)


@torch.library.custom_op("cs336_systems::swiglu_gate", mutates_args=())
def swiglu_gate(x: Tensor, w1: Tensor, w3: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(h, a, b) for x (M, d_model), w1 and w3 (d_ff, d_model): a = x W1^T, b = x W3^T, h = silu(a) * b."""
    kernels = _gluon()
    if kernels is not None and kernels.supported(x, w1, w3):
        return kernels.dual_swiglu(x, w1, w3)
    return _gate_reference(x, w1, w3)


@swiglu_gate.register_fake
def _(x: Tensor, w1: Tensor, w3: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    shape = (x.shape[0], w1.shape[0])
    return x.new_empty(shape), x.new_empty(shape), x.new_empty(shape)


@torch.library.custom_op("cs336_systems::swiglu_gate_backward", mutates_args=())
def swiglu_gate_backward(dy: Tensor, w2: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """(da, db) of h = silu(a) * b where dh = dy W2; dy (M, d_model), w2 (d_model, d_ff), a and b (M, d_ff)."""
    kernels = _gluon()
    if kernels is not None and kernels.supported(dy, w2, a, b):
        return kernels.swiglu_backward(dy, w2, a, b)
    return _gate_backward_reference(dy, w2, a, b)


@swiglu_gate_backward.register_fake
def _(dy: Tensor, w2: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(a), torch.empty_like(b)


@torch.library.custom_op("cs336_systems::swiglu_input_grad", mutates_args=())
def swiglu_input_grad(da: Tensor, w1: Tensor, db: Tensor, w3: Tensor) -> Tensor:
    """dx = da W1 + db W3, the second product accumulated into the first's output (cuBLAS's beta = 1). Written as
    ``torch.addmm(da @ w1, db, w3)`` (in eager code or compiled), the first product is first copied into a new
    output: a 26 MB copy a block at xl/2048 (session 30's profile, ``memcpy128``)."""
    return (da @ w1).addmm_(db, w3)


@swiglu_input_grad.register_fake
def _(da: Tensor, w1: Tensor, db: Tensor, w3: Tensor) -> Tensor:
    return da.new_empty(da.shape[0], w1.shape[1])


class _SwiGLUFFN(torch.autograd.Function):
    """y = (silu(x W1^T) * (x W3^T)) W2^T on 2-D x, saving x, h, a and b."""

    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
        h, a, b = swiglu_gate(x, w1, w3)
        ctx.save_for_backward(x, w1, w2, w3, h, a, b)
        return h @ w2.T

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w1, w2, w3, h, a, b = ctx.saved_tensors
        dy = dy.contiguous()
        da, db = swiglu_gate_backward(dy, w2, a, b)
        return swiglu_input_grad(da, w1, db, w3), da.T @ x, dy.T @ h, db.T @ x


def swiglu_ffn(x: Tensor, w1: Tensor, w2: Tensor, w3: Tensor) -> Tensor:
    """``SwiGLU.forward``'s result for x (..., d_model) and the module's weights w1, w3 (d_ff, d_model) and w2
    (d_model, d_ff). Under autocast the operands are cast to its dtype first, as its matmuls would cast them."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        x, w1, w2, w3 = (t.to(dtype) for t in (x, w1, w2, w3))
    lead = x.shape[:-1]
    y = _SwiGLUFFN.apply(x.reshape(-1, x.shape[-1]).contiguous(), w1, w2, w3)
    return y.reshape(*lead, w2.shape[0])


def use_fused_swiglu(model: nn.Module) -> int:
    """Make every ``SwiGLU`` in ``model`` compute with :func:`swiglu_ffn`; returns how many it found."""
    return install_kernel(model, SwiGLU, swiglu_ffn)
