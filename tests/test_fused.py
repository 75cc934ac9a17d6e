"""Fused LM head + loss against ``F.cross_entropy`` on fp64, and the fused AdamW against
``cs336_basics.optimizer.AdamW`` step by step (Triton kernel in the interpreter on CPU, foreach fallback)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # before the kernels are compiled: CPU runs them in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.optimizer import AdamW
from cs336_systems.fused import adamw
from cs336_systems.fused.adamw import FusedAdamW, join_master, low_precision_params, round_bf16_stochastic, split_master
from cs336_systems.fused.linear_cross_entropy import head_loss, linear_cross_entropy


@pytest.mark.parametrize("shape,vocab,chunk_rows", [((3, 37), 101, 5), ((53,), 29, 53), ((2, 5, 7), 1000, 1)])
def test_linear_cross_entropy_matches_fp64_reference(shape, vocab, chunk_rows, seed):
    d = 23
    h = torch.randn(*shape, d, dtype=torch.float64, requires_grad=True)
    w = (torch.randn(vocab, d, dtype=torch.float64) * 2).requires_grad_()
    t = torch.randint(0, vocab, shape)
    ref = F.cross_entropy((h @ w.T).reshape(-1, vocab), t.reshape(-1))
    ref_dh, ref_dw = torch.autograd.grad(3.0 * ref, (h, w))
    loss = linear_cross_entropy(h, w, t, chunk_bytes=4 * vocab * chunk_rows)
    dh, dw = torch.autograd.grad(3.0 * loss, (h, w))
    # fp64 throughout: only summation order differs
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dh, ref_dh, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dw, ref_dw, rtol=1e-10, atol=1e-12)


def test_linear_cross_entropy_low_precision_tracks_fp64(seed):
    # bf16 operands: errors of a few bf16 ulps (2^-8 relative), like the unfused bf16 path.
    n, d, vocab = 67, 48, 301
    h64, w64 = torch.randn(n, d, dtype=torch.float64), torch.randn(vocab, d, dtype=torch.float64) / 4
    t = torch.randint(0, vocab, (n,))
    h, w = h64.bfloat16().requires_grad_(), w64.bfloat16().requires_grad_()
    loss = linear_cross_entropy(h, w, t, chunk_bytes=4 * vocab * 16)
    loss.backward()
    h_ref, w_ref = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.cross_entropy(h_ref @ w_ref.T, t)
    ref.backward()
    assert loss.dtype == torch.float32 and h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    # the loss moves by at most the largest logit error: bf16 rounding of a logit (CPU) is 2^-9 relative
    assert abs(loss.item() - ref.item()) < 2**-8 * (h_ref @ w_ref.T).abs().max().item()
    for got, want in ((h.grad, h_ref.grad), (w.grad, w_ref.grad)):
        assert (got.double() - want).norm() / want.norm() < 1e-2


def test_compiled_head_loss_matches_ours_on_fp64_reference():
    """The compiled unfused loss (bench's and train's on a compiled model) against our cross_entropy in fp64: fp32
    arithmetic on odd sizes, gradient included; shapes that do not match keep their ValueError."""
    from cs336_basics.nn_utils import cross_entropy

    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(3, 7, 101, generator=gen, dtype=torch.float64) * 4).requires_grad_()
    targets = torch.randint(0, 101, (3, 7), generator=gen)
    ref = cross_entropy(logits, targets)
    (g_ref,) = torch.autograd.grad(ref, logits)
    x = logits.detach().float().requires_grad_()
    loss = head_loss(compile=True)(x, targets)
    (g,) = torch.autograd.grad(loss, x)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)  # fp32 sums of 101 terms
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-7)
    assert head_loss(compile=False) is cross_entropy
    with pytest.raises(ValueError, match="do not match targets"):
        head_loss(compile=True)(x, targets[:, :3])


def test_linear_cross_entropy_bad_input():
    h, w = torch.randn(4, 8), torch.randn(10, 8)
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(h, w, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="weight"):
        linear_cross_entropy(h, torch.randn(10, 7), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        linear_cross_entropy(h, w, torch.zeros(4))


def _pair(seed_params: int = 0):
    torch.manual_seed(seed_params)
    ref = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(s)) for s in ((37, 13), (101,), (5, 7, 3), (4099,))])
    fused = torch.nn.ParameterList([torch.nn.Parameter(p.detach().clone()) for p in ref])
    return ref, fused


@pytest.mark.parametrize("use_triton", [True, False])
def test_fused_adamw_matches_ours_step_by_step(use_triton, seed):
    ref, fused = _pair()
    kw = dict(lr=3e-2, betas=(0.85, 0.97), eps=1e-6, weight_decay=0.1)
    opt_ref, opt = AdamW(ref.parameters(), **kw), FusedAdamW(fused.parameters(), **kw, use_triton=use_triton)
    for _ in range(5):
        for a, b in zip(ref, fused, strict=True):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        opt_ref.step()
        opt.step()
        for a, b in zip(ref, fused, strict=True):  # fp32, the same ops in the same order: within an ulp or two
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(opt.state[b]["exp_avg_sq"], opt_ref.state[a]["exp_avg_sq"], rtol=1e-6, atol=0)


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("use_triton", [True, False])
def test_fused_adamw_bf16_copies_follow_fp32_masters(use_triton, split, seed):
    ref, fused = _pair()
    low = {fused[0], fused[2]}
    opt_ref = AdamW(ref.parameters(), lr=1e-2)
    opt = FusedAdamW(fused.parameters(), lr=1e-2, compute_dtype=torch.bfloat16, low_precision=low,
                     use_triton=use_triton, split_masters=split)
    assert fused[0].dtype == torch.bfloat16 and fused[1].dtype == torch.float32
    for p in low:  # split: the bf16 parameter and 2 bytes of low halves; else a whole fp32 master beside it
        assert set(opt.state[p]) & {"master", "master_lo"} == ({"master_lo"} if split else {"master"})
        if split:
            assert opt.state[p]["master_lo"].dtype == torch.int16
    for _ in range(4):
        for a, b in zip(ref, fused, strict=True):
            a.grad = torch.randn_like(a).bfloat16().float()  # the gradient a bf16 weight would receive
            b.grad = a.grad.to(b.dtype)
        opt_ref.step()
        opt.step()
        for a, b in zip(ref, fused, strict=True):
            master = opt.master_of(b)
            assert master.dtype == torch.float32
            torch.testing.assert_close(master, a, rtol=1e-6, atol=1e-7)
            if b not in low:
                continue
            if split:  # the copy is the master's upper half, rounded by integer arithmetic on either path
                assert torch.equal(b, split_master(master)[0])
            elif use_triton and not b.is_cuda:  # the interpreter truncates fp32 -> bf16; compiled Triton rounds
                torch.testing.assert_close(b.float(), master, rtol=2**-7, atol=0)
            else:  # the copy is the rounded master, written in the same pass
                assert torch.equal(b, master.to(b.dtype))
    assert all(v.dtype == torch.float32 for v in opt.master_state_dict(fused).values())


def test_fused_adamw_split_tile_by_gpu(monkeypatch, seed):
    """The split-master kernel's tile comes from ``_SPLIT_BY_GPU`` by GPU name (the H200's 512 x 2 warps), and a
    bucket's block table is cut for its tile: a 4,099-element master over nine 512-element programs (the
    interpreter here) steps as ``cs336_basics``' AdamW does."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert adamw._tile(cuda, True) == (512, 2)
    assert adamw._tile(cuda, False) == (adamw._BLOCK, adamw._NUM_WARPS)  # whole masters: the table has no entry
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert adamw._tile(cuda, True) == (adamw._BLOCK, adamw._NUM_WARPS_SPLIT)
    assert adamw._tile(torch.device("cpu"), True) == (adamw._BLOCK, adamw._NUM_WARPS_SPLIT)

    monkeypatch.setattr(adamw, "_tile", lambda device, split: (512, 2) if split else (adamw._BLOCK, adamw._NUM_WARPS))
    ref, fused = _pair()
    low = {fused[0], fused[3]}
    opt_ref = AdamW(ref.parameters(), lr=1e-2)
    opt = FusedAdamW(fused.parameters(), lr=1e-2, compute_dtype=torch.bfloat16, low_precision=low, use_triton=True)
    for _ in range(3):
        for a, b in zip(ref, fused, strict=True):
            a.grad = torch.randn_like(a).bfloat16().float()
            b.grad = a.grad.to(b.dtype)
        opt_ref.step()
        opt.step()
    tiles = {launch.tile for launch in opt._launches.values()}
    assert (512, 2) in tiles
    for a, b in zip(ref, fused, strict=True):
        torch.testing.assert_close(opt.master_of(b), a, rtol=1e-6, atol=1e-7)


def test_split_master_is_exact_and_rounds_to_nearest(seed, monkeypatch):
    # random values over 60 binades, both signs, and edge cases: zeros, subnormals, the largest finite values,
    # and low halves just below, at and above the halfway point 0x8000 with even and odd upper halves
    x = torch.randn(20_000) * torch.exp2(torch.randint(-30, 30, (20_000,)).float())
    edges = torch.tensor([0, 1 << 31, 1, 0x7F7FFFFF, 0xFF7FFFFF - (1 << 32), 0x3F807FFF, 0x3F808000, 0x3F808001,
                          0x3F818000, 0xBF808000 - (1 << 32), 0xBF818000 - (1 << 32), 0x00008000, 0x00018000],
                         dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([x, edges])
    hi, lo = split_master(x)
    monkeypatch.setattr(adamw, "_SPLIT_CHUNK", 999)  # the same in chunks that do not divide the tensor
    chunked = split_master(x)
    assert torch.equal(chunked[0].view(torch.int16), hi.view(torch.int16)) and torch.equal(chunked[1], lo)
    assert torch.equal(join_master(hi, lo).view(torch.int32), x.view(torch.int32))  # chunked join, bit for bit
    monkeypatch.undo()
    assert hi.dtype == torch.bfloat16 and lo.dtype == torch.int16
    assert torch.equal(join_master(hi, lo).view(torch.int32), x.view(torch.int32))  # one chunk, bit for bit
    low_bits = x.view(torch.int32) & 0xFFFF
    upper_even = ((x.view(torch.int32) >> 16) & 1) == 0
    tie = (low_bits == 0x8000) & upper_even  # where ties to even would round toward zero
    assert tie.sum() >= 3
    assert torch.equal(hi[~tie], x[~tie].bfloat16())  # to nearest, ties to even, everywhere else
    assert torch.equal(hi[tie].float().abs(), x[tie].abs() + x[tie].abs() - x[tie].bfloat16().float().abs())
    # NaN stays NaN in the copy (a diverged weight must show in the forward) and when joined; infinities stay
    special = torch.tensor([0x7FFFFFFF, 0x7FC00000, 0x7F800001, 0x7F808000, -1, 0x7F800000, 0xFF800000 - (1 << 32)],
                           dtype=torch.int64).to(torch.int32).view(torch.float32)
    hi, lo = split_master(special)
    joined = join_master(hi, lo)
    assert hi[:5].isnan().all() and joined[:5].isnan().all()
    assert torch.equal(hi[5:].float(), special[5:]) and torch.equal(joined[5:], special[5:])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("use_triton", [True, False])
def test_fused_adamw_split_masters_keep_nan_visible(use_triton, device):
    # A NaN gradient makes the master NaN; the bf16 copy the forward uses must be NaN too, not the zero that
    # rounding's carry makes of the all-ones NaN (0x7FFFFFFF, what CUDA's arithmetic produces; the CPU paths
    # produce 0x7FC00000, which test_split_master_is_exact_and_rounds_to_nearest covers with the others).
    p = torch.nn.Parameter(torch.randn(300, device=device))
    opt = FusedAdamW([p], lr=1e-2, compute_dtype=torch.bfloat16, low_precision=[p], use_triton=use_triton)
    p.grad = torch.randn(300, device=device).bfloat16()
    p.grad[7] = float("nan")
    opt.step()
    assert p[7].isnan() and opt.master_of(p)[7].isnan()
    assert not p[torch.arange(300, device=device) != 7].isnan().any()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("use_triton", [True, False])
def test_fused_adamw_stochastic_rounding_keeps_nan_visible(use_triton, device):
    # the same for bf16 parameters rounded stochastically: random low bits added to the all-ones NaN carry into
    # the sign bit, and truncation would leave -0.0
    nan = torch.tensor([0x7FFFFFFF, 0x7FC00000], dtype=torch.int32).view(torch.float32)
    assert round_bf16_stochastic(nan.to(device)).isnan().all()
    p = torch.nn.Parameter(torch.randn(300, device=device).bfloat16())
    opt = FusedAdamW([p], lr=1e-2, stochastic_rounding=True, seed=3, use_triton=use_triton)
    p.grad = torch.randn(300, device=device).bfloat16()
    p.grad[7] = float("nan")
    opt.step()
    assert p[7].isnan() and opt.state[p]["exp_avg"][7].isnan()
    assert not p[torch.arange(300, device=device) != 7].isnan().any()


def test_fused_adamw_state_dict_round_trip_keeps_state_dtypes(seed):
    # torch's load_state_dict casts floating state to the parameter's dtype: fp32 moments of a bf16 parameter
    # would come back bf16. FusedAdamW puts every state tensor back as it was saved.
    def make():
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(33, 7)), torch.nn.Parameter(torch.randn(5))]
        return ps, FusedAdamW(ps, lr=1e-2, compute_dtype=torch.bfloat16, low_precision=ps[:1], use_triton=False)
    ps, opt = make()
    for _ in range(2):
        for p in ps:
            p.grad = torch.randn_like(p)
        opt.step()
    qs, other = make()
    other.load_state_dict(opt.state_dict())
    for p, q in zip(ps, qs, strict=True):
        q.data.copy_(p.data)  # the model's weights travel in the model's state dict
        for key, value in opt.state[p].items():
            got = other.state[q][key]
            assert (got == value) if key == "step" else (got.dtype == value.dtype and torch.equal(got, value))
        assert torch.equal(other.master_of(q), opt.master_of(p))


def test_fused_adamw_bad_input():
    with pytest.raises(ValueError, match="compute_dtype"):
        FusedAdamW([torch.nn.Parameter(torch.randn(3))], compute_dtype=torch.int8)
    bf16 = torch.nn.Parameter(torch.randn(3).bfloat16())
    with pytest.raises(ValueError, match="must be fp32"):  # a low-precision copy needs an fp32 master to start from
        FusedAdamW([bf16], compute_dtype=torch.bfloat16, low_precision=[bf16])
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        FusedAdamW([torch.nn.Parameter(torch.randn(3).double())])
    with pytest.raises(ValueError, match="split_masters must be True or False"):
        FusedAdamW([torch.nn.Parameter(torch.randn(3))], split_masters="yes")


def test_low_precision_params_are_the_linear_weights():
    model = BasicsTransformerLM(vocab_size=11, context_length=8, d_model=8, num_layers=2, num_heads=2, d_ff=12)
    low = low_precision_params(model)
    assert len(low) == 2 * 7 + 1  # q, k, v, out, w1, w2, w3 per block, and the LM head
    assert model.token_embeddings.weight not in low and model.lm_head.weight in low
    assert low_precision_params(model, "fp32") == low
    assert low_precision_params(model, "bf16") == low | {model.token_embeddings.weight}  # a bf16 residual stream
    with pytest.raises(ValueError, match="unknown residual dtype 'fp16'; choose from fp32, bf16"):
        low_precision_params(model, "fp16")


def _train_losses(fused: bool, steps: int, device: str = "cpu", precision: str = "fp32", residual: str = "fp32",
                  seen_dtypes: set | None = None) -> list[float]:
    """Tiny-preset training: unfused (LM head + cross_entropy, cs336 AdamW) or fused (linear_cross_entropy,
    FusedAdamW; bf16 weight copies under bf16, the embedding's too with ``residual`` bf16). ``seen_dtypes``
    collects the dtypes of the residual stream entering the blocks."""
    import contextlib

    from cs336_basics.nn_utils import cross_entropy
    from cs336_systems.configs import get_preset
    from cs336_systems.fused.linear_cross_entropy import defer_lm_head

    torch.manual_seed(0)
    cfg = get_preset("tiny")
    model = BasicsTransformerLM(**cfg.model_kwargs(), device=device)
    if seen_dtypes is not None:
        for block in model.layers:
            block.register_forward_pre_hook(lambda mod, args: seen_dtypes.add(args[0].dtype))
    bf16 = precision == "bf16"
    if fused:
        defer_lm_head(model)
        opt = FusedAdamW(model.parameters(), lr=1e-3, weight_decay=0.1, use_triton=device == "cuda",
                         compute_dtype=torch.bfloat16 if bf16 else None,
                         low_precision=low_precision_params(model, residual) if bf16 else ())
    else:
        opt = AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, 64, (4096,), generator=gen) % cfg.vocab_size  # a small vocabulary: learnable
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 17, (2,), generator=gen)
        batch = torch.stack([data[s:s + 17] for s in starts]).to(device)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            out = model(x)
            loss = linear_cross_entropy(out, model.lm_head.weight, y) if fused else cross_entropy(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_tiny_fp32_200_steps_fused_loss_and_optimizer_track_the_unfused_path():
    ref, fused = _train_losses(False, 200), _train_losses(True, 200)
    assert ref[-1] < ref[0] - 0.5  # it learns something, so the comparison is not between two constants
    # fp32: only summation order differs (chunked logsumexp, GEMM splits); 200 steps keep it under 1e-5
    assert max(abs(a - b) for a, b in zip(ref, fused, strict=True)) < 1e-5


@pytest.mark.gpu
def test_gpu_fused_adamw_kernel_matches_foreach_exactly(seed):
    ps = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in ((1001, 37), (4097,))]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    a = FusedAdamW(ps, lr=1e-2, compute_dtype=torch.bfloat16, low_precision=ps, use_triton=True)
    b = FusedAdamW(qs, lr=1e-2, compute_dtype=torch.bfloat16, low_precision=qs, use_triton=False)
    for _ in range(3):
        for p, q in zip(ps, qs, strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        a.step()
        b.step()
    for p, q in zip(ps, qs, strict=True):
        torch.testing.assert_close(a.master_of(p), b.master_of(q), rtol=1e-6, atol=1e-7)
        assert torch.equal(p, split_master(a.master_of(p))[0])


@pytest.mark.gpu
def test_gpu_linear_cross_entropy_bf16_against_fp64(seed):
    n, d, vocab = 1000, 256, 50_257
    h = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(vocab, d, device="cuda") / 16).bfloat16().requires_grad_()
    t = torch.randint(0, vocab, (n,), device="cuda")
    loss = linear_cross_entropy(h, w, t, chunk_bytes=4 * vocab * 300)
    loss.backward()
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.cross_entropy(h64 @ w64.T, t)
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-4 * ref.item()  # fp32 logits from bf16 operands
    for got, want in ((h.grad, h64.grad), (w.grad, w64.grad)):
        assert (got.double() - want).norm() / want.norm() < 1e-2  # bf16 gradients: a few ulps


@pytest.mark.gpu
@pytest.mark.parametrize("residual", ["fp32", "bf16"])
def test_gpu_tiny_bf16_fused_tracks_unfused(residual):
    seen = set()
    ref = _train_losses(False, 100, "cuda", "bf16")
    fused = _train_losses(True, 100, "cuda", "bf16", residual, seen)
    assert seen == {torch.bfloat16 if residual == "bf16" else torch.float32}
    assert abs(ref[-1] - fused[-1]) < 0.01 * ref[-1]


def test_bf16_residual_stream_tracks_autocasts_fp32_one():
    """With the token embedding a bf16 copy (residual "bf16") the blocks see a bf16 residual stream where autocast
    keeps it fp32; CPU bf16 training with it ends near the fp32-stream run (GPU: the 300-step check, 1%)."""
    seen_fp32, seen_bf16 = set(), set()
    ref = _train_losses(True, 60, "cpu", "bf16", "fp32", seen_fp32)
    ours = _train_losses(True, 60, "cpu", "bf16", "bf16", seen_bf16)
    assert seen_fp32 == {torch.float32} and seen_bf16 == {torch.bfloat16}
    assert ref[-1] < ref[0] - 0.5
    # one more bf16 rounding (2^-9 relative) per residual add; measured: at most 0.06% apart at any step
    assert max(abs(a - b) / a for a, b in zip(ref, ours, strict=True)) < 5e-3



def test_fused_adamw_keeps_bf16_state_for_bf16_params(seed):
    # The leaderboard's configuration: bf16 parameters and moments, no masters. Against our AdamW on fp32 copies
    # of the same values, each step adds at most the bf16 rounding of the stored results (eps = 2^-7 relative).
    params = [torch.randn(37, 5), torch.randn(301)]
    grads = [torch.randn_like(p) for p in params]
    ours = [p.bfloat16().requires_grad_() for p in params]
    ref = [p.bfloat16().float().requires_grad_() for p in params]
    opt, ref_opt = FusedAdamW(ours, lr=1e-2, weight_decay=0.1), AdamW(ref, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        for p, r, g in zip(ours, ref, grads):
            p.grad, r.grad = g.bfloat16(), g.bfloat16().float()
        opt.step()
        ref_opt.step()
    for p, r in zip(ours, ref):
        assert p.dtype == torch.bfloat16 and opt.state[p]["exp_avg"].dtype == torch.bfloat16
        assert "master" not in opt.state[p] and "master_lo" not in opt.state[p]
        assert ((p.float() - r).norm() / r.norm()).item() < 3 * 2**-7


def test_round_bf16_stochastic_is_unbiased(seed):
    # Values strictly between two bf16 neighbours, both signs: every result is one of the two, and the mean of n
    # roundings is within 5 standard deviations (ulp * sqrt(f (1 - f) / n) <= ulp / (2 sqrt(n))) of the value.
    n = 20_000
    down = torch.randn(16).bfloat16().float()
    frac = torch.rand(16) * 0.9 + 0.05
    ulp = (down.bfloat16().view(torch.int16) + 1).view(torch.bfloat16).float() - down  # next magnitude up
    x = down + frac * ulp
    rounded = round_bf16_stochastic(x.repeat(n, 1)).float()
    assert ((rounded == down) | (rounded == down + ulp)).all()
    assert ((rounded.mean(0) - x).abs() <= 5 * ulp.abs() / (2 * n**0.5)).all()


@pytest.mark.parametrize("path", ["interpreter", "foreach", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fused_adamw_stochastic_rounding_keeps_small_changes(path, seed):
    # One gradient, then zeros: v must decay as beta2^t. Rounded to nearest, bf16 v * 0.999 rounds back to v
    # and v never decays (the failure stochastic rounding fixes); rounded stochastically, the mean over 4096
    # elements tracks the exact decay (per-element rounding noise averages out to far below 1%).
    steps, beta2 = 100, 0.999
    device = "cuda" if path == "cuda" else "cpu"
    got = {}
    for stochastic in (False, True):
        p = torch.nn.Parameter(torch.randn(4096, device=device).bfloat16())
        opt = FusedAdamW([p], lr=1e-3, betas=(0.9, beta2), use_triton=path != "foreach",
                         stochastic_rounding=stochastic)
        g = torch.randn(4096, device=device).bfloat16()
        for step in range(steps):
            p.grad = g if step == 0 else torch.zeros_like(g)
            opt.step()
        v = opt.state[p]["exp_avg_sq"]
        assert v.dtype == torch.bfloat16
        got[stochastic] = (v.float().sum() / ((1 - beta2) * g.float().square().sum())).item()
    exact = beta2 ** (steps - 1)
    if path != "interpreter":  # Triton's interpreter truncates fp32 -> bf16 instead of rounding to nearest
        assert got[False] > 0.99  # stuck at its first value: 10% above the exact decay
    assert abs(got[True] / exact - 1) < 0.01


def test_fused_adamw_stochastic_rounding_bad_input():
    with pytest.raises(ValueError, match="stochastic_rounding must be True or False"):
        FusedAdamW([torch.nn.Parameter(torch.randn(3))], stochastic_rounding="yes")
    with pytest.raises(ValueError, match="bfloat16 state only"):
        FusedAdamW([torch.nn.Parameter(torch.randn(3).half())], stochastic_rounding=True)
    with pytest.raises(ValueError, match="seed"):
        FusedAdamW([torch.nn.Parameter(torch.randn(3))], seed=-1)


def test_fused_adamw_draws_its_seed_from_the_global_stream_only_for_stochastic_rounding():
    # Other code's random draws (data order, dropout) stay as they were unless stochastic rounding needs a seed.
    def next_draw(**kw) -> torch.Tensor:
        p = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
        torch.manual_seed(0)
        FusedAdamW([p], **kw)
        return torch.rand(3)

    torch.manual_seed(0)
    untouched = torch.rand(3)
    assert torch.equal(next_draw(), untouched)
    assert torch.equal(next_draw(stochastic_rounding=True, seed=7), untouched)
    assert not torch.equal(next_draw(stochastic_rounding=True), untouched)


def test_captured_step_bad_input():
    from cs336_systems.step_graph import CapturedStep

    with pytest.raises(ValueError, match="warmup must be an int >= 1"):
        CapturedStep(lambda x: x, warmup=0)
    with pytest.raises(ValueError, match="keeps its step count and learning rate on the host"):
        CapturedStep(lambda x: x, optimizer=AdamW([torch.nn.Parameter(torch.zeros(2))]))
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        CapturedStep(lambda x: x)(torch.zeros(2))
    with pytest.raises(ValueError, match="no step of this optimizer was captured"):
        FusedAdamW([torch.nn.Parameter(torch.zeros(2))]).before_graph_replay()


def test_fused_adamw_replay_bookkeeping_uploads_each_steps_values():
    """The host's side of replaying a captured step (no CUDA graph on a CPU: the captured launches are stood in for
    by the eager ones, whose device table the replays would read). Before each replay the table holds that step's
    bias corrections and learning rate, whether ``after_graph_replay`` uploaded them ahead or a changed ``lr``
    made ``before_graph_replay`` upload them again, or ``after_graph_replay`` was never called; the step counts
    advance once a replay."""
    ps = [torch.nn.Parameter(torch.randn(s)) for s in ((37, 5), (11,))]
    opt = FusedAdamW(ps, lr=1e-2, betas=(0.9, 0.99), use_triton=True)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()  # builds the launch table; stands for the step a capture records (it counts itself)
    opt._captured, opt._replayed = [(launch, 0, 0) for launch in opt._launches.values()], False
    (launch, _, _), = opt._captured

    def uploaded_step_size():
        flat = launch.table[len(ps):].reshape(-1)
        return flat[1:8].view(torch.float64)[6].item()  # -lr / (1 - beta1^step)

    opt.before_graph_replay()  # the first replay: the values the capture filled in (step 1)
    assert uploaded_step_size() == pytest.approx(-1e-2 / (1 - 0.9), rel=1e-12)
    opt.after_graph_replay()
    for step, lr, after in ((2, 1e-2, True), (3, 5e-3, True), (4, 5e-3, False), (5, 2e-3, False), (6, 2e-3, True)):
        opt.param_groups[0]["lr"] = lr
        opt.before_graph_replay()
        assert uploaded_step_size() == pytest.approx(-lr / (1 - 0.9**step), rel=1e-12)
        if after:
            opt.after_graph_replay()
            assert all(opt.state[p]["step"] == step for p in ps)
    assert opt.state_dict()["state"][0]["step"] == 6  # counted before the state leaves
    opt.step()  # an eager step after replays counts on from there
    assert all(opt.state[p]["step"] == 7 for p in ps)


@pytest.mark.gpu
def test_gpu_captured_step_replays_the_eager_updates(seed):
    """A step captured as a CUDA graph (FusedAdamW with bf16 weights and fp32 masters, autocast) against the same
    steps run eagerly: the learning rate changes every step and the replays apply it, the step counts advance,
    and losses and weights agree."""
    from cs336_systems.step_graph import CapturedStep

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 10)).cuda()
        return model, FusedAdamW(model.parameters(), lr=1e-2, compute_dtype=torch.bfloat16,
                                 low_precision=low_precision_params(model))

    def stepper(model, opt):
        def step(x, y):
            model.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                loss = F.cross_entropy(model(x).float(), y)
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    (m1, o1), (m2, o2) = make(), make()
    eager, captured = stepper(m1, o1), CapturedStep(stepper(m2, o2), optimizer=o2, warmup=2)
    losses = []
    for i in range(6):
        x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
        for opt in (o1, o2):
            for group in opt.param_groups:
                group["lr"] = 1e-2 / (i + 1)
        losses.append((eager(x, y).item(), captured(x, y).item()))
    assert captured.captured
    assert [b for _, b in losses] == pytest.approx([a for a, _ in losses], rel=1e-5)
    for p, q in zip(m1.parameters(), m2.parameters(), strict=True):
        torch.testing.assert_close(o2.master_of(q), o1.master_of(p), rtol=1e-5, atol=1e-6)
        assert o2.state[q]["step"] == o1.state[p]["step"] == 6
