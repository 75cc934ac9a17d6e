"""Tuned GEMMs (``cs336_systems.fused.tuned_gemm``): the autograd wiring and the settings on the CPU (where the op
is ``torch.mm``), and on a GPU cuBLASLt's picks against an fp64 reference with the 2x rule (our error at most twice
``torch.mm``'s in the same dtype), in every operand layout, accumulating, and under a CUDA graph capture."""

from __future__ import annotations

import pytest
import torch

from cs336_basics.model import BasicsTransformerLM, Linear
from cs336_systems.bench.e2e import BenchConfig
from cs336_systems.fused import swiglu as fused_swiglu
from cs336_systems.fused import tuned_gemm
from tests.lm_checks import KWARGS, check_compiled_lm


@pytest.mark.parametrize("lead", [(3, 5), (13,), (0, 2)])
def test_tuned_linear_matches_the_module_fp64(seed, lead):
    """Odd sizes, fp64 (the op is torch.mm there): output and both gradients as ``Linear``'s own code gives them."""
    ref = Linear(7, 11, dtype=torch.float64)
    ours = Linear(7, 11, dtype=torch.float64)
    ours.load_state_dict(ref.state_dict())
    ours.kernel = tuned_gemm.tuned_linear
    x = torch.randn(*lead, 7, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y_ref, y = ref(x), ours(x2)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y.backward(dy)
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-12, atol=1e-12)


def test_tuned_linear_casts_to_autocasts_dtype():
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = tuned_gemm.tuned_linear(x, w)
        ref = x @ w.T
    assert y.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(y, ref)


def test_tuned_mm_op_and_layouts():
    """The custom op passes torch.library's checks with row- and column-major operands; ``_layout`` tells them
    apart (size-1 dimensions count as either) and refuses other strides."""
    for a, b in ((torch.randn(4, 6), torch.randn(6, 3)), (torch.randn(6, 4).T, torch.randn(3, 6).T)):
        torch.library.opcheck(tuned_gemm.tuned_mm, (a, b))
    m = torch.randn(5, 8)
    assert tuned_gemm._layout(m) == "n" and tuned_gemm._layout(m.T) == "t"
    assert tuned_gemm._layout(m[:, ::2]) is None and tuned_gemm._layout(m[:, :4]) is None
    assert tuned_gemm._layout(torch.randn(1, 8)) == "n" and tuned_gemm._layout(torch.randn(8, 1)) == "n"
    assert tuned_gemm._key(m, m.T, False) is None  # off CUDA: torch.mm, no plan


def test_tuned_model_under_compile_and_the_fused_ffn_flag(seed):
    """In the LM (fp32, CPU): every Linear takes the kernel, and eager and compiled (fullgraph) give the module's
    logits and gradients; the fused feed-forward's input gradient with ``tuned=True`` is its untuned value."""
    kwargs = dict(vocab_size=64, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=48)
    ref, ours = BasicsTransformerLM(**kwargs), BasicsTransformerLM(**kwargs)
    ours.load_state_dict(ref.state_dict())
    assert tuned_gemm.use_tuned_linear(ours) == 7 * 2 + 1
    tokens = torch.randint(0, 64, (2, 11))
    a = ref(tokens)
    b = torch.compile(ours, fullgraph=True)(tokens)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.square().mean().backward()
    b.square().mean().backward()
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    da, w1, db, w3 = torch.randn(9, 20), torch.randn(20, 6), torch.randn(9, 20), torch.randn(20, 6)
    torch.testing.assert_close(fused_swiglu.swiglu_input_grad(da, w1, db, w3, True),
                               fused_swiglu.swiglu_input_grad(da, w1, db, w3))
    torch.library.opcheck(fused_swiglu.swiglu_input_grad, (da, w1, db, w3, True))


def test_gemm_setting_bad_input():
    tiny = dict(preset="tiny", context_length=16, batch_size=2, device="cpu")
    with pytest.raises(ValueError, match="unknown gemm 'cutlass'; choose from torch, tuned"):
        BenchConfig(**tiny, gemm="cutlass")
    with pytest.raises(ValueError, match="--gemm tuned runs our model's 16-bit products on a CUDA device"):
        BenchConfig(**tiny, gemm="tuned", precision="bf16")
    with pytest.raises(ValueError, match="--gemm tuned runs our model's 16-bit products on a CUDA device"):
        BenchConfig(**dict(tiny, device="cuda"), gemm="tuned", impl="peer", precision="bf16")


def _errors(got: torch.Tensor, base: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    return (got.double() - ref).abs().max().item(), (base.double() - ref).abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layouts", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k", [(257, 136, 200), (1024, 520, 768)])
def test_gpu_tuned_matmul_against_fp64(seed, dtype, layouts, m, n, k):
    """Every layout, odd sizes (rows a multiple of 8 where cuBLASLt's 16-byte rule needs it), plain and accumulated:
    error against fp64 at most twice torch.mm's (plus half an ulp of the largest entry, as both round to 16 bits);
    the tuned shape is recorded, and a second call reuses its plan."""
    dev = dict(device="cuda", dtype=dtype)
    a = torch.randn(m, k, **dev) if layouts[0] == "n" else torch.randn(k, m, **dev).T
    b = torch.randn(k, n, **dev) if layouts[1] == "n" else torch.randn(n, k, **dev).T
    c0 = torch.randn(m, n, **dev)
    ref = a.double() @ b.double()
    got = tuned_gemm.matmul_into(a, b, torch.empty(m, n, **dev))
    err, base = _errors(got, torch.mm(a, b), ref)
    ulp = ref.abs().max().item() * (2**-8 if dtype == torch.bfloat16 else 2**-11)
    assert err <= 2 * base + ulp, (err, base)
    acc = tuned_gemm.matmul_into(a, b, c0.clone(), accumulate=True)
    err, base = _errors(acc, c0.clone().addmm_(a, b), ref + c0.double())
    assert err <= 2 * base + ulp, (err, base)
    key = tuned_gemm._key(a, b, False)
    assert key in tuned_gemm._plans
    assert f"{m} x {n} x {k} ({layouts})" in tuned_gemm.tuned_choices()
    torch.testing.assert_close(tuned_gemm.matmul_into(a, b, torch.empty(m, n, **dev)), got, rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_tuned_matmul_in_a_cuda_graph(seed):
    """A shape tuned before a capture replays its pick; one first seen under the capture runs torch.mm there (no
    timing in a capture) and is tuned at its next call outside."""
    dev = dict(device="cuda", dtype=torch.bfloat16)
    a, b = torch.randn(512, 384, **dev), torch.randn(384, 256, **dev)
    a2, b2 = torch.randn(256, 320, **dev), torch.randn(320, 192, **dev)
    want = tuned_gemm.matmul_into(a, b, torch.empty(512, 256, **dev))
    out, out2 = torch.empty(512, 256, **dev), torch.empty(256, 192, **dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tuned_gemm.matmul_into(a, b, out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tuned_gemm.matmul_into(a, b, out)
        tuned_gemm.matmul_into(a2, b2, out2)
    assert tuned_gemm._key(a2, b2, False) not in tuned_gemm._plans
    out.zero_()
    out2.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(out2, torch.mm(a2, b2), rtol=0, atol=0)
    tuned_gemm.matmul_into(a2, b2, out2)
    assert tuned_gemm._key(a2, b2, False) in tuned_gemm._plans


@pytest.mark.gpu
def test_gpu_compiled_model_with_tuned_linear_matches_the_modules(seed):
    """The LM in bf16 autocast with bf16 weights, compiled: logits and gradients as the module's code gives them."""
    check_compiled_lm(Linear, tuned_gemm.use_tuned_linear, installed=7 * KWARGS["num_layers"] + 1)
