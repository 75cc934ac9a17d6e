"""A/B of Gluon forward variants (tiles, persistence) in one process, same inputs.

    python scripts/device/fwd_variant_ab.py [--out DIR]

Per shape (``--rounds``: in rounds, the order rotated by one each round; medians): forward medians
(``triton.testing.do_bench``) of each variant and of SDPA cuDNN / flash, the GPU time of each call's kernels
(``bench.flash.kernel_ms``: what counts where the host sets do_bench's pace, the 512-token shapes), and each variant's
O error against an fp64 reference beside SDPA's own (the 2x rule plus one bf16 ulp of O's scale). ``--variants
short``: the variants tried for short sequences at head dim 64; ``lean``: the forwards with and without the
warpgroup barriers that ``ptx_release`` removes; ``packed``: the one-warpgroup forward with and without packed P
conversions and l's per-thread parts; ``wslazy``: the warp-specialised forward with and without O's rescale skipped
where m did not move past a threshold (``LAZY_RESCALE``; the one-warpgroup forward's sets, ``fwd43`` and ``lazyc``,
are in experiments/flash_fwd_lazy_rescale/).
``same``: O and L equal bit for bit to our variant listed before it.
Writes ``fwd_variant_ab.json`` under ``--out`` (or ``$OUT``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import _tuning, ptx_release
from cs336_systems.attention import flash_triton as ft
from cs336_systems.bench.flash import _interleaved, kernel_ms

K = _tuning.KernelConfig
SHAPES = {  # batch, q heads, kv heads, n, d, causal
    "xl_2048": (4, 25, 25, 2048, 64, True), "xl_512": (4, 25, 25, 512, 64, True),
    "lb2025": (1, 16, 16, 16384, 64, True),
    "d64_full_2k": (8, 16, 16, 2048, 64, False), "small_512": (8, 12, 12, 512, 64, True),
    "noncausal_2k": (8, 16, 16, 2048, 128, False), "d128_4k": (1, 16, 16, 4096, 128, True),
    "gqa": (2, 32, 8, 8192, 128, True), "lb2026": (2, 32, 32, 32768, 128, True),
    "floor": (1, 1, 1, 128, 64, True),
}
# (tile, constexprs the launch adds: {"EXP_SPLIT": True} or {"PREFETCH": True} with the patch of
# experiments/flash_exp_split/ or experiments/flash_fwd_prefetch/ applied)
VARIANTS = {
    64: [(K(64, 64, 4, 3, True, False, True), {}), (K(64, 64, 4, 2, True, False, True), {}),
         (K(64, 128, 4, 3, True, False, True), {}), (K(128, 128, 4, 3, True, True, True), {}),
         # two warpgroups a program sharing each K/V tile (half the L2 traffic a query row; 128 registers, 49 KB:
         # two programs an SM; session 41)
         (K(128, 64, 8, 2, True, False, True), {})],
    128: [(K(128, 128, 4, 2, True, True), {}), (K(128, 128, 4, 2, True, True, True), {}),
          # 64-key steps, deeper rings (session 39)
          (K(128, 64, 4, 3, True, True, True), {}), (K(128, 64, 4, 4, True, True, True), {})],
}
SHORT = {  # head dim 64, short sequences (session 21: none faster than the first; with the patch of
    # experiments/flash_fwd_overlap/ applied, add (K(64, 64, 4, 3, True, False, True), {"OVERLAP": True}))
    64: [(K(64, 64, 4, 3, True, False, True), {}), (K(64, 64, 4, 2, True, False, True), {}),
         (K(64, 64, 4, 2, True), {}), (K(64, 64, 4, 3, True), {}), (K(64, 128, 4, 2, True), {}),
         (K(128, 64, 8, 2, True), {}), (K(128, 128, 4, 2, True, True), {}), (K(128, 64, 4, 3, True, True, True), {}),
         (K(128, 64, 4, 4, True, True, True), {}), (K(128, 64, 4, 3, True, True), {})],
}

LEAN = {  # the warp-specialised forward with and without the warpgroup barriers ptx_release removes (sessions 39-40;
    # the one-warpgroup form's refills: experiments/lean_refill/)
    64: [(K(128, 128, 4, 3, True, True, True), {"LEAN": 0}),
         (K(128, 128, 4, 3, True, True, True), {"LEAN": ptx_release.VERSION})],
    128: [(K(128, 128, 4, 2, True, True, True), {"LEAN": 0}),
          (K(128, 128, 4, 2, True, True, True), {"LEAN": ptx_release.VERSION})],
}

PACKED = {  # the one-warpgroup forward with P rounded to 16 bits in packed pairs (``flash_hopper._to_16bit``: no PRMT
    # swaps), then l in per-thread parts and O scaled by 1 / l as well (``LEAN_L``); session 42: 332 -> 321 -> 313 SASS
    # instructions in the unmasked key loop, 2,104 -> 1,960 in the kernel; persistent and a program per item
    64: [(K(64, 64, 4, 3, True, False, True), {"PACK_P": False, "LEAN_L": False}),
         (K(64, 64, 4, 3, True, False, True), {"PACK_P": True, "LEAN_L": False}),
         (K(64, 64, 4, 3, True, False, True), {"PACK_P": True, "LEAN_L": True}),
         # four stages: the ring's stage and phase by masks instead of divisions by 3; 74 KB, still three programs an SM
         (K(64, 64, 4, 4, True, False, True), {"PACK_P": True, "LEAN_L": True}),
         (K(64, 64, 4, 3, True), {"PACK_P": False, "LEAN_L": False}),
         (K(64, 64, 4, 3, True), {"PACK_P": True, "LEAN_L": True})],
}

WSLAZY = {  # the warp-specialised forward (its consumers' l in per-thread parts, as shipped) with m moved at every new
    # maximum or only past ``flash_hopper.RESCALE_THRESHOLD``, O's rescale skipped by warps whose rows kept theirs
    # (``LAZY_RESCALE``; two votes and 4-8 more branches in sm_90a SASS, the same FMULs; session 45 timed it before
    # and after O's denominator was compensated, and it is on at head dim 128)
    64: [(K(128, 128, 4, 3, True, True, True), {"LAZY_RESCALE": 0}),
         (K(128, 128, 4, 3, True, True, True), {"LAZY_RESCALE": 4})],
    128: [(K(128, 128, 4, 2, True, True, True), {"LAZY_RESCALE": 0}),
          (K(128, 128, 4, 2, True, True, True), {"LAZY_RESCALE": 4})],
}

REGS = {  # head dim 64: register caps (Triton's ``maxnreg`` launch option) that let one more program share an SM
    64: [(K(64, 64, 4, 3, True, False, True), {}), (K(64, 64, 4, 2, True, False, True), {}),
         (K(64, 64, 4, 2, True, False, True), {"maxnreg": 128}), (K(64, 64, 4, 2, True), {"maxnreg": 128}),
         (K(64, 64, 4, 3, True), {"maxnreg": 128}), (K(64, 128, 4, 2, True), {"maxnreg": 168}),
         (K(64, 128, 4, 2, True, False, True), {"maxnreg": 168}), (K(64, 128, 4, 3, True, False, True), {}),
         (K(64, 32, 4, 3, True, False, True), {}), (K(64, 32, 4, 4, True, False, True), {}),
         (K(64, 32, 4, 2, True, False, True), {})],
}


def runner(q, k, v, causal, tile, extra):
    n_q, d = q.shape[-2:]
    cfg = dataclasses.replace(_tuning.config_for(q.device, n_q, d, q.dtype), hopper_fwd=tile)
    left, right = ft.normalize_window(None, causal, n_q, k.shape[-2])
    fwd = ft._plan_forward(q, k, v, cfg, left, right, False)
    fwd[0].constexprs = dict(fwd[0].constexprs, **extra)
    plan = ft._Plan(left, right, 1 / math.sqrt(d), cfg, fwd)
    return lambda: ft._launch_forward(plan, q, k, v, None, None, plan.scale), fwd[0].kernel.__name__


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--shapes", nargs="*", default=list(SHAPES))
    p.add_argument("--variants", choices=["default", "short", "regs", "lean", "packed", "wslazy"],
                   default="default")
    p.add_argument("--rounds", type=int, default=1, help="timing rounds, the order rotated by one each round; medians")
    args = p.parse_args()
    variants = {"short": SHORT, "regs": REGS, "lean": LEAN, "packed": PACKED,
                "wslazy": WSLAZY}.get(args.variants, VARIANTS)
    rows = []
    for name in args.shapes:
        b, hq, hkv, n, d, causal = SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(n + d)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=g) * 2
        k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        kk, vv = (t.repeat_interleave(hq // hkv, dim=1) for t in (k, v))
        ref = None
        if b * hq * n * n <= 2**31:  # fp64 reference where it fits
            s = q.double() @ kk.double().transpose(-1, -2) / math.sqrt(d)
            if causal:
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
            ref = torch.softmax(s, -1) @ vv.double()
            del s

        def sdpa(backend, q=q, kk=kk, vv=vv, causal=causal):
            def run():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
            return run

        fns = {"sdpa_cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION), "cudnn"),
               "sdpa_flash": (sdpa(SDPBackend.FLASH_ATTENTION), "flash")}
        for tile, extra in variants[d]:
            label = tile.short() + "".join(f"/{name.lower()}" + ("" if on is True else str(on))
                                           for name, on in extra.items() if on)
            fns[label] = runner(q, k, v, causal, tile, extra)
        peer_err = None
        if ref is not None:
            peer_err = (sdpa(SDPBackend.FLASH_ATTENTION)().double() - ref).abs().max().item()
        times = {impl: ([], []) for impl in fns}
        for _, impl in _interleaved(fns, args.rounds):
            times[impl][0].append(triton.testing.do_bench(fns[impl][0], warmup=25, rep=100))
            times[impl][1].append(kernel_ms(fns[impl][0], q.device, []))
        prev = None
        for impl, (fn, kernel) in fns.items():
            ms, gpu_ms = statistics.median(times[impl][0]), statistics.median(times[impl][1])
            out = fn()
            o = out[0] if isinstance(out, tuple) else out
            err = (o.double() - ref).abs().max().item() if ref is not None else None
            ok = err is None or err <= 2 * peer_err + ref.abs().max().item() * 2**-8
            same = None
            if isinstance(out, tuple):  # ours: (O, L); bitwise against our variant before
                same = prev is not None and all(torch.equal(a, b) for a, b in zip(out, prev, strict=True))
                prev = out
            rows.append(dict(shape=name, impl=impl, kernel=kernel, ms=ms, kernel_ms=gpu_ms, err=err,
                             sdpa_flash_err=peer_err, ok=ok, same=same))
            print(f"{name:<13} {impl:<28} {kernel:<34} {ms:.4f} ms  kernels {gpu_ms:.4f} ms  "
                  f"err {err if err is None else f'{err:.2e}'} {'ok' if ok else 'FAIL'}"
                  + ("" if same is None else f" same={same}"), flush=True)
        best = min(r["ms"] for r in rows if r["shape"] == name and r["impl"].startswith("sdpa"))
        best_gpu = min(r["kernel_ms"] for r in rows if r["shape"] == name and r["impl"].startswith("sdpa"))
        for r in rows:
            if r["shape"] == name:
                r["vs_best_sdpa"] = r["ms"] / best
                r["kernel_vs_best_sdpa"] = r["kernel_ms"] / best_gpu
        print(name, "  ".join(f"{r['impl']} {r['vs_best_sdpa']:.3f} (kernels {r['kernel_vs_best_sdpa']:.3f})"
                              for r in rows if r["shape"] == name), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "fwd_variant_ab.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
