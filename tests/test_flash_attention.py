"""FlashAttention-2 (PyTorch tiled and Triton) against upcast references.

CPU: both classes against an fp64 reference (the Triton kernels run in Triton's interpreter, which this
module enables before importing them when there is no CUDA device). Inputs are fp32, so the only error is
fp32 rounding over sums of at most a few hundred terms: well under 1e-4 on O(1) values.

GPU (``-m gpu``): fp16 / bf16 at real sizes, judged by the flash-attention rule: our max error against an
fp32 reference is at most twice that of naive attention computed in the same low dtype, plus the
rounding step of the dtype at the data's magnitude (for values near zero).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    # Must happen before triton.jit decorates the kernels (at import of flash_triton).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cs336_systems.attention.flash_torch import FlashAttention2Torch
from cs336_systems.attention.flash_triton import FlashAttention2Triton

IMPLS = {"torch": FlashAttention2Torch, "triton": FlashAttention2Triton}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(q, k, v, is_causal, dtype=torch.float64):
    """softmax(q k^T / sqrt(d)) v and the logsumexp, computed in ``dtype``; causal is top-left aligned."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def run_impl(fn, q, k, v, do, is_causal):
    """(O, L, dQ, dK, dV) of ``fn.apply``, L read from the saved tensors as the course tests do."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn.apply(q, k, v, is_causal)
    saved = [t for t in o.grad_fn.saved_tensors if t.shape == q.shape[:-1]]
    assert len(saved) == 1, "the forward must save exactly one tensor of shape Q.shape[:-1] (L)"
    o.backward(do)
    return o.detach(), saved[0].detach(), q.grad, k.grad, v.grad


def run_reference(q, k, v, do, is_causal, dtype=torch.float64):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    o, lse = reference(q, k, v, is_causal, dtype)
    o.backward(do.to(dtype))
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


# (leading dims, Nq, Nk, d, causal): odd lengths, Nq != Nk, 3-D and 4-D inputs
CPU_GRID = [
    ((2,), 1, 1, 16, False),
    ((2,), 17, 17, 16, True),
    ((3,), 77, 100, 48, False),
    ((1, 2), 100, 77, 64, True),
    ((2, 2), 130, 130, 64, True),
    ((1, 3), 17, 130, 48, False),
    ((2,), 130, 17, 16, True),
    ((1, 1), 100, 100, 48, True),
    ((2,), 64, 64, 64, False),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("lead", "n_q", "n_k", "d", "causal"), CPU_GRID)
def test_matches_fp64_reference(impl, lead, n_q, n_k, d, causal, seed):
    q = torch.randn(*lead, n_q, d, device=DEVICE)
    k, v = torch.randn(*lead, n_k, d, device=DEVICE), torch.randn(*lead, n_k, d, device=DEVICE)
    do = torch.randn(*lead, n_q, d, device=DEVICE)
    ours = run_impl(IMPLS[impl], q, k, v, do, causal)
    ref = run_reference(q, k, v, do, causal)
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), ours, ref):
        assert a.shape == b.shape, name
        assert a.dtype == (torch.float32), name
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs_and_grad(impl, seed):
    b, h, n, d = 2, 3, 45, 48
    # (B, N, H, d) -> (B, H, N, d): the layout a model's projections produce
    q, k, v = (torch.randn(b, n, h, d, device=DEVICE).transpose(1, 2) for _ in range(3))
    do = torch.randn(b, h, d, n, device=DEVICE).transpose(-1, -2)  # non-contiguous dO
    assert not q.is_contiguous() and not do.is_contiguous()
    ours = run_impl(IMPLS[impl], q, k, v, do, True)
    ref = run_reference(q, k, v, do, True)
    for name, a, r in zip(("O", "L", "dQ", "dK", "dV"), ours, ref):
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_torch_version_low_precision_dtypes(seed):
    q, k, v = (torch.randn(2, 50, 32) for _ in range(3))
    for dtype in (torch.bfloat16, torch.float16):
        o = FlashAttention2Torch.apply(q.to(dtype), k.to(dtype), v.to(dtype), True)
        assert o.dtype == dtype
        ref, _ = reference(q.to(dtype), k.to(dtype), v.to(dtype), True)
        # Arithmetic is fp32 inside; the only error is the final rounding to the dtype (+ one for inputs).
        torch.testing.assert_close(o.double(), ref, rtol=2 * torch.finfo(dtype).eps, atol=2 * torch.finfo(dtype).eps)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's bf16 path")
def test_triton_bf16_on_cpu_rounds_only_at_the_ends(seed):
    # The interpreter runs bf16 inputs in fp32 (its own bf16 dot is wrong): O and the gradients then carry
    # only the rounding of the bf16 inputs and outputs, a few bf16 epsilons (2^-7) in relative norm.
    q, k, v, do = (torch.randn(2, 3, 37, 16) for _ in range(4))
    args = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    o = FlashAttention2Triton.apply(*args, True)
    o.backward(do.bfloat16())
    assert o.dtype == torch.bfloat16 and all(a.grad.dtype == torch.bfloat16 for a in args)
    ref = run_reference(*(a.detach().float() for a in args), do.bfloat16().float(), True)
    for name, got, want in zip(("O", "dQ", "dK", "dV"), (o, *(a.grad for a in args)), (ref[0], *ref[2:])):
        err = (got.double() - want).norm() / want.norm()
        assert err < 2 * torch.finfo(torch.bfloat16).eps, (name, err)


def _bad_inputs():
    x = torch.randn(2, 8, 16)
    return {
        "head dims differ": (x, torch.randn(2, 8, 32), torch.randn(2, 8, 32)),
        "same sequence length": (x, torch.randn(2, 8, 16), torch.randn(2, 9, 16)),
        "share a dtype": (x, x.half(), x),
        "head dim 8 unsupported": (torch.randn(2, 8, 8),) * 3,
        "head dim 264 unsupported": (torch.randn(2, 8, 264),) * 3,
        "unsupported dtype": (x.to(torch.int32),) * 3,
        "leading": (x, torch.randn(3, 8, 16), torch.randn(3, 8, 16)),
        ">= 1": (torch.randn(2, 0, 16), x, x),
        "(..., seq_len, head_dim)": (torch.randn(16), x, x),
    }


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("problem", list(_bad_inputs()))
def test_bad_inputs_raise_value_error(impl, problem):
    q, k, v = _bad_inputs()[problem]
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        IMPLS[impl].apply(q, k, v, False)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("is_causal", ["no", 1, None])
def test_non_bool_is_causal_raises_value_error(impl, is_causal):
    """``apply(q, k, v, "no")`` must not run causal because the string is truthy (issue 17)."""
    x = torch.randn(1, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="is_causal must be a bool"):
        IMPLS[impl].apply(x, x, x, is_causal)


def test_non_bool_deterministic_raises_value_error():
    x = torch.randn(1, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="deterministic must be a bool"):
        FlashAttention2Triton.apply(x, x, x, True, "yes")


def test_launchers_check_is_causal_and_empty_sequences():
    from cs336_systems.attention.flash_triton import flash_backward, flash_forward

    x = torch.randn(1, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="is_causal must be a bool"):
        flash_forward(x, x, x, "yes")
    with pytest.raises(ValueError, match="is_causal must be a bool"):
        flash_backward(x, x, x, x, x[..., 0], x, 0)
    empty = torch.randn(1, 0, 16, device=DEVICE)
    with pytest.raises(ValueError, match=">= 1"):
        flash_forward(x, empty, empty, False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device and a CPU tensor")
@pytest.mark.gpu
def test_mixed_devices_raise_value_error():
    x = torch.randn(2, 8, 16)
    for fn in IMPLS.values():
        with pytest.raises(ValueError, match="one device"):
            fn.apply(x, x.cuda(), x, False)


def test_cpu_without_interpreter_is_a_clear_error():
    code = (
        "import torch\n"
        "from cs336_systems.attention.flash_triton import FlashAttention2Triton\n"
        "x = torch.randn(1, 16, 16)\n"
        "try:\n"
        "    FlashAttention2Triton.apply(x, x, x, False)\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "ValueError:" in out.stdout and "TRITON_INTERPRET=1" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("name", ["flash_torch", "flash_triton"])
def test_model_backend_matches_reference(name, seed):
    from cs336_basics.attention import get_attention_backend
    from cs336_basics.model import BasicsTransformerLM

    fn = get_attention_backend(name)
    q, k, v = (torch.randn(2, 2, 19, 16, device=DEVICE) for _ in range(3))
    torch.testing.assert_close(fn(q, k, v, True).double(), reference(q, k, v, True)[0], rtol=1e-4, atol=1e-4)
    kwargs = dict(vocab_size=50, context_length=24, d_model=32, num_layers=1, num_heads=2, d_ff=64, device=DEVICE)
    torch.manual_seed(seed)
    ours = BasicsTransformerLM(**kwargs, attention_backend=name)
    torch.manual_seed(seed)
    ref = BasicsTransformerLM(**kwargs, attention_backend="reference")
    tokens = torch.randint(0, 50, (2, 21), device=DEVICE)
    lo, lr = ours(tokens).logsumexp(-1).mean(), ref(tokens).logsumexp(-1).mean()
    lo.backward()
    lr.backward()
    torch.testing.assert_close(lo, lr, rtol=1e-5, atol=1e-5)
    for (pn, p), (_, r) in zip(ours.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5, msg=lambda m, pn=pn: f"{pn}: {m}")


def test_traceable_by_torch_compile(seed):
    """Dynamo traces the autograd.Function (the custom ops are opaque); aot_eager needs no C++ toolchain."""
    q, k, v = (torch.randn(2, 33, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    compiled = torch.compile(FlashAttention2Triton.apply, backend="aot_eager", fullgraph=True)
    o = compiled(q, k, v, True)
    o.sum().backward()
    ref = run_reference(q, k, v, torch.ones_like(o), True)
    torch.testing.assert_close(o.double(), ref[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(q.grad.double(), ref[2], rtol=1e-4, atol=1e-4)


def test_apply_matches_function_apply(seed):
    """Our ``apply`` (the C apply without Function.apply's Python wrapper) gives what Function.apply gives, bit for
    bit, with the same node; a dead functorch wrapper is unwrapped as Function.apply does; keyword arguments and
    functorch transforms take Function.apply's own route (and the transforms its error: no setup_context)."""
    via_function = torch.autograd.Function.apply.__func__
    q, k, v = (torch.randn(2, 37, 16, device=DEVICE) for _ in range(3))
    do = torch.randn_like(q)
    ours = run_impl(FlashAttention2Triton, q, k, v, do, True)

    class Wrapped:  # the same class, applied through Function.apply
        @staticmethod
        def apply(*args):
            return via_function(FlashAttention2Triton, *args)

    theirs = run_impl(Wrapped, q, k, v, do, True)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    q_grad = q.detach().requires_grad_()
    node = FlashAttention2Triton.apply(q_grad, k, v, True).grad_fn
    assert type(node) is type(via_function(FlashAttention2Triton, q_grad, k, v, True).grad_fn)

    leaked = []
    torch.func.grad(lambda x: leaked.append(x) or x.sum())(k.detach())
    assert torch._C._functorch.is_functorch_wrapped_tensor(leaked[0])
    dead = FlashAttention2Triton.apply(q.detach(), leaked[0], v, True)
    torch.testing.assert_close(dead, FlashAttention2Triton.apply(q.detach(), k.detach(), v, True), rtol=0, atol=0)

    by_name = FlashAttention2Triton.apply(q, k, v, is_causal=True)
    torch.testing.assert_close(by_name, via_function(FlashAttention2Triton, q, k, v, is_causal=True), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda x: FlashAttention2Triton.apply(x, k, v, True).sum())(q.detach())


# (leading dims, Nq, Nk, d, causal) for the descriptor (TMA) form and both backwards in the interpreter
VARIANT_GRID = [((2,), 37, 53, 48, True), ((1, 2), 70, 33, 64, False), ((3,), 40, 40, 16, True)]


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("backward", ["atomic", "deterministic", "single"])
@pytest.mark.parametrize(("lead", "n_q", "n_k", "d", "causal"), VARIANT_GRID)
def test_kernel_forms_match_fp64_reference(tma, backward, lead, n_q, n_k, d, causal, seed):
    """Block-pointer and tensor-descriptor addressing, the atomic, deterministic and single-kernel backwards, in
    the interpreter, with tiles of 16 and 32 rows so that boundary and diagonal tiles occur (the single kernel's
    programs own a 32-row key tile and a 16-row query tile, so some have no key tile)."""
    from cs336_systems.attention._tuning import FlashConfig, KernelConfig
    from cs336_systems.attention.flash_triton import _tma_ready, flash_backward, flash_forward

    if DEVICE == "cuda":
        pytest.skip("the GPU variant test covers the kernel forms on CUDA")
    q = torch.randn(*lead, n_q, d)
    k, v = torch.randn(*lead, n_k, d), torch.randn(*lead, n_k, d)
    do = torch.randn(*lead, n_q, d)
    assert _tma_ready(q, k, v), "these inputs must be able to take the descriptor path"
    kc, kn = KernelConfig(32, 16, 1, 1, tma=tma), KernelConfig(16, 32, 1, 1, tma=tma)
    cfg = FlashConfig(kc, kn, kn, kc, single_max_programs=1 << 20 if backward == "single" else 0)
    o, lse = flash_forward(q, k, v, causal, config=cfg)
    grads = flash_backward(q, k, v, o, lse, do, causal, config=cfg, deterministic=backward == "deterministic")
    ref = run_reference(q, k, v, do, causal)
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), (o, lse, *grads), ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def _grouped_reference(q, k, v, do, causal):
    """fp64 (O, L, dQ, dK, dV) with each key/value head repeated for its group of query heads."""
    group = q.shape[1] // k.shape[1]
    kk, vv = (t.detach().double().repeat_interleave(group, dim=1).requires_grad_() for t in (k, v))
    qq = q.detach().double().requires_grad_()
    o, lse = reference(qq, kk, vv, causal)
    o.backward(do.double())
    dk, dv = (g.unflatten(1, (k.shape[1], group)).sum(2) for g in (kk.grad, vv.grad))
    return o.detach(), lse.detach(), qq.grad, dk, dv


def _heads_last(b, n, h, d, packed: int = 1):
    """(B, H, N, d) views of (B, N, H, d) storage, as a model's projections give them (``packed`` > 1: one of
    ``packed`` tensors interleaved per row, as a fused q/k/v projection would)."""
    return torch.randn(b, n, packed, h, d)[:, :, 0].transpose(1, 2)


@pytest.mark.parametrize("backward", ["atomic", "deterministic", "single"])
@pytest.mark.parametrize(("tma", "d", "packed", "do_layout"), [(False, 48, 1, "same"), (True, 16, 3, "contiguous"),
                                                              (True, 64, 1, "same")])
def test_heads_last_layouts_are_addressed_in_place(backward, tma, d, packed, do_layout, seed):
    """(B, H, N, d) views of (B, N, H, d) storage (no single batch-head stride) run without copies: the kernels
    take batch and head apart (``_head``'s FOLD), O and the gradients come back in the inputs' layout (so the
    model's merge of heads is a view), grouped-query heads included; a dO in another layout is copied in. Against
    fp64, in the interpreter with small tiles (diagonal and boundary tiles occur)."""
    from cs336_systems.attention._tuning import FlashConfig, KernelConfig
    from cs336_systems.attention.flash_triton import _fold, _plan_forward, flash_backward, flash_forward

    if DEVICE == "cuda":
        pytest.skip("the GPU tests run these layouts through the model")
    b, hq, hkv, n = 2, 4, 2, 37
    q, k, v = _heads_last(b, n, hq, d, packed), _heads_last(b, n, hkv, d, packed), _heads_last(b, n, hkv, d)
    do = _heads_last(b, n, hq, d) if do_layout == "same" else torch.randn(b, hq, n, d)
    assert (_fold(q), _fold(k), _fold(v)) == (hq, hkv, hkv)
    kc, kn = KernelConfig(32, 16, 1, 1, tma=tma), KernelConfig(16, 32, 1, 1, tma=tma)
    cfg = FlashConfig(kc, kn, kn, kc, single_max_programs=1 << 20 if backward == "single" else 0)
    assert _plan_forward(q, k, v, cfg, None, 0, False)[2] is False, "a heads-last layout must not be copied"
    o, lse = flash_forward(q, k, v, True, config=cfg)
    grads = flash_backward(q, k, v, o, lse, do, True, config=cfg, deterministic=backward == "deterministic")
    for t, like in zip((o, *grads), (q, q, k, v), strict=True):
        assert t.transpose(1, 2).is_contiguous() and t.shape == like.shape, "outputs in the inputs' layout"
    ref = _grouped_reference(q, k, v, do, True)
    for name, a, r in zip(("O", "L", "dQ", "dK", "dV"), (o, lse, *grads), ref):
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_deterministic_backward_is_bitwise_reproducible(seed):
    """Two deterministic backwards of the same inputs agree bit for bit (here in the interpreter; the GPU
    test repeats this at a size where atomics would reorder)."""
    q, k, v, do = (torch.randn(2, 45, 32, device=DEVICE) for _ in range(4))

    def grads():
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        FlashAttention2Triton.apply(qq, kk, vv, True, True).backward(do)
        return qq.grad, kk.grad, vv.grad

    for a, b in zip(grads(), grads()):
        assert torch.equal(a, b)


def test_atomic_free_default_matches_the_deterministic_backward_bitwise(seed):
    """A config with ``atomic_dq=False`` (the table's choice at head dim 128) runs the deterministic kernels by
    default: the same bits as ``deterministic=True``, and the table keeps that choice under pinned tiles."""
    from cs336_systems.attention import _tuning
    from cs336_systems.attention.flash_triton import flash_backward, flash_forward

    kc = _tuning.KernelConfig(16, 16, 1, 1)
    q, k, v, do = (torch.randn(2, 37, 16, device=DEVICE) for _ in range(4))
    o, lse = flash_forward(q, k, v, True)
    free = flash_backward(q, k, v, o, lse, do, True, _tuning.FlashConfig(kc, kc, kc, kc, atomic_dq=False))
    det = flash_backward(q, k, v, o, lse, do, True, _tuning.FlashConfig(kc, kc, kc, kc), deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(free, det, strict=True))
    assert not _tuning._table(128, 2, tma=True).atomic_dq and _tuning._table(64, 2, tma=True).atomic_dq
    pins = {"capability": [9, 0], "configs": {"bwd|d128|bfloat16": kc}}
    assert not _tuning.resolve(128, torch.bfloat16, 4096, (9, 0), pins).atomic_dq


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's fp32 path; on CUDA the GPU tests cover the forms")
def test_eager_calls_take_the_single_backward_up_to_their_own_bound(monkeypatch, seed):
    """An eager autograd.Function call takes the single-kernel backward up to ``eager_single_max_pairs`` (the
    host's time is its cost there) and its lean forward (``_Plan.eager``), with dQ, dK and dV allocated like Q, K
    and V, while ``flash_backward`` (the captured and compiled calls' planner) keeps the three kernels; both against
    fp64. A non-contiguous Q takes the general forward and allocates its gradients by ``_side_empty``."""
    from cs336_systems.attention import _tuning
    from cs336_systems.attention import flash_triton as ft
    from cs336_systems.attention._tuning import FlashConfig, KernelConfig

    kc, kn = KernelConfig(32, 16, 1, 1), KernelConfig(16, 32, 1, 1)
    cfg = FlashConfig(kc, kn, kn, kc, single_max_programs=0, eager_single_max_pairs=6 * 45 * 45)
    monkeypatch.setattr(_tuning, "config_for", lambda *a: cfg)
    monkeypatch.setattr(ft, "_PLANS", {})
    q, k, v, do = (torch.randn(2, 3, 45, 24) for _ in range(4))
    out = run_impl(FlashAttention2Triton, q, k, v, do, True)
    (plan,) = ft._PLANS.values()
    (plan_bwd,) = plan.backward.values()
    assert plan.eager is not None and plan_bwd[0] == "single" and plan_bwd[-1] == "like", (plan_bwd[0], plan_bwd[-1])
    dq, dk, dv = out[2:]
    assert all(g.is_contiguous() and g.shape == q.shape for g in (*out[:1], dq, dk, dv))
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), out, run_reference(q, k, v, do, True)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # Q's values, not its layout: the general route
    out = run_impl(FlashAttention2Triton, qt, k, v, do, True)
    (odd,) = [p for key, p in ft._PLANS.items() if key[2] == qt.stride()]
    assert odd.eager is None and [b[-1] for b in odd.backward.values()] == ["side"]
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), out, run_reference(q, k, v, do, True)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")

    o, lse = ft.flash_forward(q, k, v, True, config=cfg)
    assert ft._plan_backward(q, k, v, o, lse, do, cfg, False, None, 0, False)[0] == "atomic"
    assert ft._plan_backward(q, k, v, o, lse, do, cfg, False, None, 0, False, eager=True)[0] == "single"
    bound = dataclasses.replace(cfg, eager_single_max_pairs=6 * 45 * 45 - 1)  # one pair short
    assert ft._plan_backward(q, k, v, o, lse, do, bound, False, None, 0, False, eager=True)[0] == "atomic"


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's fp32 path")
@pytest.mark.parametrize("persistent", [False, True])
def test_eager_forward_launches_as_the_general_forward(persistent, monkeypatch, seed):
    """The Functions' eager forward (``_Plan.eager``) hands its launch what ``_launch_forward`` does for the same
    plan: the grid, the arguments, Q, K and V, a fresh O and L of the same layouts, and in the documents' slot the
    persistent kernel's work counter or L (the persistent Gluon kernel runs only on sm_90: a recording launch here)."""
    import types

    from cs336_systems.attention import flash_triton as ft

    monkeypatch.setattr(ft, "_PLANS", {})
    counter = torch.zeros(2, dtype=torch.int32)
    monkeypatch.setattr(ft, "_work_counter", lambda device: counter)
    q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))
    plan = ft._plan_for(q, k, v, ("apply", True), None, None)
    calls = []

    class Recorder:
        cfg = types.SimpleNamespace(persistent=persistent)

        def __call__(self, grid, pointers, scalars):
            calls.append((grid, pointers, scalars))

    _, grid, copy, scalars, folds = plan.fwd
    plan.fwd = (Recorder(), grid, copy, scalars, folds)
    plan.eager = ft._eager_forward(plan.fwd, q, plan.scale)
    o, lse, _ = ft._run_forward(types.SimpleNamespace(), q, k, v, ("apply", True), None, None)
    ft._launch_forward(plan, q, k, v, None, None, plan.scale)
    (grid1, ptr1, args1), (grid2, ptr2, args2) = calls
    assert grid1 == grid2 and args1 == args2 and ptr1[0] is ptr2[0] is q and ptr1[1] is k and ptr1[2] is v
    assert ptr1[3] is o and ptr1[4] is lse and ptr1[6] is lse and ptr2[6] is ptr2[4]
    for a, b in zip(ptr1[3:5], ptr2[3:5], strict=True):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
    assert (ptr1[5] is counter and ptr2[5] is counter) if persistent else (ptr1[5] is lse and ptr2[5] is ptr2[4])


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's fp32 path")
def test_plans_key_on_pointer_alignment(seed):
    """A Q whose data starts 4 bytes past a 16-byte boundary gets a plan of its own (Triton specialises pointers on
    16-byte alignment), marked by ``_aligned``'s bits (set for the aligned tensors, and one past them), and matches
    fp64."""
    from cs336_systems.attention import flash_triton as ft

    q = torch.randn(2 * 3 * 40 * 16 + 1)[1:].view(2, 3, 40, 16)
    k, v, do = (torch.randn(2, 3, 40, 16) for _ in range(3))
    assert ft._aligned(k, v, do) == 0
    assert ft._aligned(q, k, v) == 0b110 | 1 << 3
    q, k, v = (t.requires_grad_() for t in (q, k, v))  # q stays the offset view (run_impl would clone it)
    o = FlashAttention2Triton.apply(q, k, v, True)
    lse = next(t for t in o.grad_fn.saved_tensors if t.shape == q.shape[:-1])
    o.backward(do)
    assert any(key[13] for key in ft._PLANS if key[0] == ("apply", True) and key[1] == q.shape)
    out = (o.detach(), lse, q.grad, k.grad, v.grad)
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), out, run_reference(q, k, v, do, True)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_kernel_config_rejects_bad_tiles():
    from cs336_systems.attention._tuning import KernelConfig

    with pytest.raises(ValueError, match="power of two"):
        KernelConfig(48, 64)
    with pytest.raises(ValueError, match="warp_specialize needs num_warps=4"):
        KernelConfig(64, 64, 4, 2, True, warp_specialize=True)  # neither side has the two warpgroups' 128 rows
    with pytest.raises(ValueError, match="warp_specialize needs num_warps=4"):
        KernelConfig(128, 64, 8, 2, True, warp_specialize=True)
    with pytest.raises(ValueError, match="warp_specialize needs tma=True"):
        KernelConfig(128, 64, 4, 2, False, warp_specialize=True)
    assert KernelConfig(128, 128, 4, 2, True, warp_specialize=True, persistent=True).short() == "128x128/w4/s2/tma/ws/p"
    with pytest.raises(ValueError, match="interleave must be an int >= 0"):
        KernelConfig(64, 64, 4, 3, True, persistent=True, interleave=-1)


def test_persistent_work_groups_are_divisors_of_the_heads_that_fit_the_cache():
    """``interleave_for``: a pinned group size wins (clipped to the heads); without a mask 1; causal, the largest
    divisor of the heads whose inputs fit the kernel's share of L2 (10% over allowed)."""
    from cs336_systems.attention._tuning import L2_SHARE, KernelConfig, interleave_for

    auto, l2 = KernelConfig(64, 64, 4, 3, True, persistent=True), 50 * 2**20
    assert interleave_for(KernelConfig(64, 64, interleave=7), "fwd", True, 5, 1, l2) == 5
    assert interleave_for(KernelConfig(64, 64, interleave=3), "bwd", False, 100, 2**30, l2) == 3
    assert interleave_for(auto, "fwd", False, 100, 1, l2) == 1
    per_group = l2 * L2_SHARE["fwd"]
    assert interleave_for(auto, "fwd", True, 100, int(per_group // 25), l2) == 25  # xl: 100 heads, K and V 512 KiB
    assert interleave_for(auto, "fwd", True, 100, int(per_group // 24), l2) == 25  # 25 is within the 10%
    assert interleave_for(auto, "fwd", True, 100, int(per_group // 20), l2) == 20  # 25 is not: the next divisor
    assert interleave_for(auto, "fwd", True, 16, int(per_group / 3.1), l2) == 2  # 3 and 4 split 16 unevenly / too big
    assert interleave_for(auto, "bwd", True, 97, int(l2 * L2_SHARE["bwd"] / 50), l2) == 1  # a prime count of heads
    assert interleave_for(auto, "bwd", True, 96, 1, l2) == 96
    assert interleave_for(auto, "fwd", True, 16, 10 * l2, l2) == 1  # one head overflows the share: a head at a time


def test_small_calls_take_tiles_of_their_own_on_sm90_only():
    """On sm_90 a small forward (by query tiles x heads) takes the tiles of the first tier that holds it (the Gluon
    forward's where it runs, else the Triton forward's by block pointers: the planner below), and the single backward
    its own pointer tiles; other GPUs and the CPU keep their tables."""
    from cs336_systems.attention import _tuning
    from cs336_systems.attention.flash_triton import _plan_forward

    K = _tuning.KernelConfig
    d64, d128 = (_tuning.resolve(d, torch.bfloat16, 512, (9, 0), {}) for d in (64, 128))
    assert d64.small_forward(128, 1) == K(64, 128, 4, 2)  # one wave: 128-key steps
    assert d128.small_forward(128, 1) == K(64, 64, 4, 2)  # one warpgroup's Gluon tile, not the two-warpgroup one
    assert d64.small_forward(256, 100) == K(64, 64, 4, 2)  # 400 programs
    assert d64.small_forward(512, 96) is None and d128.small_forward(256, 100) is None  # 768 / 400: Gluon
    assert d64.single == d128.single == K(64, 64, 4, 2) and not d64.single.tma
    for other in (_tuning.resolve(64, torch.bfloat16, 128, (8, 0), {}), _tuning.CPU_CONFIG,
                  _tuning.resolve(64, torch.float32, 128, (9, 0), {})):
        assert other.small_forward(1, 1) is None and other.single is None
    # the planner (CPU tensors: the table's tiles, no descriptors) launches the tier's tiles
    q = torch.zeros(2, 3, 100, 64)
    cfg = dataclasses.replace(_tuning.CPU_CONFIG, small_fwd=((6, K(64, 32, 4, 2)), (24, K(32, 32, 4, 2))))

    def tiles(x, config=cfg):
        c = _plan_forward(x, x, x, config, None, 0, False)[0].constexprs
        return c["BLOCK_M"], c["BLOCK_N"]

    assert tiles(q[:1, :1]) == (64, 32)  # 2 programs: the first tier
    assert tiles(q) == (32, 32)  # 2 x 6 programs of 64 rows, 4 x 6 of 32: the second tier
    assert tiles(torch.zeros(2, 4, 100, 64)) == (16, 16)  # 32 programs: the table's forward


def test_pinned_json_is_used_on_its_capability_only(tmp_path):
    import json

    from cs336_systems.attention import _tuning

    fwd = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2, "tma": True}
    long_fwd = dict(fwd, block_m=128)
    hopper = dict(fwd, block_n=128, num_stages=3)
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"capability": [9, 0], "configs": {"fwd|d64|bfloat16": fwd,
                                                                    "fwd|d64|bfloat16|q65536": long_fwd,
                                                                    "hopper_fwd|d64|bfloat16": hopper}}))
    pins = _tuning.load_pinned(path)
    table = _tuning._table(64, 2, tma=True)
    got = _tuning.resolve(64, torch.bfloat16, 16384, (9, 0), pins)
    assert got.fwd == _tuning.KernelConfig(**fwd) and got.bwd == table.bwd and got.dq == table.dq
    assert got.hopper_fwd == _tuning.KernelConfig(**hopper)
    assert _tuning.resolve(64, torch.bfloat16, 40000, (9, 0), pins).fwd == _tuning.KernelConfig(**long_fwd)
    assert _tuning.resolve(128, torch.bfloat16, 4096, (9, 0), pins) == _tuning._table(128, 2, tma=True, hopper=True)
    assert _tuning.resolve(64, torch.bfloat16, 16384, (8, 0), pins) == _tuning._table(64, 2, tma=False)
    # the Gluon forward only on sm_90 (warpgroup MMAs), never from a pin elsewhere
    assert _tuning.resolve(64, torch.bfloat16, 16384, (10, 0), pins).hopper_fwd is None
    # a warp-specialised forward splits 128 query rows between its consumers: a pin of another shape is refused
    path.write_text(json.dumps({"capability": [9, 0], "configs": {
        "hopper_fwd|d128|bfloat16": dict(fwd, block_n=128, warp_specialize=True)}}))
    with pytest.raises(ValueError, match="hopper_fwd needs block_m=128"):
        _tuning.resolve(128, torch.bfloat16, 4096, (9, 0), _tuning.load_pinned(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tuning file"):
        _tuning.load_pinned(path)
    assert _tuning.load_pinned(tmp_path / "absent.json") == {}


def test_adapters_return_the_classes():
    from tests import adapters

    assert adapters.get_flashattention_autograd_function_pytorch() is FlashAttention2Torch
    assert adapters.get_flashattention_autograd_function_triton() is FlashAttention2Triton


# --------------------------------------------------------------------------------------------- GPU
def _naive(q, k, v, is_causal):
    """Attention computed entirely in the inputs' dtype (the peer in the 2x rule)."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _rounding_atol(ref: torch.Tensor, dtype: torch.dtype, head_dim: int | None = None) -> float:
    """The dtype's rounding step at the data's magnitude (flash-attention's atol). For attention's outputs and
    gradients (``head_dim`` given) also the fp32 noise of the backward's cancellation dS = P (dP - D): dP and D are
    both sums of d products of order 1, summed in different orders, so where the exact gradient is 0 (a single
    key: P = 1, dP = D) about 4 d fp32 epsilons remain (3e-5 at d = 64, far below a bf16 step at unit scale)."""
    fp32_noise = 4 * head_dim * torch.finfo(torch.float32).eps if head_dim else 0.0
    return 2 * ((ref + 0.3 - 0.3).to(dtype).float() - ref).abs().max().item() + max(1e-6, fp32_noise)


GPU_GRID = [
    ((2, 3), 1, 1, 64, False),
    ((2, 3), 17, 77, 48, False),
    ((1, 4), 100, 100, 80, True),
    ((3,), 130, 17, 96, True),
    ((1, 2), 1000, 1000, 64, True),
    ((1, 2), 1023, 2049, 128, False),
    ((1, 2), 4096, 4096, 16, True),
    ((1, 1), 8192, 8192, 64, True),
    ((1, 1), 777, 777, 256, True),
    ((1, 3), 333, 333, 32, True),
    ((1, 2), 300, 301, 192, False),
    ((4, 25), 512, 512, 64, True),  # the xl model at context 512 (issue 18's shapes, scaled down below)
    ((2, 12), 512, 512, 64, True),
    ((1, 1), 128, 128, 64, True),
    ((1, 4), 2048, 2048, 128, False),
]


def _gpu_case(lead, n_q, n_k, d, causal, dtype):
    """Fresh GPU inputs in dtype, the fp32 reference (O, L, dQ, dK, dV) and the naive attention's (no L)."""
    q = torch.randn(*lead, n_q, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(*lead, n_k, d, device="cuda", dtype=dtype) for _ in range(2))
    do = torch.randn(*lead, n_q, d, device="cuda", dtype=dtype)
    ref = run_reference(q, k, v, do, causal, dtype=torch.float32)
    qn, kn, vn = (t.detach().clone().requires_grad_() for t in (q, k, v))
    on = _naive(qn, kn, vn, causal)
    on.backward(do)
    naive = (on.detach(), None, qn.grad, kn.grad, vn.grad)
    return q, k, v, do, ref, naive


def _assert_within_twice_naive(ours, ref, naive, dtype, what: str = "") -> None:
    """Each output finite and within twice the naive attention's error against the fp32 reference (plus
    dtype rounding); L, fp32 in ours and absent from naive, within a plain fp32-level 1e-2."""
    for i, name in enumerate(("O", "L", "dQ", "dK", "dV")):
        got = ours[i].float()
        assert torch.isfinite(got).all(), f"{what}{name} has NaN/Inf"
        err = (got - ref[i]).abs().max().item()
        if naive[i] is None:
            assert err <= 1e-2, f"{what}L error {err}"
            continue
        bound = 2 * (naive[i].float() - ref[i]).abs().max().item() + _rounding_atol(ref[i], dtype,
                                                                                   ref[i].shape[-1])
        assert err <= bound, f"{what}{name}: error {err:.3g} > bound {bound:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(("lead", "n_q", "n_k", "d", "causal"), GPU_GRID)
def test_gpu_low_precision_within_twice_naive_error(lead, n_q, n_k, d, causal, dtype, seed):
    q, k, v, do, ref, naive = _gpu_case(lead, n_q, n_k, d, causal, dtype)
    _assert_within_twice_naive(run_impl(FlashAttention2Triton, q, k, v, do, causal), ref, naive, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_fp32_matches_fp64(impl, causal, seed):
    q, k, v, do = (torch.randn(2, 3, 300, 64, device="cuda") for _ in range(4))
    ours = run_impl(IMPLS[impl], q, k, v, do, causal)
    ref = run_reference(q, k, v, do, causal)
    for name, a, b in zip(("O", "L", "dQ", "dK", "dV"), ours, ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_deterministic_backward_is_bitwise_reproducible(d, seed):
    """deterministic=True: bit-identical gradients across runs (and within the 2x rule); the default
    (atomic dQ) backward is checked by the same rule, not for bits."""
    dtype = torch.bfloat16
    q, k, v, do, ref, naive = _gpu_case((2, 4), 2000, 2000, d, True, dtype)

    def run(deterministic):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = FlashAttention2Triton.apply(qq, kk, vv, True, deterministic)
        lse = next(t for t in o.grad_fn.saved_tensors if t.shape == q.shape[:-1])
        o.backward(do)
        return o.detach(), lse.detach(), qq.grad, kk.grad, vv.grad

    first, second = run(True), run(True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    _assert_within_twice_naive(first, ref, naive, dtype, what="deterministic: ")
    torch.use_deterministic_algorithms(True)
    try:
        assert all(torch.equal(a, b) for a, b in zip(run(False), first)), "use_deterministic_algorithms ignored"
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_single_kernel_backward_is_bitwise_reproducible(d, seed):
    """The single-kernel backward (the default for small calls) has no atomics: bit-identical gradients across
    runs, within the 2x rule, at a small batch of 500-long sequences (odd length: a partial last tile)."""
    from cs336_systems.attention import flash_triton as ft

    dtype = torch.bfloat16
    q, k, v, do, ref, naive = _gpu_case((2, 8), 500, 500, d, True, dtype)
    mode = ft._plan_backward(q, k, v, q, q[..., 0].float(), do, None, False, None, 0, False)[0]
    assert mode == "single", f"this call no longer takes the single kernel ({mode})"

    def run():
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = FlashAttention2Triton.apply(qq, kk, vv, True)
        lse = next(t for t in o.grad_fn.saved_tensors if t.shape == q.shape[:-1])
        o.backward(do)
        return o.detach(), lse.detach(), qq.grad, kk.grad, vv.grad

    first = run()
    assert all(torch.equal(a, b) for a, b in zip(first, run()))
    _assert_within_twice_naive(first, ref, naive, dtype, what="single: ")


@pytest.mark.gpu
@pytest.mark.parametrize(("lead", "n", "causal"), [((4, 25), 512, True), ((8, 12), 509, False)])
def test_gpu_eager_and_captured_calls_plan_their_own_backward(lead, n, causal, monkeypatch, seed):
    """At the model shapes of 512 tokens an eager call runs its forward from the plan's recipe (``_Plan.eager``) and
    takes the single-kernel backward, and the same call captured in a CUDA graph the three-kernel one, as do eager
    calls inside ``captured_forms``; all within the 2x rule (the graph's after a replay)."""
    from cs336_systems.attention import flash_triton as ft

    dtype = torch.bfloat16
    q, k, v, do, ref, naive = _gpu_case(lead, n, n, 64, causal, dtype)
    monkeypatch.setattr(ft, "_PLANS", {})  # this test's plans alone (others may have planned these shapes)

    def modes(eager: bool) -> set:
        return {bwd[0] for p in ft._PLANS.values() for key, bwd in p.backward.items()
                if key[0] == q.shape and key[-1] == eager}

    eager = run_impl(FlashAttention2Triton, q, k, v, do, causal)
    assert modes(True) == {"single"} and not modes(False), (modes(True), modes(False))
    assert all(p.eager is not None for p in ft._PLANS.values())
    _assert_within_twice_naive(eager, ref, naive, dtype, what="eager: ")

    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside capture
            FlashAttention2Triton.apply(qq, kk, vv, causal).backward(do)
    torch.cuda.current_stream().wait_stream(stream)
    for t in (qq, kk, vv):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = FlashAttention2Triton.apply(qq, kk, vv, causal)
        lse = next(t for t in o.grad_fn.saved_tensors if t.shape == q.shape[:-1])
        o.backward(do)
    assert modes(False) and "single" not in modes(False), modes(False)
    graph.replay()
    torch.cuda.synchronize()
    _assert_within_twice_naive((o.detach(), lse, qq.grad, kk.grad, vv.grad), ref, naive, dtype, what="graph: ")

    with ft.captured_forms():
        planned = run_impl(FlashAttention2Triton, q, k, v, do, causal)
    _assert_within_twice_naive(planned, ref, naive, dtype, what="captured forms: ")
    assert modes(True) == {"single"}  # the eager entry untouched


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_large_logits_stay_finite(dtype, seed):
    """Scores of several hundred (|q|, |k| ~ 30): the online softmax must not overflow or produce NaN."""
    q, k, v, do = (torch.randn(1, 2, 700, 64, device="cuda", dtype=dtype) for _ in range(4))
    q, k = q * 30, k * 30
    ours = run_impl(FlashAttention2Triton, q, k, v, do, True)
    ref = run_reference(q, k, v, do, True, dtype=torch.float32)
    for name, a in zip(("O", "L", "dQ", "dK", "dV"), ours):
        assert torch.isfinite(a).all(), name
    assert (ours[0].float() - ref[0]).abs().max().item() <= 0.05


@pytest.mark.gpu
def test_gpu_compiled_apply_leaderboard_style(seed):
    """The leaderboard's call: torch.compile(apply)(q, k, v, True), then o.sum().backward()."""
    q, k, v = (torch.randn(4, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    flash = torch.compile(FlashAttention2Triton.apply)
    o = flash(q, k, v, True)
    o.sum().backward()
    ref = run_reference(q, k, v, torch.ones_like(o), True, dtype=torch.float32)
    qn, kn, vn = (t.detach().clone().requires_grad_() for t in (q, k, v))
    _naive(qn, kn, vn, True).sum().backward()
    for got, r, n in ((o, ref[0], None), (q.grad, ref[2], qn.grad), (k.grad, ref[3], kn.grad)):
        if n is None:
            n = _naive(*(t.detach() for t in (q, k, v)), True)
        bound = 2 * (n.float() - r).abs().max().item() + _rounding_atol(r, torch.bfloat16, r.shape[-1])
        assert (got.float() - r).abs().max().item() <= bound


@pytest.mark.gpu
def test_gpu_flash_triton_model_matches_sdpa_model(seed):
    from cs336_basics.model import BasicsTransformerLM

    kwargs = dict(vocab_size=1000, context_length=512, d_model=256, num_layers=2, num_heads=4, d_ff=512,
                  device="cuda")
    torch.manual_seed(seed)
    ref = BasicsTransformerLM(**kwargs, attention_backend="sdpa")
    models = {}
    for name in ("sdpa", "flash_triton"):
        m = BasicsTransformerLM(**kwargs, attention_backend=name, dtype=torch.bfloat16)
        m.load_state_dict({k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()})
        models[name] = m
    tokens = torch.randint(0, 1000, (2, 500), device="cuda")
    targets = torch.randint(0, 1000, (2, 500), device="cuda")

    def loss_and_grads(model):
        loss = torch.nn.functional.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten())
        loss.backward()
        return loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()}

    ref_loss, ref_grads = loss_and_grads(ref)
    sd_loss, sd_grads = loss_and_grads(models["sdpa"])
    fl_loss, fl_grads = loss_and_grads(models["flash_triton"])
    assert (fl_loss - ref_loss).abs() <= 2 * (sd_loss - ref_loss).abs() + _rounding_atol(ref_loss, torch.bfloat16)
    for n, g in ref_grads.items():
        bound = 2 * (sd_grads[n] - g).abs().max().item() + _rounding_atol(g, torch.bfloat16)
        assert (fl_grads[n] - g).abs().max().item() <= bound, n


# (leading dims, Nq, Nk, d, causal): boundary tiles, Nq != Nk, padded head dim
VARIANT_GPU_GRID = [
    ((2, 3), 1000, 1000, 64, True),
    ((1, 2), 1300, 777, 48, True),
    ((1, 3), 500, 700, 128, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("lead", "n_q", "n_k", "d", "causal"), VARIANT_GPU_GRID)
def test_gpu_kernel_forms_within_twice_naive_error(lead, n_q, n_k, d, causal, seed):
    """The pinned configs and both addressing forms (block pointers, TMA) with both backwards against the
    fp32 reference, by the same 2x-naive rule as the default path."""
    from cs336_systems.attention._tuning import FlashConfig, KernelConfig, config_for
    from cs336_systems.attention.flash_triton import flash_backward, flash_forward

    dtype = torch.bfloat16
    q, k, v, do, ref, naive = _gpu_case(lead, n_q, n_k, d, causal, dtype)
    d_pad = max(16, 1 << (d - 1).bit_length())
    configs = [config_for(q.device, n_q, d_pad, dtype)]
    for tma in (False, True):
        a, b = KernelConfig(64, 64, 4, 3, tma=tma), KernelConfig(32, 64, 4, 3, tma=tma)
        configs.append(FlashConfig(a, b, b, KernelConfig(64, 32, 4, 3, tma=tma)))
    configs += [dataclasses.replace(c, single_max_programs=1 << 20) for c in configs[:2]]  # the single kernel
    for cfg in configs:
        o, lse = flash_forward(q, k, v, causal, config=cfg)
        for deterministic in (False, True):
            ours = (o, lse, *flash_backward(q, k, v, o, lse, do, causal, config=cfg, deterministic=deterministic))
            _assert_within_twice_naive(ours, ref, naive, dtype, what=f"{cfg} det={deterministic}: ")


HOPPER_GPU_GRID = [  # (lead dims, Nq, Nk, d, causal): odd lengths, Nq != Nk both ways, a single row
    ((1, 2), 1000, 1000, 64, True), ((2, 3), 257, 513, 128, False), ((1, 2), 300, 200, 64, True),
    ((1, 2), 200, 300, 128, True), ((1, 1), 1, 1, 64, True), ((2,), 4099, 4099, 64, True),
    ((4, 25), 1000, 1000, 64, True), ((3, 16), 1100, 1100, 128, False),  # more query tiles than SMs: persistent
]


@pytest.mark.gpu
@pytest.mark.parametrize(("lead", "n_q", "n_k", "d", "causal"), HOPPER_GPU_GRID)
def test_gpu_hopper_forward_tiles_within_twice_naive_error(lead, n_q, n_k, d, causal, seed):
    """The Gluon forward (sm_90 only) is what a 16-bit call at head dim 64/128 runs (a small call with its tier's
    tiles, ``small_fwd``), and every tile shape it may be given (one and two warpgroups, 64- and 128-key tiles, 2-3
    ring stages, a program per item or persistent) meets the 2x-naive rule at every shape."""
    from cs336_systems.attention._tuning import KernelConfig, config_for
    from cs336_systems.attention.flash_triton import _plan_forward, flash_backward, flash_forward, normalize_window

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon forward needs sm_90 (warpgroup MMAs)")
    dtype = torch.bfloat16
    q, k, v, do, ref, naive = _gpu_case(lead, n_q, n_k, d, causal, dtype)
    base = config_for(q.device, n_q, d, dtype)
    left, right = normalize_window(None, causal, n_q, n_k)
    small = base.small_forward(n_q, q[..., 0, 0].numel())
    launch = _plan_forward(q, k, v, None, left, right, False)[0]
    assert launch.kernel.__name__.startswith("_hopper_fwd"), launch.kernel.__name__
    if small is not None:  # a small call: the tier's tiles, a program per item
        c = launch.constexprs
        assert (c["BLOCK_M"], c["BLOCK_N"], c["PERSISTENT"]) == (small.block_m, small.block_n, False), c
    base = dataclasses.replace(base, small_fwd=())  # the Gluon kernels at every shape below
    for tile in (KernelConfig(64, 64, 4, 3, True), KernelConfig(64, 128, 4, 3, True),
                 KernelConfig(128, 128, 8, 2, True), KernelConfig(128, 64, 8, 2, True),
                 KernelConfig(128, 128, 4, 2, True, warp_specialize=True),
                 KernelConfig(128, 64, 4, 3, True, warp_specialize=True),
                 KernelConfig(128, 128, 4, 2, True, warp_specialize=True, persistent=True),
                 # three 128-key stages beside Q and O's buffers fit in shared memory at head dim 64 only
                 *[KernelConfig(128, 128, 4, 3, True, warp_specialize=True, persistent=True)] * (d == 64)):
        cfg = dataclasses.replace(base, hopper_fwd=tile)
        o, lse = flash_forward(q, k, v, causal, config=cfg)
        ours = (o, lse, *flash_backward(q, k, v, o, lse, do, causal, config=base))
        _assert_within_twice_naive(ours, ref, naive, dtype, what=f"{tile.short()}: ")


HEADS_LAST_GPU_GRID = [  # (batch, query heads, key/value heads, N, d, causal)
    (4, 25, 25, 1000, 64, True), (2, 8, 2, 777, 128, True), (3, 16, 16, 1100, 128, False), (2, 4, 1, 300, 64, True)]


@pytest.mark.gpu
@pytest.mark.parametrize(("b", "hq", "hkv", "n", "d", "causal"), HEADS_LAST_GPU_GRID)
def test_gpu_heads_last_layouts_within_twice_naive_error(b, hq, hkv, n, d, causal, seed):
    """(B, H, N, d) views of (B, N, H, d) storage, as the model passes them, through the Gluon forwards (every tile
    form, persistent ones included) and the default backward, grouped-query heads included: no copies, outputs in
    the inputs' layout, and the 2x-naive rule against fp32."""
    from cs336_systems.attention import flash_triton as ft
    from cs336_systems.attention._tuning import KernelConfig, config_for

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels need sm_90 (warpgroup MMAs)")
    dtype, group = torch.bfloat16, hq // hkv

    def heads_last(h):
        return torch.randn(b, n, h, d, device="cuda", dtype=dtype).transpose(1, 2)

    q, k, v, do = heads_last(hq), heads_last(hkv), heads_last(hkv), heads_last(hq)
    kk, vv = (t.repeat_interleave(group, dim=1) for t in (k, v))
    ref = run_reference(q, kk, vv, do, causal, dtype=torch.float32)
    qn, kn, vn = (t.detach().clone().requires_grad_() for t in (q, k, v))
    on = _naive(qn, kn.repeat_interleave(group, dim=1), vn.repeat_interleave(group, dim=1), causal)
    on.backward(do)
    naive = (on.detach(), None, qn.grad, kn.grad, vn.grad)
    ref = (*ref[:3], *(g.unflatten(1, (hkv, group)).sum(2) for g in ref[3:]))
    base = config_for(q.device, n, d, dtype)
    right, scale = 0 if causal else None, 1 / math.sqrt(d)
    plan = ft._plan_forward(q, k, v, None, None, right, False)
    assert plan[0].kernel.__name__.startswith("_hopper_fwd"), plan[0].kernel.__name__  # small calls too
    assert plan[2] is False, "no copies"
    tiles = [None, KernelConfig(64, 64, 4, 3, True, persistent=True), KernelConfig(64, 128, 4, 3, True),
             KernelConfig(128, 128, 4, 2, True, warp_specialize=True),
             KernelConfig(128, 128, 4, 2, True, warp_specialize=True, persistent=True)]
    for tile in tiles:
        cfg = base if tile is None else dataclasses.replace(base, hopper_fwd=tile, small_fwd=())
        o, lse = ft._forward(q, k, v, cfg, None, right, None, None, scale)
        grads = ft._backward(q, k, v, o, lse, do, base, False, None, right, None, None, scale)
        for t in (o, *grads):
            assert t.transpose(1, 2).is_contiguous(), "outputs in the inputs' (B, N, H, d) layout"
        _assert_within_twice_naive((o, lse, *grads), ref, naive, dtype, what=f"{tile and tile.short()}: ")
    o = ft.flash_attention(q, k, v, causal)  # the public entry point, grouped heads, the same layout
    assert o.transpose(1, 2).is_contiguous()


@pytest.mark.gpu
def test_gpu_variant_falls_back_on_layouts_descriptors_cannot_describe(seed):
    """A view whose base is 8 bytes off a 16-byte boundary cannot be a tensor descriptor: the tma config
    must run the block-pointer kernels and still be right."""
    from cs336_systems.attention._tuning import FlashConfig, KernelConfig
    from cs336_systems.attention.flash_triton import _tma_ready, flash_forward

    wide = torch.randn(2, 300, 2 * 40 + 8, device="cuda", dtype=torch.bfloat16)
    q = wide[..., 4:44]  # base 8 bytes past the allocation's: not 16-byte aligned
    assert not _tma_ready(q)
    kc = KernelConfig(64, 64, 4, 2, tma=True)
    o, _ = flash_forward(q, q, q, True, config=FlashConfig(kc, kc, kc, kc))
    ref, _ = reference(q.float(), q.float(), q.float(), True, dtype=torch.float32)
    assert (o.float() - ref).abs().max().item() <= 2e-2


def test_flash_auto_chooses_by_the_nearest_measured_shape():
    from torch.nn.attention import SDPBackend

    from cs336_systems.attention.auto import choose, flash_auto_attention, sdpa_priority

    row = dict(batch_heads=100, head_dim=64, dtype="bfloat16", causal=True)
    table = {"device": "GPU X", "shapes": [dict(row, seq_len=512, ours_ms=0.2, sdpa_ms=0.3, sdpa_backend="sdpa_flash"),
                                           dict(row, seq_len=2048, ours_ms=0.9, sdpa_ms=0.7,
                                                sdpa_backend="sdpa_cudnn"),
                                           dict(row, seq_len=8192, ours_ms=9.0, sdpa_ms=7.0)]}  # an older table
    assert choose(96, 512, 64, torch.bfloat16, True, "GPU X", table) == "flash_triton"
    assert choose(96, 700, 64, torch.bfloat16, True, "GPU X", table) == "flash_triton"
    assert choose(96, 700, 64, torch.bfloat16, True, "GPU X", table, sdpa_only=True) == "sdpa_flash"
    assert choose(96, 2500, 64, torch.bfloat16, True, "GPU X", table) == "sdpa_cudnn"
    assert choose(96, 16384, 64, torch.bfloat16, True, "GPU X", table) == "sdpa"  # no backend named: PyTorch's
    assert choose(96, 512, 64, torch.bfloat16, True, "GPU Y", table) == "sdpa"  # another GPU model
    assert choose(96, 512, 128, torch.bfloat16, True, "GPU X", table) == "sdpa"  # nothing measured
    assert choose(96, 512, 64, torch.bfloat16, False, "GPU X", table) == "sdpa"
    assert sdpa_priority("sdpa_cudnn") == [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                           SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    assert sdpa_priority("sdpa_flash")[0] == SDPBackend.FLASH_ATTENTION and len(sdpa_priority("sdpa_flash")) == 4
    assert sdpa_priority("sdpa") is None and sdpa_priority("flash_triton") is None
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))  # CPU: SDPA
    torch.testing.assert_close(flash_auto_attention(q, k, v, True), reference(q, k, v, True, torch.float32)[0])


def test_flash_auto_takes_the_table_of_the_gpu_model():
    """A table file holds one table per GPU model: each model's own, none for an unmeasured model; the older
    single-table file reads as a list of one and anything else is refused."""
    from cs336_systems.attention.auto import AUTO_TABLE, auto_tables, choose, device_table

    row = dict(batch_heads=100, seq_len=2048, head_dim=64, dtype="bfloat16", causal=True, sdpa_backend="sdpa_cudnn")
    h100 = {"device": "NVIDIA H100 80GB HBM3", "records": "a.jsonl", "shapes": [dict(row, ours_ms=0.5, sdpa_ms=0.6)]}
    h200 = {"device": "NVIDIA H200", "records": "b.jsonl", "shapes": [dict(row, ours_ms=0.7, sdpa_ms=0.6)]}
    both = {"tables": [h100, h200]}
    assert choose(100, 2048, 64, torch.bfloat16, True, "NVIDIA H100 80GB HBM3", both) == "flash_triton"
    assert choose(100, 2048, 64, torch.bfloat16, True, "NVIDIA H200", both) == "sdpa_cudnn"
    assert choose(100, 2048, 64, torch.bfloat16, True, "NVIDIA B200", both) == "sdpa"
    assert device_table("NVIDIA H200", both) is h200 and device_table("NVIDIA B200", both) is None
    assert auto_tables(h100) == [h100]  # the older format: one table
    assert choose(100, 2048, 64, torch.bfloat16, True, "NVIDIA H100 80GB HBM3", h100) == "flash_triton"
    assert auto_tables({"tables": []}) == []
    for bad in ({}, [], {"tables": {}}, {"tables": [{"device": "X"}]}, {"device": 1, "shapes": []}):
        with pytest.raises(ValueError, match="not a flash_auto table file"):
            auto_tables(bad)
    devices = [t["device"] for t in auto_tables(json.loads(AUTO_TABLE.read_text()))]  # the committed file
    assert devices and len(set(devices)) == len(devices) and device_table(devices[0])["device"] == devices[0]


@pytest.mark.parametrize("decision", [None, "sdpa_efficient"])
def test_flash_auto_compiles_without_a_graph_break(monkeypatch, decision):
    """Under torch.compile the choice is a constant and the SDPA backend's priority context is traced: one graph
    (fullgraph), the same values as eager. ``sdpa_efficient`` first on a CPU falls through to the CPU's kernels."""
    from cs336_systems.attention import auto

    q, k, v = (torch.randn(2, 3, 17, 16, dtype=torch.float64) for _ in range(3))
    monkeypatch.setattr(auto, "_choices", {})
    if decision is not None:  # a GPU's answer, cached for this CPU call
        auto._choices[(tuple(q.shape), tuple(k.shape), q.dtype, True, q.device, False)] = decision
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: auto.flash_auto_attention(q, k, v, True), fullgraph=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), reference(q, k, v, True, torch.float64)[0])
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 25, 512, 64), (2, 25, 2048, 64), (3, 12, 333, 64)], ids=str)
def test_gpu_flash_auto_runs_the_measured_backend_within_twice_sdpa_error(shape, seed):
    """At the models' shapes (and an odd length) flash_auto's pick gives O and the three gradients within twice the
    error of PyTorch's default SDPA dispatch in bf16, against fp64; at a shape the committed table measured on this
    GPU model, the pick is what ran fastest there (ours, or the fastest SDPA backend: cuDNN or flash by shape)."""
    from cs336_systems.attention import auto

    q, k, v, do = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    ref = run_reference(q, k, v, do, True)

    def run(fn):
        qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o = fn(qs, ks, vs)
        o.backward(do)
        return o.detach(), qs.grad, ks.grad, vs.grad

    ours = run(lambda a, b, c: auto.flash_auto_attention(a, b, c, True))
    theirs = run(lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True))
    for name, got, peer, exact in zip(("O", "dQ", "dK", "dV"), ours, theirs, (ref[0], *ref[2:]), strict=True):
        err, peer_err = ((t.double() - exact).abs().max().item() for t in (got, peer))
        assert torch.isfinite(got).all() and err <= 2 * peer_err + 1e-3, f"{name}: {err:.3g} vs sdpa {peer_err:.3g}"
    key = (tuple(q.shape), tuple(k.shape), q.dtype, True, q.device, False)
    table = auto.device_table(torch.cuda.get_device_name()) or {"shapes": []}
    rows = [r for r in table["shapes"] if (r["batch_heads"], r["seq_len"], r["head_dim"], r["dtype"],
                                           r["causal"]) == (shape[0] * shape[1], *shape[2:], "bfloat16", True)]
    if rows:
        row = rows[0]
        assert auto._choices[key] == ("flash_triton" if row["ours_ms"] <= row["sdpa_ms"] else row["sdpa_backend"])


def test_flash_auto_marks_its_choice_as_torch_compiler_would():
    """``auto`` marks its choice constant by hand (importing torch._dynamo would import Triton too early); the mark
    must be the one ``torch.compiler.assume_constant_result`` sets, or Dynamo would trace the table lookup."""
    from cs336_systems.attention import auto

    def probe():
        return 0

    torch.compiler.assume_constant_result(probe)
    marks = dict(vars(probe))
    assert marks and all(getattr(auto._decide, k, None) == v for k, v in marks.items())


def test_cached_launch_passes_the_jit_argument_order(monkeypatch):
    """``_Launch`` compiles through the JIT once, then calls the compiled module's C launcher directly: grid,
    stream, function, metadata, no scratch and no hooks, the pointers as integers, the scalars, then the
    constexprs in signature order (whatever order the caller's dict has, a default where it has none); while a
    launch hook is set it goes through Triton's own path instead."""
    import triton

    from cs336_systems.attention import _tuning, flash_triton

    calls = []

    class Pointer:
        def __init__(self, p):
            self.p = p

        def data_ptr(self):
            return self.p

    class Run:
        global_scratch_size = global_scratch_align = profile_scratch_size = 0
        num_ctas, launch_cooperative_grid, launch_pdl = 1, False, False

        def launch(self, *args):
            calls.append(("c", args))

    class Compiled:
        run, function, packed_metadata = Run(), "fn", (4, 1, 0)

        def _init_handles(self):
            pass

        def __getitem__(self, grid):
            return lambda *args: calls.append(("triton", grid, args))

    class Param:
        def __init__(self, name, default=None):
            self.name, self.default, self.has_default = name, default, default is not None

    class Kernel:
        arg_names = ("A", "B", "N", "X", "Y", "Z")
        params = (Param("A"), Param("B"), Param("N"), Param("X"), Param("Y"), Param("Z", default=5))

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages, **constexprs):
                calls.append(("jit", grid, args, constexprs))
                return Compiled()
            return run

    monkeypatch.setattr(flash_triton, "_INTERPRETED", False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)
    launch = flash_triton._Launch(Kernel(), {"Y": 2, "X": 1}, _tuning.KernelConfig(16, 16))
    a, b = Pointer(1024), Pointer(2048)
    launch((3, 2, 1), (a, b), (7,))
    launch((3, 2, 1), (b, a), (7,))
    assert calls[0] == ("jit", (3, 2, 1), (a, b, 7), {"Y": 2, "X": 1})
    assert calls[1] == ("c", (3, 2, 1, 77, "fn", False, False, None, None, (4, 1, 0), None, None, None, 2048, 1024,
                              7, 1, 2, 5))
    hooks = triton.knobs.runtime.launch_enter_hook
    hook = lambda metadata: None
    hooks.add(hook)
    try:
        launch((3, 2, 1), (a, b), (7,))
    finally:
        hooks.remove(hook)
    assert calls[2] == ("triton", (3, 2, 1), (a, b, 7, 1, 2, 5))


def test_cached_launch_encodes_host_descriptors_once_per_address(monkeypatch):
    """A pointer argument that the kernel takes as a host-built TMA descriptor (``flash_hopper.HostDesc``): the JIT
    gets Triton's descriptor object; later calls bypass Triton's wrapper (the real one of this Triton, which would
    encode every call) and pass the C launcher the encoded map, then the shape and strides, encoding once per
    address."""
    import types

    import triton
    from triton.backends.nvidia.driver import _BASE_ARGS_FORMAT_LEN, wrap_handle_tensordesc

    from cs336_systems.attention import _tuning, flash_hopper, flash_triton

    calls, encoded = [], []

    class Pointer:
        def __init__(self, p):
            self.p = p

        def data_ptr(self):
            return self.p

    def c_launcher(*args):
        calls.append(("c", args))

    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [1, 64, 64], "fp4_padded": False}

    class Run:
        global_scratch_size = global_scratch_align = profile_scratch_size = 0
        num_ctas, launch_cooperative_grid, launch_pdl = 1, False, False
        launch = staticmethod(wrap_handle_tensordesc(c_launcher, {"A": "*bf16", "D": "tensordesc<bf16[1,64,64]>",
                                                                  "N": "i32"}, [meta]))

    class Compiled:
        run, function, packed_metadata = Run(), "fn", (4, 1, 0)
        metadata = types.SimpleNamespace(tensordesc_meta=[meta])

        def _init_handles(self):
            pass

    class Kernel:
        arg_names = ("A", "D", "N")
        params = ()

        def __getitem__(self, grid):
            def run(*args, num_warps, num_stages, **constexprs):
                calls.append(("jit", args))
                return Compiled()
            return run

    def fill(ptr, *how):
        encoded.append((ptr, how))
        return f"map@{ptr}"

    monkeypatch.setattr(flash_triton, "_INTERPRETED", False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)
    monkeypatch.setattr(triton.runtime.driver, "_active",
                        types.SimpleNamespace(utils=types.SimpleNamespace(fill_tma_descriptor=fill)))
    desc = flash_hopper.head_desc(6, 100, 6400, 64, 64, 64, torch.bfloat16)
    assert desc.shape == (6, 100, 64) and desc.strides == (6400, 64, 1) and desc.block == (1, 64, 64)
    launch = flash_triton._Launch(Kernel(), {}, _tuning.KernelConfig(16, 16), (None, desc))
    a = Pointer(1024)
    b, c = (torch.empty(6, 100, 64, dtype=torch.bfloat16) for _ in range(2))
    launch((3, 1, 1), (a, b), (7,))
    (jit,) = calls
    assert jit[1][0] is a and jit[1][1].base is b and jit[1][1].block_shape == [1, 64, 64] and jit[1][2] == 7
    for t in (b, c, b, c):
        launch((3, 1, 1), (a, t), (7,))
    tails = [args[_BASE_ARGS_FORMAT_LEN:] for kind, args in calls[1:]]
    assert tails[0] == (1024, f"map@{b.data_ptr()}", 6, 100, 64, 6400, 64, 1, 7)
    assert tails[1][1] == f"map@{c.data_ptr()}" and tails[2] == tails[0] and tails[3] == tails[1]
    assert [ptr for ptr, _ in encoded] == [b.data_ptr(), c.data_ptr()]  # once per address
    assert encoded[0][1] == (3, 2, 9, [1, 64, 64], [6, 100, 64], [6400, 64, 1], 0)  # the host's bf16 code


def test_launch_plans_address_inputs_without_views():
    """The launchers index the caller's tensors with one batch-head stride where the leading dims allow it, and
    copy only where they do not (or where d is strided)."""
    from cs336_systems.attention.flash_triton import _bh_stride, _rows

    x = torch.randn(2, 3, 5, 16)
    assert _bh_stride(x) == 5 * 16 and _rows(x)[0] is x
    t = x.transpose(0, 1)  # (3, 2, 5, 16): heads outer, batch inner -> one stride of 5*16 walks neither order
    assert _bh_stride(t) is None and _rows(t)[0].is_contiguous()
    sliced = torch.randn(2, 6, 5, 16)[:, :3]  # a head slice: batch stride 6*5*16 != 3 * head stride
    assert _bh_stride(sliced) is None
    one_batch = torch.randn(1, 6, 5, 16)[:, ::2]  # batch of 1: the head stride alone walks it
    assert _bh_stride(one_batch) == 2 * 5 * 16 and _rows(one_batch)[0] is one_batch
    assert _rows(x.transpose(-1, -2).contiguous().transpose(-1, -2))[1][2] == 1  # d strided: copied


def test_flash_bench_peer_ratios_and_auto_table():
    """The shapes benchmark's summary (ours / fastest peer) and the flash_auto table it writes."""
    from cs336_systems.bench.flash import auto_table, versus_peers

    base = dict(config="xl_512", batch=4, heads=25, seq_len=512, head_dim=64, dtype="bf16", causal=True, status="ok")
    rows = [dict(base, impl="triton", forward_ms=0.10, forward_backward_ms=0.30),
            dict(base, impl="sdpa_cudnn", forward_ms=0.08, forward_backward_ms=0.33),
            dict(base, impl="sdpa_flash", forward_ms=0.09, forward_backward_ms=0.25),
            dict(base, impl="flex", status="OOM")]
    (summary,) = versus_peers(rows)
    assert summary["forward_best_peer"] == "sdpa_cudnn" and summary["forward_ratio"] == pytest.approx(1.25)
    assert summary["forward_backward_best_peer"] == "sdpa_flash"
    assert summary["forward_backward_ratio"] == pytest.approx(1.2)
    table = auto_table(rows, "GPU X", "records.jsonl")
    assert table["shapes"] == [{"config": "xl_512", "batch_heads": 100, "seq_len": 512, "head_dim": 64,
                                "dtype": "bfloat16", "causal": True, "ours_ms": 0.30, "sdpa_ms": 0.25,
                                "sdpa_backend": "sdpa_flash", "measure": "do_bench_ms"}]
    # with kernel times on every row the table compares those: here cuDNN's kernels are the fastest, ours not
    timed = [dict(r, forward_backward_kernel_ms=ms) for r, ms in zip(rows[:3], (0.088, 0.086, 0.133))]
    (shape,) = auto_table(timed, "GPU X", "records.jsonl")["shapes"]
    assert (shape["ours_ms"], shape["sdpa_ms"], shape["sdpa_backend"], shape["measure"]) == (
        0.088, 0.086, "sdpa_cudnn", "kernel_ms")


def test_merge_auto_table_replaces_the_same_gpu_model_and_keeps_the_others():
    """A GPU model's new table takes its entry's place; other models' tables stay; the older format reads."""
    from cs336_systems.bench.flash import merge_auto_table

    h100, h200 = ({"device": d, "records": "old.jsonl", "shapes": []} for d in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    new = {"device": "NVIDIA H100 80GB HBM3", "records": "new.jsonl", "shapes": [{"config": "xl_512"}]}
    assert merge_auto_table(None, new) == {"tables": [new]}
    assert merge_auto_table(h100, h200) == {"tables": [h100, h200]}  # the older single-table format
    assert merge_auto_table({"tables": [h100, h200]}, new) == {"tables": [new, h200]}  # in its place
    assert merge_auto_table({"tables": [h200]}, new) == {"tables": [h200, new]}
    with pytest.raises(ValueError, match="not a flash_auto table file"):
        merge_auto_table({"shapes": []}, new)


def test_flash_bench_writes_the_auto_table_from_records(tmp_path, capsys):
    """``--from-records``: the table of a committed shapes run, on a machine without a GPU, added to the file's
    tables; bad input exits 2."""
    from cs336_systems.cli import main
    from cs336_systems.commands import flash_bench

    base = dict(config="xl_2048", batch=4, heads=25, seq_len=2048, head_dim=64, dtype="bf16", causal=True,
                status="ok", suite="issue18_shapes", provenance={"device": "GPU X"})
    records = tmp_path / "shapes.jsonl"
    records.write_text("".join(json.dumps(dict(base, impl=i, forward_backward_ms=ms)) + "\n"
                               for i, ms in (("triton", 0.79), ("sdpa_cudnn", 0.60), ("sdpa_flash", 0.96))))
    out = tmp_path / "auto.json"
    assert main(["flash-bench", "--only", "shapes", "--auto-table", str(out), "--from-records", str(records)]) == 0
    (table,) = json.loads(out.read_text())["tables"]
    assert table["device"] == "GPU X" and table["records"] == str(records)
    assert [(r["sdpa_backend"], r["sdpa_ms"]) for r in table["shapes"]] == [("sdpa_cudnn", 0.60)]
    # onto a file with another GPU model's table (the older format here): both kept; again: replaced, not added
    other = {"device": "GPU Y", "records": "y.jsonl", "shapes": []}
    out.write_text(json.dumps(other))
    for _ in range(2):
        assert main(["flash-bench", "--only", "shapes", "--auto-table", str(out), "--from-records", str(records)]) == 0
        assert json.loads(out.read_text()) == {"tables": [other, table]}
    # a file that is not a table file: exit 2, left as it was
    for text in ("not json", json.dumps({"config": "something else"})):
        out.write_text(text)
        assert main(["flash-bench", "--only", "shapes", "--auto-table", str(out), "--from-records", str(records)]) == 2
        assert out.read_text() == text
        assert "not overwritten: not a flash_auto table file" in capsys.readouterr().err
        with pytest.raises(ValueError, match="not overwritten"):  # a GPU run refuses it before measuring
            flash_bench._shapes(argparse.Namespace(auto_table=str(out)), torch.device("cpu"))
    assert main(["flash-bench", "--auto-table", str(out), "--from-records", str(records)]) == 2
    assert main(["flash-bench", "--only", "shapes", "--auto-table", str(out),
                 "--from-records", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "--from-records goes with --only shapes" in err and "cannot read records" in err


def test_flash_shapes_report_takes_the_peer_with_the_fastest_kernels():
    """The report's kernel columns: ours against the peer whose kernels are fastest (not the peer fastest by
    call time), and nothing for runs recorded before kernel times were."""
    from cs336_systems.report.sections.flash import _kernel_ratios

    ours = dict(forward_ms=0.03, forward_backward_ms=0.30, forward_kernel_ms=0.025, forward_backward_kernel_ms=0.085)
    peers = {"sdpa_flash": dict(forward_backward_ms=0.14, forward_kernel_ms=0.032, forward_backward_kernel_ms=0.128),
             "sdpa_cudnn": dict(forward_backward_ms=0.32, forward_kernel_ms=0.019, forward_backward_kernel_ms=0.082),
             "flex": dict(forward_backward_ms=0.64)}
    got = _kernel_ratios(ours, peers)
    assert got["kernel peer"] == "sdpa_cudnn"
    assert got["fwd+bwd kernel ratio"] == pytest.approx(0.085 / 0.082)
    assert got["fwd kernel ratio"] == pytest.approx(0.025 / 0.019)
    assert _kernel_ratios({"forward_backward_ms": 0.3}, peers) == {}
    assert _kernel_ratios(ours, {"flex": peers["flex"]}) == {}


@pytest.mark.gpu
def test_kernel_ms_counts_gpu_time_not_host_time():
    """``kernel_ms``: a GPU-bound call (a large matmul) costs about what ``do_bench`` measures; a host-bound one
    (many tiny launches with Python between them) much less, and the L2 flush is not counted."""
    from triton.testing import do_bench

    from cs336_systems.bench.flash import kernel_ms

    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    gpu_bound = kernel_ms(lambda: a @ a, dev, [])
    assert 0.7 < gpu_bound / do_bench(lambda: a @ a, warmup=10, rep=50) < 1.3
    x = torch.zeros(16, device=dev)

    def tiny():
        for _ in range(50):
            x.add_(1)
            sum(range(2000))  # host work between launches

    assert kernel_ms(tiny, dev, []) < 0.5 * do_bench(tiny, warmup=10, rep=50)
    assert kernel_ms(lambda: None, dev, []) == 0.0  # nothing but the flush ran


@pytest.mark.gpu
def test_sustained_ms_is_the_time_a_call_back_to_back():
    """``sustained_ms`` of a GPU-bound call: within a factor of do_bench's burst median (back to back the clock may
    drop under the power cap, and no L2 flush separates the calls), and every queued call counted."""
    from triton.testing import do_bench

    from cs336_systems.bench.flash import sustained_ms

    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    burst = do_bench(lambda: a @ a, warmup=10, rep=50)
    assert 0.7 < sustained_ms(lambda: a @ a, dev, None, seconds=0.5) / burst < 1.5


def test_shapes_are_timed_in_interleaved_rounds_on_the_same_inputs():
    """``time_interleaved``: every implementation once a round, the order rotated by one each round, the median of
    the rounds recorded with the rounds themselves; a failing implementation is recorded, the others go on."""
    from cs336_systems.bench.flash import AttnShape, time_interleaved

    shape = AttnShape(1, 2, 24, 16, dtype="fp32")
    calls, seen = [], {}

    def fake_bench(fn, warmup, rep, return_mode, grad_to_none):  # an implementation's time: its position in order
        out = fn()
        if out is not None:  # a forward: which implementation ran is told by its output
            seen.setdefault(id(fn), out.detach().clone())
        calls.append(id(fn))
        return float(len(calls))

    rows = time_interleaved(["naive", "torch_tiled", "sdpa_flash"], shape, torch.device("cpu"), rounds=3,
                            rep_ms=30.0, bench=fake_bench)
    naive, tiled, flash = rows
    assert flash["status"].startswith("skipped") and "forward_ms" not in flash  # no fp32 kernel
    assert naive["status"] == tiled["status"] == "ok" and naive["rounds"] == 3
    # 2 warm-ups each (forward, forward+backward), then rounds: (naive, tiled), (tiled, naive), (naive, tiled)
    assert naive["forward_ms_rounds"] == [5.0, 11.0, 13.0] and tiled["forward_ms_rounds"] == [7.0, 9.0, 15.0]
    assert naive["forward_backward_ms_rounds"] == [6.0, 12.0, 14.0]
    assert naive["forward_ms"] == 11.0 and tiled["forward_backward_ms"] == 10.0
    assert naive["forward_tflops"] == pytest.approx(shape.flops("forward") / 11e-3 / 1e12)
    # the same inputs for every implementation: their forward outputs agree
    outs = list(seen.values())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    assert "forward_kernel_ms" not in naive  # no kernel time asked for

    # kernel time in rounds interleaved the same way, after the do_bench rounds: 20 profiled calls in all
    timer_calls = []

    def fake_timer(fn, device, grads, calls, warmup):
        timer_calls.append((calls, warmup))
        return 100.0 + len(timer_calls)

    calls.clear()
    rows = time_interleaved(["naive", "torch_tiled"], shape, torch.device("cpu"), rounds=3, rep_ms=30.0,
                            bench=fake_bench, kernel_time=True, kernel_timer=fake_timer)
    naive, tiled = rows
    # per round and implementation the forward, then forward+backward: (naive, tiled), (tiled, naive), (naive, tiled)
    assert naive["forward_kernel_ms_rounds"] == [101.0, 107.0, 109.0]
    assert tiled["forward_backward_kernel_ms_rounds"] == [104.0, 106.0, 112.0]
    assert naive["forward_kernel_ms"] == 107.0 and tiled["forward_backward_kernel_ms"] == 106.0
    assert [c for c, _ in timer_calls] == [7] * 12 and [w for _, w in timer_calls] == [3] * 4 + [1] * 8

    def failing_bench(fn, warmup, rep, return_mode, grad_to_none):  # torch_tiled fails in the rounds
        if len(calls) >= 4 and id(fn) in calls[2:4]:
            raise RuntimeError("peer rejects this configuration")
        return fake_bench(fn, warmup, rep, return_mode, grad_to_none)

    calls.clear()
    rows = time_interleaved(["naive", "torch_tiled"], shape, torch.device("cpu"), rounds=2, bench=failing_bench)
    assert rows[0]["status"] == "ok" and rows[1]["status"].startswith("error: RuntimeError")
    assert len(rows[0]["forward_ms_rounds"]) == 2 and "forward_ms" not in rows[1]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        time_interleaved(["naive"], shape, torch.device("cpu"), rounds=0, bench=fake_bench)
    from cs336_systems.cli import main

    assert main(["flash-bench", "--only", "shapes", "--shape-rounds", "0"]) == 2  # before the GPU check
    assert main(["flash-bench", "--only", "shapes", "--sustained-seconds", "-1"]) == 2
    assert main(["flash-bench", "--only", "shapes", "--sustained-seconds", "2", "--sustained-rounds", "0"]) == 2


def test_sdpa_peers_pin_their_backend_once_per_timing(monkeypatch):
    """An SDPA peer's backend is set once around a timing (``pinned``), as a user sets it for a run: the calls
    inside skip the per-call ``sdpa_kernel`` (15-20 us of host time a call); called alone, a peer pins itself."""
    import torch.nn.attention as attention

    from cs336_systems.bench import flash

    compiled = flash.attention_fn("sdpa_flash", flash.AttnShape(1, 2, 24, 16), torch.device("cpu"), compile_apply=True)
    assert compiled.sdpa_backend is attention.SDPBackend.FLASH_ATTENTION  # the leaderboard harness pins it too
    entered = []
    real = attention.sdpa_kernel

    def counting(*args, **kwargs):
        entered.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "sdpa_kernel", counting)
    shape = flash.AttnShape(1, 2, 24, 16, dtype="fp32")
    q, k, v, do = flash.shape_inputs(shape, torch.device("cpu"))
    fn = flash.attention_fn("sdpa_flash", shape, torch.device("cpu"))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(fn(q, k, v, True), want, rtol=0, atol=0)
    assert entered == [attention.SDPBackend.FLASH_ATTENTION]  # alone: pinned per call
    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    calls, _ = flash._calls("sdpa_flash", shape, torch.device("cpu"), False, "random", (q, k, v, do))
    with flash.pinned(calls["forward_backward"]):
        assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
        for _ in range(3):
            calls["forward_backward"]()
            torch.testing.assert_close(calls["forward"](), want, rtol=0, atol=0)
    assert len(entered) == 2  # the one pin around the timing, none per call
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before
    assert q.grad is not None
    with flash.pinned(flash.attention_fn("naive", shape, torch.device("cpu"))):  # not SDPA: nothing pinned
        assert torch.backends.cuda.math_sdp_enabled() == before[1]
    assert len(entered) == 2



def test_sustained_rounds_are_interleaved_after_the_others():
    """With ``sustained_s`` the implementations also run back to back in ``sustained_rounds`` interleaved rounds
    (forward, then forward+backward, each its gradients reset), ``{mode}_sustained_ms`` the median; without it
    nothing of the kind is recorded. ``sustained_ms`` itself: milliseconds a call, at least one batch of calls."""
    from cs336_systems.bench.flash import AttnShape, sustained_ms, time_interleaved

    shape = AttnShape(1, 2, 24, 16, dtype="fp32")
    held = []

    def fake_held(fn, device, grads, seconds):
        fn()
        held.append((seconds, grads is None))
        return 10.0 * len(held)

    def quick(fn, warmup, rep, return_mode, grad_to_none):
        fn()
        return 1.0

    rows = time_interleaved(["naive", "torch_tiled"], shape, torch.device("cpu"), rounds=1, bench=quick,
                            sustained_s=2.5, sustained_rounds=3, sustained_timer=fake_held)
    naive, tiled = rows
    # per round and implementation the forward, then forward+backward: (naive, tiled), (tiled, naive), (naive, tiled)
    assert naive["forward_sustained_ms_rounds"] == [10.0, 70.0, 90.0]
    assert tiled["forward_backward_sustained_ms_rounds"] == [40.0, 60.0, 120.0]
    assert naive["forward_sustained_ms"] == 70.0 and tiled["forward_backward_sustained_ms"] == 60.0
    assert [sec for sec, _ in held] == [2.5] * 12 and [none for _, none in held] == [True, False] * 6
    assert "forward_sustained_ms" not in time_interleaved(["naive"], shape, torch.device("cpu"), rounds=1,
                                                          bench=quick)[0]
    with pytest.raises(ValueError, match="sustained_s must be >= 0"):
        time_interleaved(["naive"], shape, torch.device("cpu"), bench=quick, sustained_s=float("nan"))

    x = torch.zeros(4)
    grad_holder = torch.zeros(2, requires_grad=True)
    grad_holder.grad = torch.ones(2)
    ms = sustained_ms(lambda: x.add_(1), torch.device("cpu"), [grad_holder], seconds=0.01, warmup_s=0.0)
    assert ms > 0 and x[0] >= 20 and grad_holder.grad is None


def test_flash_shapes_run_keeps_the_shapes_it_measured_when_cut(tmp_path, monkeypatch):
    """``flash-bench --only shapes`` writes each shape's records as it finishes: a run stopped at its time limit
    keeps them."""
    import argparse

    from cs336_systems.commands import flash_bench
    from cs336_systems.records import read_records

    def fake(impls, shape, device, **kw):
        if shape.seq_len == 512 and shape.batch == 8:  # small_512: the run is stopped here
            raise KeyboardInterrupt
        return [dict(impl=i, **dataclasses.asdict(shape), compiled_apply=False, status="ok", rounds=kw["rounds"],
                     forward_ms=0.1 + j, forward_backward_ms=0.3 + j) for j, i in enumerate(impls)]

    monkeypatch.setattr(flash_bench, "time_interleaved", fake)
    args = argparse.Namespace(impl=["triton", "sdpa_cudnn"], shape=["xl_2048", "xl_512", "small_512"],
                              shape_rounds=3, shape_rep_ms=30.0, results_dir=str(tmp_path), auto_table=None,
                              sustained_seconds=0.0, sustained_rounds=2)
    with pytest.raises(KeyboardInterrupt):
        flash_bench._shapes(args, torch.device("cpu"))
    rows = read_records("flash_leaderboard", tmp_path, strict=True)
    assert [(r["config"], r["impl"]) for r in rows] == [("xl_2048", "triton"), ("xl_2048", "sdpa_cudnn"),
                                                        ("xl_512", "triton"), ("xl_512", "sdpa_cudnn")]
    assert all(r["rounds"] == 3 and r["suite"] == "issue18_shapes" for r in rows)
