"""The Gluon (Hopper, sm_90a) FlashAttention backward kernel (``flash_hopper_bwd``).

CPU: the module imports, its variants are well formed, bad requests are ``ValueError``s, and a variant compiles
for sm_90a with Triton's bundled ptxas without spilling registers (the compiler feedback a CPU machine can give).

GPU (``-m gpu``, an sm_90 device only: the kernel uses TMA and wgmma): dQ, dK, dV of every variant against an
fp64 reference on odd shapes (causal with Nq > Nk and Nq < Nk, grouped heads), by the flash-attention rule: at
most twice the error of PyTorch SDPA in the same dtype, plus the dtype's rounding step at the gradient's magnitude.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # before the first import of flash_triton decorates its kernels (this file may be collected first)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cs336_systems.attention import flash_hopper_bwd as hb
from tests.sm90_ptxas import waits_behind_a_barrier

ROOT = Path(__file__).resolve().parents[1]


def test_variants_are_well_formed():
    names = [v.name() for v in hb.VARIANTS]
    assert len(set(names)) == len(names)
    for v in hb.VARIANTS:
        assert v.head_dim in (64, 128) and v.num_warps in (4, 8) and v.stages >= 1
        # a warpgroup per 64 key rows (warp-specialised: two consumer warpgroups beside the 4 launched warps)
        assert v.block_n == (128 if v.warp_specialize else 16 * v.num_warps)
        assert set(v.constexprs(True)) == {"HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "STAGES", "DQ_TMA",
                                           "PERSISTENT", *(["DQ_EARLY", "LEAN"] if v.warp_specialize else [])}
        assert v.warp_specialize or not v.lean  # only the warp-specialised form releases without barriers
    assert {hb.default_variant(64), hb.default_variant(128)} <= set(hb.VARIANTS)


def test_the_planner_picks_the_warp_specialised_backward_forms_that_measured_faster(monkeypatch):
    """On sm_90 the warp-specialised backward issues dV's product after dQ's (DQ_EARLY) at head dim 128 without the
    causal mask only (H100: faster there, slower causal, spills at head dim 64), and at head dim 64 runs 64-row query
    tiles with three stages and lean releases. CPU tensors stand in, their tensor-descriptor check forced."""
    from cs336_systems.attention import _tuning, ptx_release
    from cs336_systems.attention import flash_triton as ft

    monkeypatch.setattr(ft, "_tma_fits", lambda *args: True)
    for d, n, right, early in ((128, 2048, None, True), (128, 2048, 0, False), (64, 8192, None, False)):
        cfg = _tuning.resolve(d, torch.bfloat16, n, (9, 0), {})
        x = torch.zeros(1, 8, n, d, dtype=torch.bfloat16)
        mode, _, launches, *_ = ft._plan_backward(x, x, x, x, x[..., 0].float(), x, cfg, False, None, right, False)
        dkdv = launches[1][0]
        assert mode == "atomic" and dkdv.kernel is hb._hopper_bwd_ws_kernel, (d, n, right)
        assert dkdv.constexprs["DQ_EARLY"] is early, (d, n, right)
        # lean ring releases at head dim 64 only (session 40: faster there, slower at 128)
        assert dkdv.constexprs["LEAN"] == (ptx_release.VERSION if d == 64 else 0), (d, n, right)
        # at head dim 64 (from 8,192 queries on) 64-row query tiles and three stages: no spills (session 37)
        assert (dkdv.constexprs["BLOCK_M"], dkdv.constexprs["STAGES"]) == ((64, 3) if d == 64 else (64, 2))


def test_bad_requests_are_value_errors():
    with pytest.raises(ValueError, match="head dims 64 and 128"):
        hb.default_variant(96)
    q = torch.zeros(1, 2, 8, 64)
    k = torch.zeros(1, 2, 8, 64)
    with pytest.raises(ValueError, match="is for head dim 128"):
        hb.backward_launches(q, k, k, q, q[..., 0], q, True, hb.default_variant(128))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        hb.backward_launches(torch.zeros(1, 3, 8, 64), k, k, q, q[..., 0], q, True)


def _ptxas() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not _ptxas().exists(), reason="Triton's bundled ptxas is missing")
def test_the_head_dim_64_kernels_in_use_compile_for_sm90_without_spills():
    """The one-warpgroup persistent kernel and the warp-specialised one on 64 query rows (from 8,192 queries on) that
    the planner runs at head dim 64: ptxas reports no spills (the latter's dS^T halves need its 64-byte swizzle)."""
    # in a fresh process: Triton's interpreter, which the CPU tests before this one run, patches the language's
    # operators while a kernel runs, and a kernel that raised can leave them patched for a later compile
    ws = hb.Variant(64, 128, 64, 4, 3, warp_specialize=True)
    assert ws in hb.VARIANTS
    code = ("import sys; sys.path.insert(0, 'scripts/device'); import flash_aot; "
            "from cs336_systems.attention import flash_hopper_bwd as hb; "
            "sys.exit(flash_aot.gluon_bwd([hb.default_variant(64), hb.Variant(64, 128, 64, 4, 3, "
            "warp_specialize=True)], causals=(True,), groups=(3,), n=333))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    names = (hb.default_variant(64).name(), ws.name())
    assert res.returncode == 0 and all(n in res.stdout for n in names) and res.stdout.count("spill_stores=0B") == 2, (
        res.stdout + res.stderr[-3000:])


@pytest.mark.skipif(not _ptxas().exists(), reason="Triton's bundled ptxas is missing")
@pytest.mark.parametrize("shape", ["xl_512", "noncausal_2k"])
def test_the_planned_forward_compiles_for_sm90_with_host_descriptors(shape):
    """The forward the planner launches on an H100 (one warpgroup at head dim 64, warp-specialised at 128) compiles
    for sm_90a with the descriptors the planner describes on the host (``flash_hopper.forward_descs``): the kernel's
    shared-memory layouts and boxes agree with them, and the head-dim-64 kernel does not spill."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "scripts/device/flash_aot.py", "--shape", shape, "--forward-only"], cwd=ROOT,
                         env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600)
    kernel = "_hopper_fwd_persistent_kernel" if shape == "xl_512" else "_hopper_fwd_ws_persistent_kernel"
    assert res.returncode == 0 and kernel in res.stdout, res.stdout + res.stderr[-3000:]
    assert shape != "xl_512" or "spill_stores=0B" in res.stdout, res.stdout


def test_ptx_release_drops_only_the_barrier_before_a_marked_arrive():
    """The rewrite restores a marked arrive's count to one and deletes the warpgroup bar.sync before it (register
    arithmetic may sit between them); unmarked arrives and other barriers stay; a marked arrive without that barrier
    is an error, never a wrong arrival count."""
    from cs336_systems.attention import ptx_release

    mark = ptx_release.MARK
    ptx = "\n".join([
        "\tbar.sync \t2, 128;", "\tadd.s32 \t%r1618, %r224, 197096;", "\t// begin inline asm",
        f"\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r1618], {mark};", "\t// end inline asm",
        "\tbar.sync \t2, 128;", "\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r7];",
        "\tbar.sync \t0, 128;", "\tst.shared.b32 [%r1], %r2;"])
    out = ptx_release.patch(ptx).split("\n")
    assert out == ["\tadd.s32 \t%r1618, %r224, 197096;", "\t// begin inline asm",
                   "\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r1618];", "\t// end inline asm",
                   "\tbar.sync \t2, 128;", "\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r7];",
                   "\tbar.sync \t0, 128;", "\tst.shared.b32 [%r1], %r2;"]
    assert ptx_release.patch("\n".join(out)) == "\n".join(out)
    for before in ("\tadd.s32 %r1, %r2, 4;", "\tbar.sync \t0, 128;\n\tst.shared.b32 [%r1], %r2;"):
        with pytest.raises(ValueError, match=r"bar\.sync"):
            ptx_release.patch(f"{before}\n\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r9], {mark};")
    # a kernel compiled elsewhere than through the hook is refused before it runs
    compiled = types.SimpleNamespace(name="k", asm={"ptx": ptx})
    with pytest.raises(RuntimeError, match="compiled without ptx_release"):
        ptx_release.check(compiled)
    ptx_release.check(types.SimpleNamespace(name="k", asm={"ptx": "\n".join(out)}))
    # the hook leaves a backend without a PTX stage (AMD's) alone, and other kernels' PTX unchanged
    stages = {"llir": len}
    ptx_release._hook(None, stages, None, None, None)
    assert stages == {"llir": len}
    stages = {"ptx": lambda src, metadata: ptx}
    ptx_release._hook(None, stages, None, None, (9, 0))
    assert stages["ptx"](None, {"name": "not_registered"}) == ptx


def test_lean_forward_compiles_without_the_marked_barriers(tmp_path):
    """The warp-specialised forward compiled for sm_90a on this host with ``LEAN`` has the rewrite applied: nothing
    marked is left, no mbarrier wait has a barrier right before it (Triton puts one before each key tile's), and the
    source holds ten barriers fewer than with ``LEAN=0``: the consumers' five releases each and the two waits of each
    one's key loop, less the two each gains (one after each read of the item number, ``flash_hopper._item``)."""
    from cs336_systems.attention import ptx_release

    shape, kernel = "noncausal_2k", "_hopper_fwd_ws_persistent_kernel"

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    counts = {}
    for lean in (0, ptx_release.VERSION):
        res = subprocess.run([sys.executable, "scripts/device/flash_aot.py", "--shape", shape, "--forward-only",
                              "--fwd-set", f"LEAN={lean}", "--ptx-dir", str(tmp_path / str(lean))], cwd=ROOT,
                             env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600)
        assert res.returncode == 0 and kernel in res.stdout, res.stdout + res.stderr[-3000:]
        counts[lean] = int(res.stdout.split("bar_sync=")[1].split()[0])
        assert " marked=0" in res.stdout, res.stdout
    ptx = {lean: (tmp_path / str(lean) / f"{kernel}.ptx").read_text() for lean in counts}
    assert waits_behind_a_barrier(ptx[0]) > 0 and waits_behind_a_barrier(ptx[ptx_release.VERSION]) == 0
    assert counts[0] - counts[ptx_release.VERSION] == 10, counts


@pytest.mark.skipif(not _ptxas().exists(), reason="Triton's bundled ptxas is missing")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_leaner_softmax_forward_compiles_without_the_half_swaps_and_sum_shuffles(dtype):
    """The one-warpgroup forward at xl_2048 compiled for sm_90a with ``PACK_P`` and ``LEAN_L``: P's 16-bit pairs
    come from packed conversions, so the SASS holds none of the PRMT half swaps that the element-wise conversions leave
    (16 a key tile), and l's per-thread parts (``LEAN_L``) need no shuffles a tile; the same MMAs and exponentials,
    at most 128 registers (three programs an SM) and no spills."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    counts = {}
    for lean in (0, 1):
        res = subprocess.run([sys.executable, "scripts/device/flash_aot.py", "--shape", "xl_2048", "--forward-only",
                              "--dtype", dtype, "--fwd-set", f"PACK_P={lean}", f"LEAN_L={lean}", "--sass-ops",
                              "PRMT", "SHFL", "HGMMA", "MUFU.EX2"], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0 and "_hopper_fwd_persistent_kernel" in res.stdout, res.stdout + res.stderr[-3000:]
        assert "spill_stores=0B" in res.stdout and int(re.search(r"regs=(\d+)", res.stdout).group(1)) <= 128, res.stdout
        counts[lean] = {k: int(v) for k, v in (kv.split("=") for kv in res.stdout.split()[-4:])}
    assert counts[0]["PRMT"] >= 32 and counts[1]["PRMT"] == 0, counts
    # the sum's four shuffles a tile, in each of the three key loops (tile 0, unmasked, masked)
    assert counts[0]["SHFL"] - counts[1]["SHFL"] == 12, counts
    assert counts[0]["HGMMA"] == counts[1]["HGMMA"] and counts[0]["MUFU.EX2"] == counts[1]["MUFU.EX2"], counts


@pytest.mark.skipif(not _ptxas().exists(), reason="Triton's bundled ptxas is missing")
def test_ws_lazy_rescale_compiles_to_a_warp_vote_and_branches():
    """The warp-specialised forward at noncausal_2k (head dim 128) compiled for sm_90a with ``LAZY_RESCALE``: one
    warp vote in each consumer's key loop, O's rescale in four 16-element blocks behind as many branches (eight in
    all), the same FMULs, MMAs and warpgroup barriers as without it (``ptx_release`` still drops the same ones: the
    inline PTX touches no memory), one more exponential a row at each consumer's four softmax sites (O's compensated
    denominator), and at most a few dozen bytes more spilled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    counts, spills, bars = {}, {}, {}
    for lazy in (0, 4):
        res = subprocess.run([sys.executable, "scripts/device/flash_aot.py", "--shape", "noncausal_2k",
                              "--forward-only", "--fwd-set", f"LAZY_RESCALE={lazy}", "--sass-ops", "VOTE.ANY", "BRA",
                              "FMUL", "HGMMA", "MUFU.EX2"], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)),
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0 and "_hopper_fwd_ws_persistent_kernel" in res.stdout, res.stdout + res.stderr[-3000:]
        spills[lazy] = int(re.search(r"spill_stores=(\d+)B", res.stdout).group(1))
        bars[lazy] = int(re.search(r"bar_sync=(\d+)", res.stdout).group(1))
        counts[lazy] = {k: int(v) for k, v in (kv.split("=") for kv in res.stdout.split()[-5:])}
    assert counts[0]["VOTE.ANY"] == 0 and counts[4]["VOTE.ANY"] == 2, counts
    assert counts[4]["BRA"] - counts[0]["BRA"] == 8, counts
    for op in ("FMUL", "HGMMA"):
        assert counts[0][op] == counts[4][op], counts
    assert counts[4]["MUFU.EX2"] - counts[0]["MUFU.EX2"] == 2 * 4 * 2, counts  # two consumers, two rows a thread
    assert bars[0] == bars[4] and spills[4] <= spills[0] + 24, (bars, spills)


@pytest.mark.skipif(not _ptxas().exists(), reason="Triton's bundled ptxas is missing")
def test_ws_forward_lean_l_compiles_leaner():
    """The warp-specialised forward at noncausal_2k compiled for sm_90a with ``LEAN_L``: fewer shuffles (l's sums)
    and fewer instructions in all (O's reciprocal instead of a division an element), the same MMAs and exponentials
    and no more spilled bytes than without it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    counts, spills = {}, {}
    for lean_l in (0, 1):
        res = subprocess.run([sys.executable, "scripts/device/flash_aot.py", "--shape", "noncausal_2k",
                              "--forward-only", "--fwd-set", f"LEAN_L={lean_l}", "--sass-ops", "", "SHFL", "HGMMA",
                              "MUFU.EX2"], cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == 0 and "_hopper_fwd_ws_persistent_kernel" in res.stdout, res.stdout + res.stderr[-3000:]
        spills[lean_l] = int(re.search(r"spill_stores=(\d+)B", res.stdout).group(1))
        counts[lean_l] = {k: int(v) for k, v in (kv.split("=") for kv in res.stdout.split()[-4:])}
    assert spills[1] <= spills[0], spills
    assert counts[1][""] < counts[0][""] and counts[1]["SHFL"] < counts[0]["SHFL"], counts
    assert counts[0]["HGMMA"] == counts[1]["HGMMA"] and counts[0]["MUFU.EX2"] == counts[1]["MUFU.EX2"], counts


def test_lean_backward_compiles_without_its_release_barriers():
    """The warp-specialised backward's lean variant (ring releases marked) compiled for sm_90a: nothing marked is
    left, and each consumer has three barriers fewer: its release's, the one after the dS^T hand-over's arrival and
    the one after the epilogue's arrival."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    name = "d128/n128xm64/w4/s2/tma/ws"
    res = subprocess.run([sys.executable, "scripts/device/flash_aot.py", "--gluon-bwd", name, name + "/lean"],
                         cwd=ROOT, env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=600)
    assert "bar_sync=" in res.stdout, res.stdout + res.stderr[-3000:]  # (exit code 1: it spills a few scalars)
    counts = {}
    for line in res.stdout.splitlines():
        if " causal=1 group=1:" in line:
            counts[line.split()[1]] = int(line.split("bar_sync=")[1].split()[0])
            assert " marked=0" in line, line
    assert counts[name] - counts[name + "/lean"] == 6, counts


def test_ptx_release_drops_barriers_that_order_nothing():
    """``drop_quiet_barriers``: a barrier goes where, on every path into it, nothing since the previous barrier
    touched memory but mbarrier operations, MMAs and TMA loads (a loop's back edge included); it stays after a
    shared-memory load or store on any path, after a TMA store's wait, and the PTX is left alone where its control
    flow is not understood."""
    from cs336_systems.attention import ptx_release

    def kernel(*body):
        return "\n".join([".visible .entry k(", ")", ".reqntid 128", "{", *body, "\tret;", "}"])

    wait = ["\t// begin inline asm", "\t{", "\t.reg .pred complete;", "\twaitLoop:",
            "\tmbarrier.try_wait.parity.shared.b64 complete, [%r1], %r2;", "\t@!complete bra.uni waitLoop;", "\t}",
            "\t// end inline asm"]
    bar = "\tbar.sync \t0, 128;"
    loop = ["\tmov.b32 %r3, 0;", bar, "$L__BB0_1:", "\tadd.s32 %r4, %r4, 1;", bar, *wait,
            "\twgmma.wait_group.sync.aligned 0;", "\t@%p1 mbarrier.arrive.shared::cta.b64 _, [%r5];",
            "\t@%p2 bra \t$L__BB0_1;"]

    def bars(ptx):
        return ptx.count("bar.sync")

    def drop(ptx):
        return ptx_release.drop_quiet_barriers(ptx, lambda line: "bar.sync" in line)

    assert bars(drop(kernel(*loop))) == 0  # the entry and the back edge are quiet
    load = ["\tld.shared.b32 %r6, [%r7];", *loop]  # a load before the loop: its barrier stays, the loop's goes
    assert bars(drop(kernel(*load))) == 1 and bars(drop(kernel(*load[:2], *load[3:]))) == 1
    store = [*loop[:-1], "\tst.shared.b32 [%r7], %r6;", loop[-1]]  # a store on the back edge: the loop's stays
    assert bars(drop(kernel(*store))) == 1
    tma = [*loop[:-1], "\tcp.async.bulk.wait_group.read 0;", loop[-1]]
    assert bars(drop(kernel(*tma))) == 1
    jump = kernel(*loop[:-1], "\tbrx.idx %r9, $L_unknown;")
    assert drop(jump) == jump
    assert drop("\n".join(loop)) == "\n".join(loop)  # not a kernel: nothing to analyse


# --------------------------------------------------------------------------------------------- GPU
def _is_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _reference(q, k, v, do, causal):
    """fp64 autograd of plain attention, k and v repeated to the query heads, causal top-left aligned."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    (torch.softmax(s, -1) @ v64.repeat_interleave(group, 1)).backward(do.double())
    return q64.grad, k64.grad, v64.grad


def _sdpa(q, k, v, do, causal):
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal,
                                                     enable_gqa=ks.shape[1] != qs.shape[1]).backward(do)
    return qs.grad, ks.grad, vs.grad


def _rounding(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """Twice the dtype's rounding error at the data's magnitude, plus the fp32 noise of dS = P (dP - D) where the
    exact gradient is 0 (about 4 d fp32 epsilons)."""
    step = ((ref + 0.3 - 0.3).to(dtype).double() - ref).abs().max().item()
    return 2 * step + max(1e-6, 4 * ref.shape[-1] * torch.finfo(torch.float32).eps)


GPU_SHAPES = [  # (batch, Hq, Hkv, Nq, Nk, d, causal)
    (1, 2, 2, 1, 1, 64, True),
    (1, 2, 2, 77, 33, 64, True),
    (1, 2, 2, 100, 300, 128, True),
    (1, 2, 2, 1000, 1000, 64, False),
    (2, 3, 3, 257, 513, 128, False),
    (1, 3, 3, 1031, 1031, 64, True),
    (2, 8, 2, 1024, 1024, 128, True),
    (2, 6, 3, 333, 333, 64, True),
]


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("b", "hq", "hkv", "n_q", "n_k", "d", "causal"), GPU_SHAPES)
def test_gpu_variants_within_twice_sdpa(seed, dtype, b, hq, hkv, n_q, n_k, d, causal):
    from cs336_systems.attention.flash_triton import flash_forward

    q = torch.randn(b, hq, n_q, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, n_k, d, device="cuda", dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    ref = _reference(q, k, v, do, causal)
    peer = _sdpa(q, k, v, do, causal)
    o, lse = flash_forward(q, k, v, causal)
    for variant in (v_ for v_ in hb.VARIANTS if v_.head_dim == d):
        ours = hb.run_backward(q, k, v, o, lse, do, causal, variant)
        for name, g, r, p in zip(("dQ", "dK", "dV"), ours, ref, peer, strict=True):
            assert torch.isfinite(g).all(), f"{variant.name()} {name} has NaN/Inf"
            err = (g.double() - r).abs().max().item()
            bound = 2 * (p.double() - r).abs().max().item() + _rounding(r, dtype)
            assert err <= bound, f"{variant.name()} {name}: error {err:.3g} > bound {bound:.3g}"


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_persistent_programs_match_a_program_per_item(seed, causal):
    """Persistent programs take the same work items from a counter: dK and dV (each key tile's by one program, in
    the same order) are bitwise those of a program per item, call after call (the preprocess resets the counter);
    dQ, added up by atomics in another order, within the fp32 accumulation's rounding."""
    from cs336_systems.attention.flash_triton import flash_forward

    q = torch.randn(3, 6, 333, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(3, 2, 333, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    o, lse = flash_forward(q, k, v, causal)
    per_item = hb.run_backward(q, k, v, o, lse, do, causal, hb.Variant(64, 64, 64, 4, 2))
    for _ in range(2):
        persistent = hb.run_backward(q, k, v, o, lse, do, causal, hb.Variant(64, 64, 64, 4, 2, persistent=True))
        assert torch.equal(persistent[1], per_item[1]) and torch.equal(persistent[2], per_item[2])
        torch.testing.assert_close(persistent[0], per_item[0], rtol=1e-2, atol=1e-3)  # a bf16 step either way


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_persistent_forward_matches_a_program_per_item(seed, causal, d):
    """The persistent Gluon forwards (one warpgroup at head dim 64, warp-specialised at 128, as the table has them
    at 1,000 tokens) compute each query tile as a program per item would (bitwise), call after call and layout after
    layout on one stream (each launch leaves its work counter at zero), and inside a CUDA graph's replays."""
    import dataclasses

    from cs336_systems.attention import _tuning
    from cs336_systems.attention import flash_triton as ft

    def config(persistent: bool):
        base = _tuning.config_for(torch.device("cuda"), 1000, d, torch.bfloat16)
        assert base.hopper_fwd.persistent and base.hopper_fwd.warp_specialize == (d == 128)
        return dataclasses.replace(base, hopper_fwd=dataclasses.replace(base.hopper_fwd, persistent=persistent),
                                   small_fwd=())  # these tiles at 333 tokens too

    for n in (333, 1000, 2100):  # more query tiles than SMs (fewer run as a program per item)
        q = torch.randn(3, 12, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(3, 4, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        ref = ft.flash_forward(q, k, v, causal, config(False))
        for _ in range(2):
            out = ft.flash_forward(q, k, v, causal, config(True))
            assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ft.flash_forward(q, k, v, causal, config(True))
    for _ in range(2):
        out[0].zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
def test_gpu_warp_specialised_backward_refuses_persistent_tiles():
    """The warp-specialised backward runs a program per item: a config asking it to be persistent is refused with a
    ValueError before anything runs, not launched on a grid the kernel does not follow."""
    import dataclasses

    from cs336_systems.attention import _tuning
    from cs336_systems.attention import flash_triton as ft

    q, k, v, do = (torch.randn(2, 4, 2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    base = _tuning.config_for(q.device, 2048, 128, q.dtype)
    o, lse = ft.flash_forward(q, k, v, True, base)
    bad = dataclasses.replace(base, hopper_bwd=_tuning.KernelConfig(128, 128, 4, 2, True, True, True))
    with pytest.raises(ValueError, match="needs persistent=False"):
        ft.flash_backward(q, k, v, o, lse, do, True, bad)


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_work_item_order_does_not_change_the_results(seed, causal):
    """The persistent kernels' items in groups of heads (``KernelConfig.interleave``: 1, 4, uneven groups of 7 and
    20, the planner's pick): each item is computed as before, only when differs, so O, L, dK and dV are bitwise those
    of a head at a time, and dQ (added up by atomics in another order) within fp32 rounding."""
    import dataclasses

    from cs336_systems.attention import _tuning
    from cs336_systems.attention import flash_triton as ft

    # 96 query heads over 48 key/value heads: 16 tiles each, more than the single-kernel backward takes (512)
    q = torch.randn(4, 24, 1000, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4, 12, 1000, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    base = _tuning.config_for(q.device, 1000, 64, q.dtype)

    def config(order: int):
        return dataclasses.replace(base, hopper_fwd=dataclasses.replace(base.hopper_fwd, interleave=order),
                                   hopper_bwd=dataclasses.replace(base.hopper_bwd, interleave=order))

    right = 0 if causal else None
    fwd = ft._plan_forward(q, k, v, config(7), None, right, False)  # the persistent kernels, the group in LEFT's slot
    assert fwd[0].kernel is ft.flash_hopper._hopper_fwd_persistent_kernel and fwd[3][-2] == 7
    o, lse = ft.flash_forward(q, k, v, causal, config(1))
    mode, _, launches = ft._plan_backward(q, k, v, o, lse, do, config(7), False, None, right, False)[:3]
    assert mode == "atomic" and launches[1][0].kernel is hb._hopper_bwd_dkdv_kernel and launches[1][2][-2] == 7
    grads = ft.flash_backward(q, k, v, o, lse, do, causal, config(1))
    for order in (4, 7, 20, 0):
        o2, lse2 = ft.flash_forward(q, k, v, causal, config(order))
        assert torch.equal(o2, o) and torch.equal(lse2, lse), order
        dq, dk, dv = ft.flash_backward(q, k, v, o, lse, do, causal, config(order))
        assert torch.equal(dk, grads[1]) and torch.equal(dv, grads[2]), order
        torch.testing.assert_close(dq, grads[0], rtol=1e-2, atol=1e-3)  # a bf16 step either way


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize(("b", "hq", "hkv", "n", "d", "causal"), [
    (2, 8, 8, 2048, 128, False), (1, 6, 2, 1000, 128, True), (4, 5, 5, 777, 64, True), (2, 4, 4, 3000, 64, False)])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-item"])
def test_gpu_lean_forward_gives_the_same_bits(seed, b, hq, hkv, n, d, causal, persistent):
    """The warp-specialised forward without the warpgroup barriers that ``ptx_release`` removes (its consumers'
    releases, and the barriers that then order nothing) computes what it computes with them: O and L bit for bit.
    The planner launches the lean form where the module's switch (``LEAN_RELEASE``) is on."""
    import dataclasses

    from cs336_systems.attention import _tuning, flash_hopper, ptx_release
    from cs336_systems.attention import flash_triton as ft

    q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    base = _tuning.config_for(q.device, n, d, q.dtype)
    tile = _tuning.KernelConfig(128, 128, 4, 2, True, warp_specialize=True, persistent=persistent)
    cfg = dataclasses.replace(base, small_fwd=(), hopper_fwd=tile)
    right, scale = 0 if causal else None, 1 / math.sqrt(d)
    kernel, switch = flash_hopper._hopper_fwd_ws_persistent_kernel, flash_hopper.LEAN_RELEASE
    outs = {}
    for lean in (ptx_release.VERSION, 0):
        fwd = ft._plan_forward(q, k, v, cfg, None, right, False)
        assert fwd[0].kernel is kernel and ptx_release.active()
        assert fwd[0].constexprs["LEAN"] == (ptx_release.VERSION if switch else 0)
        fwd[0].constexprs = dict(fwd[0].constexprs, LEAN=lean)
        plan = ft._Plan(None, right, scale, cfg, fwd)
        outs[lean] = ft._launch_forward(plan, q, k, v, None, None, scale)
    for x, y in zip(outs[ptx_release.VERSION], outs[0], strict=True):
        assert torch.equal(x, y)


SWITCH_SHAPES = [(4, 5, 5, 777, True), (2, 4, 4, 3000, False), (1, 6, 2, 1000, True), (1, 1, 1, 129, True)]
WS_SWITCH_SHAPES = [(2, 4, 4, 3000, 128, False), (1, 6, 2, 1000, 128, True), (4, 5, 5, 777, 64, True),
                    (1, 2, 2, 129, 64, False)]


def _forced_forwards(q, k, v, causal, tile, settings):
    """Our forward at the Gluon tile ``tile``, once for each dict of constexprs in ``settings`` (added to what the
    planner passes) on the same inputs: [(the planner's constexprs, kernel, (O, L))]."""
    import dataclasses

    from cs336_systems.attention import _tuning
    from cs336_systems.attention import flash_triton as ft

    n, d = q.shape[-2:]
    cfg = dataclasses.replace(_tuning.config_for(q.device, n, d, q.dtype), small_fwd=(), hopper_fwd=tile)
    right, scale = 0 if causal else None, 1 / math.sqrt(d)
    runs = []
    for extra in settings:
        fwd = ft._plan_forward(q, k, v, cfg, None, right, False)
        planned = dict(fwd[0].constexprs)
        fwd[0].constexprs = dict(planned, **extra)
        runs.append((planned, fwd[0].kernel,
                     ft._launch_forward(ft._Plan(None, right, scale, cfg, fwd), q, k, v, None, None, scale)))
    return runs


def _errors_against_fp64(o, q, k, v, causal):
    """O's largest error against an fp64 reference, SDPA's own in O's dtype, and the reference."""
    n, d = q.shape[-2:]
    group = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ v.double().repeat_interleave(group, 1)
    peer = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=group > 1)
    return (o.double() - ref).abs().max().item(), (peer.double() - ref).abs().max().item(), ref


def _check_lazy_rescale(b, hq, hkv, n, d, causal, dtype, logits, threshold, tile):
    """Our forward at the Gluon tile ``tile`` with ``LAZY_RESCALE=threshold`` and with 0, on fresh inputs (``growing``:
    key norms rising along the sequence, logits up to about 60 by the last key; three draws, as one key dominating a
    row is where P's largest element rounded away from 1 shows: without O's compensated denominator, simulated, 5-10%
    of such draws passed 2x SDPA's error): O within twice SDPA's error against fp64 with no rounding allowance, L
    within 1e-5 (relative) of the form without it, nothing infinite. Returns the planner's constexprs and the
    kernel."""
    for _ in range(3 if logits == "growing" else 1):
        q, k, v = _inputs(b, hq, hkv, n, d, dtype)
        if logits == "growing":
            k = (k.float() * torch.linspace(0.05, 4.0, n, device="cuda")[:, None]).to(dtype)
        (planned, kernel, (o, lse)), (_, _, (_, lse_eager)) = _forced_forwards(
            q, k, v, causal, tile, [dict(LAZY_RESCALE=threshold), dict(LAZY_RESCALE=0)])
        assert torch.isfinite(o).all() and torch.isfinite(lse).all()
        err, peer, _ = _errors_against_fp64(o, q, k, v, causal)
        assert err <= 2 * peer, (err, peer)
        assert (lse - lse_eager).abs().max().item() <= 1e-5 * max(1.0, lse_eager.abs().max().item())
    return planned, kernel


def _inputs(b, hq, hkv, n, d, dtype):
    q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype) * 2
    return (q, *(torch.randn(b, hkv, n, d, device="cuda", dtype=dtype) for _ in range(2)))


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize(("b", "hq", "hkv", "n", "causal"), SWITCH_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-item"])
@pytest.mark.parametrize("lean_l", [False, True], ids=["packed", "packed-lean-l"])
def test_gpu_leaner_softmax_forwards(seed, b, hq, hkv, n, causal, dtype, persistent, lean_l):
    """The one-warpgroup forward with P rounded in packed pairs (``PACK_P``, ``flash_hopper._to_16bit``) computes
    what the element-wise conversions compute: O and L bit for bit (each pair's halves in the order the P V operand
    takes them). With l kept in per-thread parts and O scaled by 1 / l as well (``LEAN_L``: another order of fp32
    additions, a product for a quotient), O within twice SDPA's error against fp64 plus the dtype's rounding, and L
    within 1e-5 of the shipped form's."""
    from cs336_systems.attention import _tuning, flash_hopper

    q, k, v = _inputs(b, hq, hkv, n, 64, dtype)
    runs = _forced_forwards(q, k, v, causal, _tuning.KernelConfig(64, 64, 4, 3, True, persistent=persistent),
                            [dict(PACK_P=True, LEAN_L=lean_l), dict(PACK_P=False, LEAN_L=False)])
    for planned, kernel, _ in runs:
        assert kernel is flash_hopper._hopper_fwd_persistent_kernel
        switch = flash_hopper.LEAN_SOFTMAX  # what the planner launches
        assert planned["PACK_P"] == switch and planned["LEAN_L"] == switch
    (o, lse), (o_shipped, lse_shipped) = runs[0][2], runs[1][2]
    if not lean_l:
        assert torch.equal(o, o_shipped) and torch.equal(lse, lse_shipped)
        return
    err, peer, ref = _errors_against_fp64(o, q, k, v, causal)
    assert err <= 2 * peer + _rounding(ref, dtype), err
    assert (lse - lse_shipped).abs().max().item() <= 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize(("b", "hq", "hkv", "n", "d", "causal"), WS_SWITCH_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_ws_forward_lean_l(seed, b, hq, hkv, n, d, causal, dtype):
    """The warp-specialised forward with its consumers' l in per-thread parts and O scaled by 1 / l (``LEAN_L``, what
    the planner passes with ``flash_hopper.LEAN_SOFTMAX``): O within twice SDPA's error against fp64 plus the dtype's
    rounding, L within 1e-5 of the form without it."""
    from cs336_systems.attention import _tuning, flash_hopper

    q, k, v = _inputs(b, hq, hkv, n, d, dtype)
    (planned, kernel, (o, lse)), (_, _, (_, lse_shipped)) = _forced_forwards(
        q, k, v, causal, _tuning.KernelConfig(128, 128, 4, 2, True, True, True),
        [dict(LEAN_L=True), dict(LEAN_L=False)])
    assert kernel is flash_hopper._hopper_fwd_ws_persistent_kernel and planned["LEAN_L"] == flash_hopper.LEAN_SOFTMAX
    err, peer, ref = _errors_against_fp64(o, q, k, v, causal)
    assert err <= 2 * peer + _rounding(ref, dtype), err
    assert (lse - lse_shipped).abs().max().item() <= 1e-5 * max(1.0, lse_shipped.abs().max().item())


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize(("b", "hq", "hkv", "n", "d", "causal"), WS_SWITCH_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("logits", ["randn", "growing"])
def test_gpu_ws_lazy_rescale_forwards(seed, b, hq, hkv, n, d, causal, dtype, logits):
    """The warp-specialised forward with its consumers' rescales skipped below ``flash_hopper.RESCALE_THRESHOLD``
    (``LAZY_RESCALE``, which the planner passes at ``flash_hopper.WS_RESCALE_HEAD_DIMS``): O within twice SDPA's error
    against fp64 with no rounding allowance (P's largest element is no longer exact: ``_check_lazy_rescale``), L within
    1e-5 of the form without it, nothing infinite."""
    from cs336_systems.attention import _tuning, flash_hopper

    planned, kernel = _check_lazy_rescale(b, hq, hkv, n, d, causal, dtype, logits, flash_hopper.RESCALE_THRESHOLD,
                                          _tuning.KernelConfig(128, 128, 4, 2, True, True, True))
    assert kernel is flash_hopper._hopper_fwd_ws_persistent_kernel
    lazy = flash_hopper.RESCALE_THRESHOLD if d in flash_hopper.WS_RESCALE_HEAD_DIMS else 0
    assert planned["LAZY_RESCALE"] == lazy  # what the planner launches


@pytest.mark.gpu
@pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU (TMA, wgmma)")
@pytest.mark.parametrize(("b", "hq", "hkv", "n", "d", "causal", "early"), [
    (2, 8, 8, 2048, 128, False, True), (1, 6, 2, 1000, 128, True, False), (2, 4, 4, 3000, 64, False, False),
    (4, 5, 5, 777, 64, True, False)])
def test_gpu_lean_backward_gives_the_same_bits(seed, b, hq, hkv, n, d, causal, early):
    """The warp-specialised backward without the barriers ``ptx_release`` removes (its ring releases marked) gives
    dK and dV bit for bit and dQ (added up across key tiles in no fixed order) to fp32 rounding."""
    from cs336_systems.attention import flash_triton as ft

    q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    o, lse = ft.flash_forward(q, k, v, causal)
    grads = {lean: hb.run_backward(q, k, v, o, lse, do, causal, hb.Variant(d, 128, 64, 4, 3 if d == 64 else 2,
                                                                         warp_specialize=True, dq_early=early,
                                                                         lean=lean))
             for lean in (True, False)}
    assert torch.equal(grads[True][1], grads[False][1]) and torch.equal(grads[True][2], grads[False][2])
    torch.testing.assert_close(grads[True][0], grads[False][0], rtol=1e-2, atol=1e-3)  # a bf16 step either way
