# Snapshot of tests/test_fused_qkv.py at 3cd4fc5 (session 31): see README.md here.
"""q, k and v from one matmul (``cs336_systems.fused.qkv``): its autograd wiring against the attention module on the
CPU (the RoPE kernels in Triton's interpreter, or the ops' PyTorch arithmetic where it is off), and on the GPU the
compiled LM against the module's code."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

if not torch.cuda.is_available():  # before the kernels are compiled: CPU runs them in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cs336_basics.model import BasicsTransformerLM, CausalMultiHeadSelfAttention, RotaryEmbedding
from cs336_systems.bench.e2e import BenchConfig
from cs336_systems.fused import qkv as fused_qkv
from cs336_systems.train import TrainConfig, resolve_settings
from tests.lm_checks import check_compiled_lm


def _pair(d_model=24, heads=4, kv=None, context=32, dtype=torch.float64):
    rope = RotaryEmbedding(context, d_model // heads)
    ref = CausalMultiHeadSelfAttention(d_model, heads, rope, dtype=dtype, num_kv_heads=kv)
    ours = CausalMultiHeadSelfAttention(d_model, heads, rope, dtype=dtype, num_kv_heads=kv)
    ours.load_state_dict(ref.state_dict())
    assert fused_qkv.use_packed_qkv(ours) == 1
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
def test_packed_qkv_matches_the_module_fp64(seed, batch, seq):
    """Odd sizes and leading dims, an empty batch, the model's default positions."""
    ref, ours = _pair()
    _check_same(ref, ours, torch.randn(*batch, seq, 24, dtype=torch.float64, requires_grad=True))


def test_packed_qkv_with_given_positions(seed):
    """Positions other than 0..T-1: one row for the batch (the tables broadcast), one per sequence (a table row per
    token), and a layout the packed path cannot take ((1, T) against a batch of 3: the module's arithmetic)."""
    x = torch.randn(3, 6, 24, dtype=torch.float64, requires_grad=True)
    for positions in (torch.arange(4, 10), torch.randint(0, 32, (3, 6)), torch.arange(6).unsqueeze(0) + 3):
        ref, ours = _pair()
        _check_same(ref, ours, x.detach().clone().requires_grad_(), positions)


def test_packed_qkv_leaves_grouped_query_heads_to_the_module(seed, monkeypatch):
    """With fewer key/value heads than query heads the widths differ: the hook is not called."""
    ref, ours = _pair(kv=2)
    monkeypatch.setattr(ours, "qkv_kernel", lambda *a: pytest.fail("qkv_kernel called with grouped-query heads"))
    _check_same(ref, ours, torch.randn(2, 5, 24, dtype=torch.float64, requires_grad=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_qkv_ops_against_fp64(seed, dtype):
    """The two ops alone, odd sizes (head dim 6, 5 tokens of positions for 10 rows): the split's q and k and the
    packed gradient against an fp64 rotation, within twice the module's own error in the dtype (fp32 arithmetic,
    one rounding either way) plus an fp32 ulp for contractions."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rope = RotaryEmbedding(16, 6, device=dev)
    cos, sin = rope.cos[3:8].contiguous(), rope.sin[3:8].contiguous()
    qkv = torch.randn(10, 36, device=dev).to(dtype)
    q, k = fused_qkv.qkv_rope_split(qkv, cos, sin)
    g = [torch.randn(10, 12, device=dev).to(dtype) for _ in range(3)]
    dqkv = fused_qkv.qkv_grad_pack(*g, cos, sin)

    def fp64(t, s):
        return fused_qkv._rotated_reference(t.double(), cos.double(), s.double())

    cases = [(q, qkv[:, :12], sin), (k, qkv[:, 12:24], sin), (dqkv[:, :12], g[0], -sin), (dqkv[:, 12:24], g[1], -sin)]
    for got, src, s in cases:
        ref = fp64(src, s)
        base = fused_qkv._rotated_reference(src, cos, s)  # the module's arithmetic in the dtype
        err, base_err = (got.double() - ref).abs().max().item(), (base.double() - ref).abs().max().item()
        # Triton's interpreter narrows fp32 to bf16 by truncation (up to an ulp, where rounding is half of one):
        # under it the bound takes one bf16 ulp of the largest value more
        slack = 2.0 ** (torch.log2(ref.abs().max()).floor().item() - 7) if dev == "cpu" and dtype == torch.bfloat16 \
            else 0.0
        assert got.dtype == dtype and err <= 2 * base_err + 4e-7 + slack, (err, base_err)
    assert torch.equal(dqkv[:, 24:], g[2])


def test_packed_qkv_in_the_model_and_under_compile(seed):
    """In the LM (fp32, CPU): the same logits and gradients as the module's code, eager and compiled with
    ``fullgraph=True`` (the custom ops' fake implementations let Inductor trace them)."""
    kwargs = dict(vocab_size=64, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=48)
    ref, ours = BasicsTransformerLM(**kwargs), BasicsTransformerLM(**kwargs)
    ours.load_state_dict(ref.state_dict())
    assert fused_qkv.use_packed_qkv(ours) == 2
    tokens = torch.randint(0, 64, (2, 11))
    a = ref(tokens)
    b = torch.compile(ours, fullgraph=True)(tokens)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.square().mean().backward()
    b.square().mean().backward()
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_qkv_casts_to_autocasts_dtype(seed):
    """Under autocast q, k and v come in autocast's dtype, as the module's projections give them."""
    ref, ours = _pair(dtype=torch.float32)
    x = torch.randn(2, 5, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref, y = ref(x), ours(x)
        q = fused_qkv.qkv_rope(x, ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight,
                               ours.positional_encoder.cos[:5], ours.positional_encoder.sin[:5])[0]
    assert q.dtype == y.dtype == y_ref.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)


def test_qkv_setting_bad_input():
    tiny = dict(preset="tiny", context_length=16, batch_size=2, device="cpu")
    with pytest.raises(ValueError, match="unknown qkv layout 'fused'; choose from separate, packed"):
        BenchConfig(**tiny, qkv="fused")
    with pytest.raises(ValueError, match=r"--qkv packed runs our model \(got impl peer\)"):
        BenchConfig(**tiny, qkv="packed", impl="peer")
    with pytest.raises(ValueError, match="unknown --qkv 'fused'; choose from separate, packed"):
        TrainConfig(qkv="fused")
    with pytest.raises(ValueError, match="--qkv packed reads the q, k and v projections' weights outside"):
        TrainConfig(qkv="packed", parallel="fsdp")
    assert resolve_settings(TrainConfig(), torch.device("cpu"))[0].qkv == "separate"
    from cs336_systems.commands import bench, train

    for command in (bench, train):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        with pytest.raises(SystemExit) as err:
            parser.parse_args(["--qkv", "fused"])
        assert err.value.code == 2
        assert parser.parse_args(["--qkv", "packed"]).qkv in ("packed", ["packed"])


def test_bench_runs_the_packed_projections_on_cpu(tmp_path):
    """A tiny train step through bench with --qkv packed: the record says so and the step runs."""
    from cs336_systems.bench.e2e import run_benchmark

    rec = run_benchmark(BenchConfig(preset="tiny", context_length=16, batch_size=2, device="cpu", mode="train-step",
                                    qkv="packed", warmup=1, steps=2))
    assert rec["status"] == "ok" and rec["qkv"] == "packed" and rec["step_mean_ms"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_model_with_packed_qkv_matches_the_modules(seed):
    """The LM in bf16 autocast with bf16 projections, compiled: logits and gradients as the module's code gives
    them (the RoPE kernels on the packed output, strided)."""
    check_compiled_lm(CausalMultiHeadSelfAttention, fused_qkv.use_packed_qkv)
