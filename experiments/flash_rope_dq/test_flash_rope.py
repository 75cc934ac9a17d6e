# Snapshot of tests/test_flash_rope.py at 159053a (session 31): see README.md here.
"""RoPE and our attention as one op (``cs336_systems.attention.flash_rope``): dQ's inverse rotation inside the
attention backward's dQ postprocess, against fp64 references and against RoPE's kernel followed by our attention,
in the model too (Triton's interpreter on CPU; the compiled model on the GPU)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before the kernels are compiled: CPU runs them in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cs336_basics.model import BasicsTransformerLM, RotaryEmbedding, rotate_pairs
from cs336_systems.attention import flash_rope
from cs336_systems.attention.flash_triton import flash_attention
from cs336_systems.fused.rope import rotate, use_triton_rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(b, n, h, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(b, n, h, d, generator=gen).to(DEVICE, dtype) for _ in range(4))
    rope = RotaryEmbedding(n + 5, d, device=DEVICE)
    positions = torch.randperm(n + 5, generator=gen)[:n].to(DEVICE)  # any positions, one per token
    return q, k, v, grad.transpose(1, 2), rope.cos[positions].contiguous(), rope.sin[positions].contiguous()


def _reference(q, k, v, cos, sin):
    """fp64: RoPE on q and k (B, N, H, d), causal softmax attention, out (B, H, N, d)."""
    q, k = (rotate_pairs(t.double(), cos.double()[:, None], sin.double()[:, None]) for t in (q, k))
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.double().transpose(1, 2),
                                          is_causal=True)


def _grads(fn, q, k, v, grad, *tables):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, *tables)
    return (out, *torch.autograd.grad(out, (q, k, v), grad.to(out.dtype)))


# (2, 37, 3, 16): 18 backward programs, the three-kernel backward whose dQ postprocess rotates; (1, 20, 1, 16):
# two programs, the single-kernel backward (small calls), which rotates dQ after the kernel
@pytest.mark.parametrize("shape", [(2, 37, 3, 16), (1, 20, 1, 16), (2, 65, 2, 32)])
def test_rope_attention_matches_fp64(shape, seed):
    q, k, v, grad, cos, sin = _inputs(*shape, torch.float32, seed)
    ours = _grads(flash_rope.RopeFlashAttention.apply, q, k, v, grad, cos, sin)
    exact = _grads(_reference, q.double(), k.double(), v.double(), grad.double(), cos, sin)
    unfused = _grads(lambda q, k, v, c, s: flash_attention(*(t.transpose(1, 2) for t in (
        rotate(q, c[:, None], s[:, None]), rotate(k, c[:, None], s[:, None]), v)), True), q, k, v, grad, cos, sin)
    for name, mine, theirs, ref in zip(("out", "dq", "dk", "dv"), ours, unfused, exact, strict=True):
        assert mine.shape == theirs.shape and mine.dtype == torch.float32, name
        # fp32 kernels, one fp32 rounding fewer in dQ than RoPE's separate pass: within a few fp32 ulps of the
        # unfused path's error against fp64 (the unfused path's own error sets the scale)
        err, unfused_err = (mine.double() - ref).abs().max().item(), (theirs.double() - ref).abs().max().item()
        assert err <= 2 * unfused_err + 1e-6, (name, err, unfused_err)


def test_rope_attention_in_the_model_matches_the_unfused_model(seed):
    """A tiny LM with our attention: RoPE's kernel then attention, against the fused op (use_flash_rope);
    the loss and every parameter's gradient agree in fp32."""
    kw = dict(vocab_size=97, context_length=32, d_model=48, num_layers=2, num_heads=3, d_ff=64, rope_theta=10000.0)
    torch.manual_seed(0)
    a = BasicsTransformerLM(**kw, attention_backend="flash_triton", device=DEVICE)
    b = BasicsTransformerLM(**kw, attention_backend="flash_triton", device=DEVICE)
    b.load_state_dict(a.state_dict())
    use_triton_rope(a)
    use_triton_rope(b)
    assert flash_rope.use_flash_rope(b) == 2 and flash_rope.use_flash_rope(a.lm_head) == 0
    x = torch.randint(0, 97, (2, 31), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    losses = []
    for model in (a, b):
        loss = F.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten())
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_use_flash_rope_leaves_other_backends_and_shapes_alone(seed):
    """Only flash_triton / flash_auto modules take the op; grouped heads and windows keep the module's path (the
    hook is not called: it would raise)."""
    kw = dict(vocab_size=50, context_length=16, d_model=64, num_layers=1, num_heads=4, d_ff=32, rope_theta=1e4)
    assert flash_rope.use_flash_rope(BasicsTransformerLM(**kw, attention_backend="sdpa", device=DEVICE)) == 0
    for extra in (dict(num_kv_heads=2), dict(attention_window=4)):
        model = BasicsTransformerLM(**kw, **extra, attention_backend="flash_triton", device=DEVICE)
        assert flash_rope.use_flash_rope(model) == 1
        for module in model.modules():
            if hasattr(module, "rope_attention"):
                module.rope_attention = lambda *a: (_ for _ in ()).throw(AssertionError("called"))
        model(torch.randint(0, 50, (1, 16)).to(DEVICE))


def test_rope_attention_bad_input():
    q = torch.zeros(1, 8, 2, 16, device=DEVICE)
    cos = torch.zeros(8, 8, device=DEVICE)
    with pytest.raises(ValueError, match="of one shape"):
        flash_rope.RopeFlashAttention.apply(q, q[:, :4], q, cos, cos)
    with pytest.raises(ValueError, match=r"\(tokens, head dim / 2\)"):
        flash_rope.RopeFlashAttention.apply(q, q, q, cos[:4], cos[:4])
    with pytest.raises(ValueError, match="contiguous float32"):
        flash_rope.RopeFlashAttention.apply(q, q, q, cos.double(), cos.double())


@pytest.mark.gpu
def test_gpu_rope_attention_bf16_within_twice_the_unfused_error(seed):
    """bf16 at the model's shape (heads-last layout, the Gluon backward): our error against fp64 at most twice the
    unfused path's (RoPE's kernel, then our attention) plus a bf16 ulp of slack, for out, dQ, dK, dV."""
    q, k, v, grad, cos, sin = _inputs(2, 1031, 4, 64, torch.bfloat16, seed)
    ours = _grads(flash_rope.RopeFlashAttention.apply, q, k, v, grad, cos, sin)
    exact = _grads(_reference, q.double(), k.double(), v.double(), grad.double(), cos, sin)
    unfused = _grads(lambda q, k, v, c, s: flash_attention(*(t.transpose(1, 2) for t in (
        rotate(q, c[:, None], s[:, None]), rotate(k, c[:, None], s[:, None]), v)), True), q, k, v, grad, cos, sin)
    for name, mine, theirs, ref in zip(("out", "dq", "dk", "dv"), ours, unfused, exact, strict=True):
        err, unfused_err = (mine.double() - ref).abs().max().item(), (theirs.double() - ref).abs().max().item()
        assert err <= 2 * unfused_err + 2 ** -8 * ref.abs().max().item(), (name, err, unfused_err)


@pytest.mark.gpu
def test_gpu_compiled_model_with_rope_attention(seed):
    """The compiled model (fullgraph) with the op against the compiled model with RoPE then our attention (bf16)."""
    from cs336_basics.model import CausalMultiHeadSelfAttention
    from tests.lm_checks import check_compiled_lm

    check_compiled_lm(CausalMultiHeadSelfAttention,
                      lambda model: (use_triton_rope(model), flash_rope.use_flash_rope(model))[1],
                      attention_backend="flash_triton")
