# Snapshot of tests/test_fused_qk_rope.py at ca239d7 (session 30): see README.md here.
"""RoPE in the q/k projections' epilogue (``cs336_systems.fused.qk_rope``): its autograd wiring against the attention
module on the CPU (where its op runs the module's arithmetic in PyTorch), and on a Hopper GPU the Gluon kernel
against an fp64 reference with the 2x rule (our error at most twice that of cuBLAS plus RoPE's kernel in bf16)."""

from __future__ import annotations

import argparse

import pytest
import torch

from cs336_basics.model import BasicsTransformerLM, CausalMultiHeadSelfAttention, RotaryEmbedding
from cs336_systems.bench.e2e import BenchConfig
from cs336_systems.fused import qk_rope as fused_qk
from cs336_systems.train import TrainConfig, resolve_settings

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _pair(d_model=24, heads=4, kv=None, context=32, dtype=torch.float64):
    rope = RotaryEmbedding(context, d_model // heads)
    ref = CausalMultiHeadSelfAttention(d_model, heads, rope, dtype=dtype, num_kv_heads=kv)
    ours = CausalMultiHeadSelfAttention(d_model, heads, rope, dtype=dtype, num_kv_heads=kv)
    ours.load_state_dict(ref.state_dict())
    assert fused_qk.use_fused_qk_rope(ours) == 1
    return ref, ours


def _check_same(ref, ours, x, *args, tol=1e-6):
    """Outputs and every gradient agree: the same arithmetic (the rotation in fp32 either way, as
    ``rotate_pairs``), the products in another order, so within fp32 rounding of O(1) values."""
    x2 = x.detach().clone().requires_grad_()
    y_ref, y = ref(x, *args), ours(x2, *args)
    torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y.backward(dy)
    torch.testing.assert_close(x2.grad, x.grad, rtol=tol, atol=tol)
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("batch,seq", [((3,), 7), ((2, 2), 5), ((), 11), ((0,), 4)])
def test_fused_qk_matches_the_module_fp64(seed, batch, seq):
    """Odd sizes and leading dims, an empty batch, the model's default positions."""
    ref, ours = _pair()
    _check_same(ref, ours, torch.randn(*batch, seq, 24, dtype=torch.float64, requires_grad=True))


def test_fused_qk_with_given_positions(seed):
    """Positions other than 0..T-1: one row for the batch (the tables broadcast), one per sequence (a table row per
    token), and a layout the fused path cannot take ((1, T) against a batch of 3: the module's arithmetic)."""
    x = torch.randn(3, 6, 24, dtype=torch.float64, requires_grad=True)
    for positions in (torch.arange(4, 10), torch.randint(0, 32, (3, 6)), torch.arange(6).unsqueeze(0) + 3):
        ref, ours = _pair()
        _check_same(ref, ours, x.detach().clone().requires_grad_(), positions)


def test_fused_qk_leaves_grouped_query_heads_to_the_module(seed, monkeypatch):
    """With fewer key/value heads than query heads q and k differ in width: the hook is not called."""
    ref, ours = _pair(kv=2)
    monkeypatch.setattr(ours, "qk_kernel", lambda *a: pytest.fail("qk_kernel called with grouped-query heads"))
    _check_same(ref, ours, torch.randn(2, 5, 24, dtype=torch.float64, requires_grad=True))


def test_fused_qk_in_the_model_and_under_compile(seed):
    """In the LM (fp32, CPU): the same logits and gradients as the module's code, eager and compiled with
    ``fullgraph=True`` (the custom op's fake implementation lets Inductor trace it)."""
    kwargs = dict(vocab_size=64, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=48)
    ref, ours = BasicsTransformerLM(**kwargs), BasicsTransformerLM(**kwargs)
    ours.load_state_dict(ref.state_dict())
    assert fused_qk.use_fused_qk_rope(ours) == 2
    tokens = torch.randint(0, 64, (2, 11))
    a = ref(tokens)
    b = torch.compile(ours, fullgraph=True)(tokens)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.square().mean().backward()
    b.square().mean().backward()
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_fused_qk_casts_to_autocasts_dtype(seed):
    """Under autocast q and k come in autocast's dtype, as the module's projections give them (fp32 weights cast)."""
    ref, ours = _pair(dtype=torch.float32)
    x = torch.randn(2, 5, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref, y = ref(x), ours(x)
        q = fused_qk.qk_rope(x, ours.q_proj.weight, ours.k_proj.weight, ours.positional_encoder.cos[:5],
                             ours.positional_encoder.sin[:5])[0]
    assert q.dtype == y.dtype == y_ref.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)


def test_rope_fused_setting_bad_input():
    tiny = dict(preset="tiny", context_length=16, batch_size=2, device="cpu")
    with pytest.raises(ValueError, match="unknown rope kernel 'gluon'; choose from torch, triton, fused"):
        BenchConfig(**tiny, rope="gluon")
    with pytest.raises(ValueError, match="--rope fused runs our model on a CUDA device"):
        BenchConfig(**tiny, rope="fused", precision="bf16")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="--rope fused runs 16-bit kernels: it needs --precision bf16"):
            BenchConfig(**dict(tiny, device="cuda"), rope="fused")
    with pytest.raises(ValueError, match="unknown --rope 'gluon'; choose from torch, triton, fused"):
        TrainConfig(rope="gluon")
    with pytest.raises(ValueError, match="--rope fused reads the q and k projections' weights outside"):
        TrainConfig(rope="fused", parallel="fsdp")
    with pytest.raises(ValueError, match="--rope fused needs a CUDA device, got cpu; use --rope torch"):
        resolve_settings(TrainConfig(rope="fused", precision="bf16"), torch.device("cpu"))
    with pytest.raises(ValueError, match="--rope fused runs 16-bit kernels: it needs --precision bf16"):
        resolve_settings(TrainConfig(rope="fused"), torch.device("cuda"))
    from cs336_systems.commands import bench, train

    for command in (bench, train):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        with pytest.raises(SystemExit) as err:
            parser.parse_args(["--rope", "gluon"])
        assert err.value.code == 2
        assert parser.parse_args(["--rope", "fused"]).rope in ("fused", ["fused"])


def test_rope_fused_is_the_fast_pick_with_the_fused_ffn(monkeypatch):
    """fast_settings picks RoPE in the projections where it picks the fused feed-forward (a Hopper GPU, steps of
    xl/2048's size), the Triton kernel elsewhere on CUDA; train keeps it under bf16 only."""
    from cs336_systems import fast

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fast.fast_settings(cuda, 10_000, 1600, 4 * 2048).rope == "fused"
    assert fast.fast_settings(cuda, 10_000, 1600, 4 * 512).rope == "triton"
    assert fast.fast_settings(cuda).rope == "triton"
    assert fast.fast_settings("cpu", 10_000, 1600, 8192).rope == "torch"

    def picked(**kw):
        return resolve_settings(TrainConfig(preset="xl", batch_size=4, context_length=2048, **kw), cuda)[0].rope

    assert picked(precision="bf16") == "fused"
    assert picked() == "triton"  # fp32
    assert picked(precision="bf16", parallel="fsdp") == "triton"


def _rotated_ref(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """fp64 RoPE of t (M, N) with row r at table row r % P."""
    (m, n), (p, half) = t.shape, cos.shape
    v = t.double().view(m // p, p, n // (2 * half), half, 2)
    c, s = cos.double()[:, None], sin.double()[:, None]
    even, odd = v[..., 0], v[..., 1]
    return torch.stack((even * c - odd * s, even * s + odd * c), -1).view(m, n)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon kernels are sm_90's")
@pytest.mark.parametrize("batch,seq,d,head_dim", [(3, 259, 200, 40), (4, 2048, 1600, 64), (1, 130, 256, 128)])
def test_gpu_qk_rope_kernel_within_twice_the_unfused_error(seed, batch, seq, d, head_dim):
    """q and k against fp64 at odd sizes (rows past a tile, K and N not whole tiles, head dims 40-128): our error at
    most twice the unfused bf16 path's (cuBLAS, then RoPE's kernel), plus one bf16 rounding of the largest value;
    and the backward's dx, dWq, dWk against autograd through the unfused path."""
    from cs336_systems.fused import qk_rope_gemm
    from cs336_systems.fused.rope import rotate

    dev, bf16 = "cuda", torch.bfloat16
    rope = RotaryEmbedding(seq, head_dim, device=dev)
    cos, sin = rope.cos.contiguous(), rope.sin.contiguous()
    x = torch.randn(batch * seq, d, device=dev, dtype=bf16)
    wq, wk = (torch.randn(d, d, device=dev, dtype=bf16) / d**0.5 for _ in range(2))
    assert qk_rope_gemm.supported(x, wq, wk)
    q, k = fused_qk.qk_rope_project(x, wq, wk, cos, sin)
    for name, got, w in (("q", q, wq), ("k", k, wk)):
        base = rotate((x @ w.T).view(batch, seq, -1, head_dim), cos[:, None], sin[:, None]).view(batch * seq, d)
        ref = _rotated_ref(x.double() @ w.double().T, cos, sin)
        err, base_err = (got.double() - ref).abs().max().item(), (base.double() - ref).abs().max().item()
        assert err <= 2 * base_err + ref.abs().max().item() * 2**-8, (name, err, base_err)
    # the backward: autograd through our function against autograd through the unfused path, same dq, dk
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ws = [(wq.clone().requires_grad_(), wk.clone().requires_grad_()) for _ in range(2)]
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    q1, k1 = fused_qk.qk_rope(xs[0], *ws[0], cos, sin)
    view = lambda t: t.view(batch, seq, -1, head_dim)
    q2 = rotate(view(xs[1] @ ws[1][0].T), cos[:, None], sin[:, None]).view(batch * seq, d)
    k2 = rotate(view(xs[1] @ ws[1][1].T), cos[:, None], sin[:, None]).view(batch * seq, d)
    torch.autograd.backward((q1, k1), (dq, dk))
    torch.autograd.backward((q2, k2), (dq, dk))
    for name, a, b in (("dx", xs[0].grad, xs[1].grad), ("dwq", ws[0][0].grad, ws[1][0].grad),
                       ("dwk", ws[0][1].grad, ws[1][1].grad)):
        scale = b.float().abs().max().item()
        assert (a.float() - b.float()).abs().max().item() <= 2**-6 * scale, name


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon kernels are sm_90's")
def test_gpu_compiled_model_with_fused_qk_matches_the_modules(seed):
    """The LM in bf16 autocast with bf16 projections, compiled with the fused feed-forward too (bench's fast set on
    Hopper): logits and gradients as the module's code gives them."""
    from cs336_systems.fused.swiglu import use_fused_swiglu

    kwargs = dict(vocab_size=512, context_length=256, d_model=256, num_layers=2, num_heads=4, d_ff=704,
                  device="cuda", check_inputs=False)
    ref, ours = BasicsTransformerLM(**kwargs), BasicsTransformerLM(**kwargs)
    ours.load_state_dict(ref.state_dict())
    for model in (ref, ours):
        for mod in model.modules():
            if isinstance(mod, CausalMultiHeadSelfAttention):
                mod.to(torch.bfloat16)
    assert fused_qk.use_fused_qk_rope(ours) == 2
    use_fused_swiglu(ours)
    compiled = torch.compile(ours, fullgraph=True)
    tokens = torch.randint(0, 512, (3, 200), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = torch.compile(ref)(tokens).float(), compiled(tokens).float()
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)
    a.square().mean().backward()
    b.square().mean().backward()
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        assert torch.isfinite(q.grad).all(), name
        cos = torch.nn.functional.cosine_similarity(q.grad.float().flatten(), p.grad.float().flatten(), dim=0)
        assert cos > 0.999, (name, cos.item())
