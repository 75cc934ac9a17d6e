"""The Triton RoPE kernel (``cs336_systems.fused.rope``) against an fp64 rotation: forward and gradient, odd
shapes, head dims that are not powers of two, both table layouts the model and the adapters use (Triton's
interpreter on CPU; the compiled model on the GPU)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernels are compiled: CPU runs them in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cs336_basics.model import BasicsTransformerLM, RotaryEmbedding
from cs336_systems.fused import rope as fused_rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rotate_fp64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x, cos, sin = x.double(), cos.double(), sin.double()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _case(shape, positions_shape, dtype, seed):
    """x of ``shape`` (..., T, H, Dh), random positions of ``positions_shape`` and the gathered tables."""
    gen = torch.Generator().manual_seed(seed)
    dim, context = shape[-1], 97
    rope = RotaryEmbedding(context, dim, device=DEVICE)
    x = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    positions = torch.randint(0, context, positions_shape, generator=gen).to(DEVICE).unsqueeze(-1)
    return rope, x, positions


@pytest.mark.parametrize("shape,positions_shape", [
    ((2, 7, 3, 16), (7,)),  # the model: one position row for every batch row and head
    ((3, 5, 5, 64), (3, 5)),  # positions per batch row
    ((1, 9, 2, 6), (9,)),  # a head dim that is not a power of two
    ((2, 3, 11, 4, 32), (3, 11)),  # broadcast over a leading dim
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_rope_matches_fp64_forward_and_gradient(shape, positions_shape, dtype, seed):
    rope, x, positions = _case(shape, positions_shape, dtype, seed)
    cos, sin = rope.cos[positions], rope.sin[positions]
    assert fused_rope._table_layout(tuple(x.shape), tuple(cos.shape)) is not None  # the kernel's path
    x.requires_grad_()
    ours, torch_path = fused_rope.rotate(x, cos, sin), rope(x, positions)  # rope(...) is the module's own path
    exact = _rotate_fp64(x.detach(), cos, sin)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE, dtype)
    (g_ours,) = torch.autograd.grad(ours, x, grad)
    (g_torch,) = torch.autograd.grad(torch_path, x, grad)
    g_exact = _rotate_fp64(grad, cos, -sin)  # the transpose of a rotation: minus the angle
    for mine, theirs, ref in ((ours, torch_path, exact), (g_ours, g_torch, g_exact)):
        assert mine.dtype == dtype and mine.shape == x.shape
        # fp32 arithmetic and one rounding to the dtype either way: at most twice PyTorch's own error, plus an
        # fp32 ulp of slack for contractions into fused multiply-adds
        err, torch_err = (mine.double() - ref).abs().max().item(), (theirs.double() - ref).abs().max().item()
        bound = 2 * torch_err + 4e-7
        if dtype == torch.bfloat16 and not x.is_cuda:  # the interpreter truncates fp32 -> bf16: up to one ulp
            bound = max(bound, 2**-7 * ref.abs().max().item())
        assert err <= bound, (err, torch_err)


def test_triton_rope_non_contiguous_input_and_gradient(seed):
    rope, x, positions = _case((2, 4, 7, 32), (7,), torch.bfloat16, seed)  # (B, H, T, Dh) storage
    x = x.transpose(1, 2).requires_grad_()  # (B, T, H, Dh) view, as attention's gradients arrive
    cos, sin = rope.cos[positions], rope.sin[positions]
    out = fused_rope.rotate(x, cos, sin)
    grad = torch.randn(2, 4, 7, 32, generator=torch.Generator().manual_seed(seed)).to(DEVICE, torch.bfloat16)
    (g,) = torch.autograd.grad(out, x, grad.transpose(1, 2))
    for mine, ref in ((out, _rotate_fp64(x.detach(), cos, sin)), (g, _rotate_fp64(grad.transpose(1, 2), cos, -sin))):
        torch.testing.assert_close(mine.double(), ref, rtol=2**-7, atol=1e-6)  # within a bf16 ulp


def test_triton_rope_unaligned_16bit_input_takes_the_row_kernel(seed):
    rope, x, positions = _case((2, 5, 3, 8), (5,), torch.bfloat16, seed)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device=DEVICE)[1:].view(x.shape)  # 2-byte aligned rows
    shifted.copy_(x)
    assert shifted.data_ptr() % 4 == 2 and shifted.storage_offset() == 1
    cos, sin = rope.cos[positions], rope.sin[positions]
    torch.testing.assert_close(fused_rope.rotate(shifted, cos, sin).double(), _rotate_fp64(x, cos, sin),
                               rtol=2**-7, atol=1e-6)


def test_triton_rope_table_layouts():
    layout = fused_rope._table_layout
    assert layout((4, 8, 5, 64), (8, 1, 32)) == 5  # the model's (T, 1, Dh/2) tables
    assert layout((4, 8, 5, 64), (4, 8, 1, 32)) == 5
    assert layout((4, 5, 8, 64), (8, 32)) == 1  # (B, H, T, Dh) with (T, Dh/2): the adapters' layout
    assert layout((4, 8, 5, 64), (1, 8, 1, 32)) == 5
    assert layout((4, 8, 5, 64), (4, 1, 1, 32)) == 40  # one angle per batch row
    assert layout((4, 8, 5, 64), (4, 1, 5, 32)) is None  # per (batch, head), broadcast over T: PyTorch path
    assert layout((8, 64), (2, 8, 32)) is None


def test_triton_rope_other_layouts_take_the_pytorch_path(seed):
    rope, x, positions = _case((2, 3, 5, 8), (2, 1, 5), torch.float32, seed)
    positions = positions.squeeze(-1)  # (2, 1, 5): one angle per (batch, position), broadcast over dim 1
    cos, sin = rope.cos[positions], rope.sin[positions]  # (2, 1, 5, 4)
    assert fused_rope._table_layout(tuple(x.shape), tuple(cos.shape)) is None
    torch.testing.assert_close(fused_rope.rotate(x, cos, sin), _rotate_fp64(x, cos, sin).float())


def test_use_triton_rope_gives_the_models_logits_and_gradients(seed):
    torch.manual_seed(seed)
    kwargs = dict(vocab_size=64, context_length=24, d_model=48, num_layers=2, num_heads=3, d_ff=64,
                  device=DEVICE)
    ref, ours = BasicsTransformerLM(**kwargs), BasicsTransformerLM(**kwargs)
    ours.load_state_dict(ref.state_dict())
    assert fused_rope.use_triton_rope(ours) == 1  # one table, shared by the blocks
    tokens = torch.randint(0, 64, (2, 19), device=DEVICE)
    a, b = ref(tokens), ours(tokens)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.square().mean().backward()
    b.square().mean().backward()
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.gpu
def test_gpu_compiled_model_with_triton_rope_matches_eager(seed):
    torch.manual_seed(seed)
    kwargs = dict(vocab_size=512, context_length=256, d_model=256, num_layers=2, num_heads=4, d_ff=512,
                  device="cuda", check_inputs=False)
    ref, ours = BasicsTransformerLM(**kwargs), BasicsTransformerLM(**kwargs)
    ours.load_state_dict(ref.state_dict())
    fused_rope.use_triton_rope(ours)
    compiled = torch.compile(ours, fullgraph=True)
    tokens = torch.randint(0, 512, (3, 200), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = ref(tokens).float(), compiled(tokens).float()
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)  # bf16 matmuls, fused differently by the compiler
    a.square().mean().backward()
    b.square().mean().backward()
    for p, q in zip(ref.parameters(), ours.parameters(), strict=True):
        assert torch.isfinite(q.grad).all()
        assert torch.nn.functional.cosine_similarity(q.grad.flatten(), p.grad.flatten(), dim=0) > 0.999
