"""cs336_basics building blocks against independent references (fp64 where it matters)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cs336_basics.attention import get_attention_backend
from cs336_basics.model import (
    BasicsTransformerLM,
    CausalMultiHeadSelfAttention,
    Embedding,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    scaled_dot_product_attention,
)
from cs336_systems.configs import PRESETS, count_parameters, get_preset

F64 = torch.float64


@pytest.mark.parametrize("shape", [(2, 3, 17, 16), (1, 1, 1, 8), (4, 5, 33, 24)])
def test_sdpa_matches_torch(seed, shape):
    q, k, v = (torch.randn(shape, dtype=F64) for _ in range(3))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    mask = torch.rand(shape[-2], shape[-2]) > 0.3
    mask.fill_diagonal_(True)  # every query sees at least one key
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("nq,nk", [(17, 17), (5, 9)])
def test_attention_backends_causal_top_left(seed, backend, nq, nk):
    q, k, v = (
        torch.randn(2, 3, nq, 16, dtype=F64),
        torch.randn(2, 3, nk, 16, dtype=F64),
        torch.randn(2, 3, nk, 16, dtype=F64),
    )
    out = get_attention_backend(backend)(q, k, v, True)
    # Independent reference: query i attends keys 0..i, written as an explicit loop.
    ref = torch.empty_like(q)
    for i in range(nq):
        s = q[..., i : i + 1, :] @ k[..., : i + 1, :].transpose(-1, -2) / math.sqrt(16)
        ref[..., i, :] = (s.softmax(-1) @ v[..., : i + 1, :]).squeeze(-2)
    torch.testing.assert_close(out, ref)


def test_linear_and_embedding(seed):
    lin = Linear(37, 19, dtype=F64)
    assert lin.weight.shape == (19, 37)
    x = torch.randn(3, 5, 37, dtype=F64)
    torch.testing.assert_close(lin(x), x @ lin.weight.T)
    std = math.sqrt(2 / (37 + 19))
    assert lin.weight.abs().max() <= 3 * std + 1e-12
    big = Linear(512, 512)
    # Truncating a normal at +-3 std leaves std * sqrt(1 - 6 phi(3) / (2 Phi(3) - 1)) = 0.9866 std.
    assert big.weight.std().item() == pytest.approx(math.sqrt(2 / 1024) * 0.9866, rel=0.02)
    emb = Embedding(11, 7)
    ids = torch.randint(0, 11, (4, 6))
    torch.testing.assert_close(emb(ids), emb.weight[ids])
    assert emb.weight.abs().max() <= 3.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rmsnorm_formula(seed, dtype):
    norm = RMSNorm(24)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(24))
    x = torch.randn(3, 7, 24).to(dtype)
    xd = x.double()
    ref = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    out = norm(x)
    assert out.dtype == dtype
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]  # one rounding of the output
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def test_swiglu_formula(seed):
    ffn = SwiGLU(16, 40, dtype=F64)
    x = torch.randn(2, 5, 16, dtype=F64)
    a = x @ ffn.w1.weight.T
    ref = ((a * torch.sigmoid(a)) * (x @ ffn.w3.weight.T)) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), ref)


def test_rope_matches_complex_rotation_and_is_relative(seed):
    dim, ctx = 32, 64
    rope = RotaryEmbedding(ctx, dim, theta=10000.0)
    x = torch.randn(3, 10, dim)
    pos = torch.randint(0, ctx, (3, 10))
    out = rope(x, pos)
    # Reference: pairs as complex numbers times e^{i * pos * theta^(-2k/d)}.
    freqs = 10000.0 ** (-torch.arange(0, dim, 2, dtype=F64) / dim)
    z = torch.view_as_complex(x.double().reshape(3, 10, dim // 2, 2).contiguous())
    ref = torch.view_as_real(z * torch.polar(torch.ones_like(freqs), pos.double()[..., None] * freqs)).flatten(-2)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # q.k depends only on the offset between positions.
    q, k = torch.randn(dim), torch.randn(dim)

    def dot(i, j):
        return (rope(q[None], torch.tensor([i])) * rope(k[None], torch.tensor([j]))).sum()

    torch.testing.assert_close(dot(5, 2), dot(40, 37), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dot(0, 9), dot(20, 29), rtol=1e-4, atol=1e-4)


def test_multihead_attention_matches_manual(seed):
    d, h, t = 32, 4, 11
    rope = RotaryEmbedding(64, d // h)
    attn = CausalMultiHeadSelfAttention(d, h, rope, "reference")
    x = torch.randn(2, t, d)
    out = attn(x)
    q = (x @ attn.q_proj.weight.T).view(2, t, h, d // h).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(2, t, h, d // h).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(2, t, h, d // h).transpose(1, 2)
    pos = torch.arange(t)
    o = F.scaled_dot_product_attention(rope(q, pos), rope(k, pos), v, is_causal=True)
    torch.testing.assert_close(
        out, o.transpose(1, 2).reshape(2, t, d) @ attn.output_proj.weight.T, rtol=1e-5, atol=1e-5
    )


def test_model_backends_agree(seed):
    cfg = get_preset("tiny")
    torch.manual_seed(seed)
    ref = BasicsTransformerLM(**cfg.model_kwargs(), attention_backend="reference")
    sdpa = BasicsTransformerLM(**cfg.model_kwargs(), attention_backend="sdpa")
    sdpa.load_state_dict(ref.state_dict())
    x = torch.randint(0, cfg.vocab_size, (2, 37))
    torch.testing.assert_close(ref(x), sdpa(x), rtol=1e-4, atol=1e-4)
    assert ref(x).shape == (2, 37, cfg.vocab_size)


@pytest.mark.parametrize("name", ["tiny", "small", "medium", "large", "xl", "2.7B", "8b"])
def test_parameter_count_matches_built_model(name):
    cfg = PRESETS[name]
    model = BasicsTransformerLM(**cfg.model_kwargs(), device="meta")
    assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg)


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    from cs336_basics.nn_utils import cross_entropy
    from cs336_basics.optimizer import AdamW

    cfg = get_preset("tiny")
    model = BasicsTransformerLM(**cfg.model_kwargs())
    opt = AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    x = torch.randint(0, cfg.vocab_size, (4, 32))
    y = torch.randint(0, cfg.vocab_size, (4, 32))
    first = None
    for _ in range(200):
        loss = cross_entropy(model(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first, (first, loss.item())


class TestBadInput:
    def test_token_ids_outside_vocab(self):
        model = BasicsTransformerLM(**get_preset("tiny").model_kwargs())
        with pytest.raises(ValueError, match="token ids"):
            model(torch.tensor([[0, 1, 512]]))
        with pytest.raises(ValueError, match="token ids"):
            model(torch.tensor([[-1, 3]]))

    def test_sequence_longer_than_context(self):
        cfg = get_preset("tiny")
        model = BasicsTransformerLM(**cfg.model_kwargs())
        with pytest.raises(ValueError, match="context_length"):
            model(torch.zeros(1, cfg.context_length + 1, dtype=torch.long))

    def test_d_model_not_divisible_by_heads(self):
        with pytest.raises(ValueError, match="divisible by num_heads"):
            BasicsTransformerLM(vocab_size=10, context_length=8, d_model=30, num_layers=1, num_heads=4, d_ff=8)
        with pytest.raises(ValueError, match="divisible by num_heads"):
            get_preset("tiny", num_heads=5)

    def test_unknown_preset_and_attention(self):
        with pytest.raises(ValueError, match="unknown model preset 'huge'"):
            get_preset("huge")
        with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
            BasicsTransformerLM(**get_preset("tiny").model_kwargs(), attention_backend="nope")

    def test_float_token_ids(self):
        model = BasicsTransformerLM(**get_preset("tiny").model_kwargs())
        with pytest.raises(ValueError, match="integer"):
            model(torch.zeros(1, 4))
