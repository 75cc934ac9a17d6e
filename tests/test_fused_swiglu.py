"""The fused SwiGLU feed-forward (``cs336_systems.fused.swiglu``): its autograd wiring against the module on the CPU
(where its ops run their PyTorch arithmetic), and on a Hopper GPU the Gluon kernels against an fp64 reference with
the 2x rule (our error at most twice that of cuBLAS plus PyTorch's elementwise pass in the same dtype)."""

from __future__ import annotations

import argparse

import pytest
import torch

from cs336_basics.model import BasicsTransformerLM, SwiGLU
from cs336_systems.bench.e2e import BenchConfig
from cs336_systems.fused import swiglu as fused_swiglu
from cs336_systems.train import TrainConfig, resolve_settings
from tests.lm_checks import check_compiled_lm

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _pair(d_model: int, d_ff: int, dtype=torch.float64, device="cpu"):
    ref = SwiGLU(d_model, d_ff, device=device, dtype=dtype)
    ours = SwiGLU(d_model, d_ff, device=device, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    assert fused_swiglu.use_fused_swiglu(ours) == 1
    return ref, ours


@pytest.mark.parametrize("shape,d_model,d_ff", [((3, 7), 24, 40), ((1, 5), 10, 14), ((13,), 32, 96), ((0, 4), 8, 16)])
def test_fused_ffn_matches_the_module_fp64(seed, shape, d_model, d_ff):
    """Odd sizes, fp64: the same products in another order, so output and every gradient agree to rounding."""
    ref, ours = _pair(d_model, d_ff)
    x = torch.randn(*shape, d_model, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y_ref, y = ref(x), ours(x2)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y.backward(dy)
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-12, atol=1e-12)
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-12, atol=1e-12, msg=name)


def test_fused_ffn_in_the_model_and_under_compile(seed):
    """In the LM (fp32, CPU): the same logits and gradients as the module's code, eager and compiled (the custom
    ops' fake implementations let Inductor trace the layer)."""
    kwargs = dict(vocab_size=64, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=48)
    ref, ours = BasicsTransformerLM(**kwargs), BasicsTransformerLM(**kwargs)
    ours.load_state_dict(ref.state_dict())
    assert fused_swiglu.use_fused_swiglu(ours) == 2
    tokens = torch.randint(0, 64, (2, 11))
    a = ref(tokens)
    b = torch.compile(ours)(tokens)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    a.square().mean().backward()
    b.square().mean().backward()
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_input_grad_op_accumulates_in_place_of_addmm(seed):
    """dx = da W1 + db W3 by the op that accumulates into the first product (no copy): addmm's value, and the op
    passes torch.library's checks (schema, fake tensor, compile)."""
    da, db = torch.randn(7, 12, dtype=torch.float64), torch.randn(7, 12, dtype=torch.float64)
    w1, w3 = torch.randn(12, 5, dtype=torch.float64), torch.randn(12, 5, dtype=torch.float64)
    torch.testing.assert_close(fused_swiglu.swiglu_input_grad(da, w1, db, w3), torch.addmm(da @ w1, db, w3),
                               rtol=1e-12, atol=1e-12)
    torch.library.opcheck(fused_swiglu.swiglu_input_grad, (da, w1, db, w3),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_fused_ffn_casts_to_autocasts_dtype():
    """Under autocast the layer computes in autocast's dtype, as the module's matmuls do (fp32 weights cast)."""
    ref, ours = _pair(16, 24, dtype=torch.float32)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref, y = ref(x), ours(x)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)


def test_ffn_setting_bad_input():
    tiny = dict(preset="tiny", context_length=16, batch_size=2, device="cpu")
    with pytest.raises(ValueError, match="unknown ffn kernel 'gluon'; choose from torch, fused"):
        BenchConfig(**tiny, ffn="gluon")
    with pytest.raises(ValueError, match="--ffn fused runs our model on a CUDA device"):
        BenchConfig(**tiny, ffn="fused", precision="bf16")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="--ffn fused runs 16-bit kernels: it needs --precision bf16"):
            BenchConfig(**dict(tiny, device="cuda"), ffn="fused")
    with pytest.raises(ValueError, match="unknown --ffn 'gluon'; choose from torch, fused"):
        TrainConfig(ffn="gluon")
    with pytest.raises(ValueError, match="--ffn fused reads the feed-forward's weights outside"):
        TrainConfig(ffn="fused", parallel="fsdp")
    with pytest.raises(ValueError, match="--ffn fused needs a CUDA device, got cpu; use --ffn torch"):
        resolve_settings(TrainConfig(ffn="fused", precision="bf16"), torch.device("cpu"))
    with pytest.raises(ValueError, match="--ffn fused runs 16-bit kernels: it needs --precision bf16"):
        resolve_settings(TrainConfig(ffn="fused"), torch.device("cuda"))
    from cs336_systems.commands import bench, train

    for command in (bench, train):
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        with pytest.raises(SystemExit) as err:
            parser.parse_args(["--ffn", "gluon"])
        assert err.value.code == 2
        assert parser.parse_args(["--ffn", "fused"]).ffn in ("fused", ["fused"])


def _errors(got: torch.Tensor, base: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    return (got.double() - ref).abs().max().item(), (base.double() - ref).abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon kernels are sm_90's")
@pytest.mark.parametrize("m,k,n", [(777, 200, 328), (4096, 1600, 6400), (130, 64, 136)])
def test_gpu_gluon_kernels_within_twice_the_unfused_error(seed, m, k, n):
    """h, a, b and da, db against fp64 at odd sizes (rows past a tile, K and N not whole tiles): our error at most
    twice the unfused bf16 path's (cuBLAS GEMMs, fp32 elementwise), plus one bf16 rounding of the largest value."""
    from cs336_systems.fused import swiglu_gemm

    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=bf16)
    w1, w3 = (torch.randn(n, k, device=dev, dtype=bf16) / k**0.5 for _ in range(2))
    dy = torch.randn(m, k, device=dev, dtype=bf16)
    w2 = torch.randn(k, n, device=dev, dtype=bf16) / n**0.5
    assert swiglu_gemm.supported(x, w1, w3) and swiglu_gemm.supported(dy, w2)
    h, a, b = fused_swiglu.swiglu_gate(x, w1, w3)
    base = fused_swiglu._gate_reference(x, w1, w3)
    a64, b64 = x.double() @ w1.double().T, x.double() @ w3.double().T
    refs = (torch.nn.functional.silu(a64) * b64, a64, b64)
    for name, got, bs, ref in zip("hab", (h, a, b), base, refs, strict=True):
        err, base_err = _errors(got, bs, ref)
        assert err <= 2 * base_err + ref.abs().max().item() * 2**-8, (name, err, base_err)
    da, db = fused_swiglu.swiglu_gate_backward(dy, w2, a, b)
    base_da, base_db = fused_swiglu._gate_backward_reference(dy, w2, a, b)
    dh64 = dy.double() @ w2.double()
    sig = torch.sigmoid(a.double())
    for name, got, bs, ref in (("da", da, base_da, dh64 * b.double() * sig * (1 + a.double() * (1 - sig))),
                               ("db", db, base_db, dh64 * a.double() * sig)):
        err, base_err = _errors(got, bs, ref)
        assert err <= 2 * base_err + ref.abs().max().item() * 2**-8, (name, err, base_err)


def test_backward_kernel_compiles_for_sm90_without_spills():
    """The backward's consumers hold two fp32 accumulators and then the epilogue's fp32 temporaries in 240 registers
    a thread; a whole half tile's epilogue spilled 344 bytes a thread and cost 7% of the kernel (session 34). Compiled
    for sm_90a with Triton's own ptxas (no GPU needed; in a process of its own, since other test modules decorate
    kernels for the interpreter): no spill stores or loads."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "tests.sm90_ptxas", "swiglu_backward"], capture_output=True,
                         text=True, env=env, cwd=Path(__file__).resolve().parent.parent, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", out.stdout)
    assert spills and all(int(n) == 0 for n in spills), out.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon kernels are sm_90's")
def test_gpu_compiled_model_with_fused_ffn_matches_the_modules(seed):
    """The LM in bf16 autocast with bf16 weights, compiled: logits and gradients as the module's code gives them."""
    check_compiled_lm(SwiGLU, fused_swiglu.use_fused_swiglu)


def test_fused_ffn_is_the_fast_pick_only_where_it_measured_faster(monkeypatch):
    """fast_settings picks the fused feed-forward on a Hopper GPU for steps of at least xl/2048's size (8,192 tokens,
    d_model 1,600), nowhere else; train asks per model and step size, and keeps it under bf16 only."""
    from cs336_systems import fast
    from cs336_systems import train as train_mod

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fast.fast_settings(cuda, 10_000, 1600, 4 * 2048).ffn == "fused"
    assert fast.fast_settings(cuda, 10_000, 1600, 4 * 512).ffn == "torch"  # xl/512: a tie
    assert fast.fast_settings(cuda, 10_000, 768, 4 * 2048).ffn == "torch"  # small: slower at 512
    assert fast.fast_settings(cuda).ffn == "torch"
    assert fast.fast_settings("cpu", 10_000, 1600, 8192).ffn == "torch"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert fast.fast_settings(cuda, 10_000, 1600, 8192).ffn == "torch"  # the kernels are Hopper's
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    resolve = train_mod.resolve_settings

    def picked(**kw):
        return resolve(TrainConfig(preset="xl", batch_size=4, **kw), cuda)[0].ffn

    assert picked(context_length=2048, precision="bf16") == "fused"
    assert picked(context_length=2048) == "torch"  # fp32
    assert picked(context_length=512, precision="bf16") == "torch"
