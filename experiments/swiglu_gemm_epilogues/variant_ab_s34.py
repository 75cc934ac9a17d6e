"""Session 34: the fused feed-forward's Gluon kernels in their variants, timed in alternating rounds in one process.

Variants are keyword options that ``s34_variants.patch`` beside this script gives the package module (it applies at
the repository root: ``git apply experiments/swiglu_gemm_epilogues/s34_variants.patch``; the module as it ran at
c4eb521, whose ``split`` backward the package has kept): the forward with one or two K
slices' MMAs outstanding (``inflight``), the backward with both halves' a and b loaded during the products
(``prefetch``, three ring stages) or the second half's loaded after the first half's stores (five stages), and
either epilogue a quarter tile at a time (``split``: fewer live registers, no spills in the backward). Outputs
are compared bit for bit with the first variant of each kind (the arithmetic is the same), and each variant's time is
the median over rounds of ``do_bench`` medians, the order reversed every other round (a probe's first variant has run
slow before: docs/training_step.md, session 30).

    python experiments/swiglu_gemm_epilogues/variant_ab_s34.py [--rounds 6] [--shapes xl_2048 xl_512 odd]
    python experiments/swiglu_gemm_epilogues/variant_ab_s34.py --only bwd-split --calls 4   # for ncu
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.testing import do_bench

from cs336_systems.fused import swiglu_gemm  # with s34_variants.patch applied

SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400), "odd": (777, 200, 328)}  # M, K, N
VARIANTS = {
    "fwd-shipped": ("fwd", {}),
    "fwd-inflight2": ("fwd", {"inflight": 2}),
    "fwd-split": ("fwd", {"split": True}),
    "bwd-shipped": ("bwd", {}),
    "bwd-prefetch": ("bwd", {"prefetch": True}),
    "bwd-prefetch-group16": ("bwd", {"prefetch": True, "config": (128, 128, 64, 3, 16)}),
    "bwd-split": ("bwd", {"split": True}),
}


def _inputs(m: int, k: int, n: int):
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w1, w3 = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5 for _ in range(2))
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w2 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / n**0.5
    return x, w1, w3, dy, w2, x @ w1.T, x @ w3.T


def _calls(shape: str, names: list[str]):
    x, w1, w3, dy, w2, a, b = _inputs(*SHAPES[shape])
    kinds = {"fwd": lambda kw: swiglu_gemm.dual_swiglu(x, w1, w3, **kw),
             "bwd": lambda kw: swiglu_gemm.swiglu_backward(dy, w2, a, b, **kw)}
    return {name: (lambda kind=VARIANTS[name][0], kw=VARIANTS[name][1]: kinds[kind](kw)) for name in names}


def time_shape(shape: str, names: list[str], rounds: int) -> list[dict]:
    calls = _calls(shape, names)
    outs = {name: fn() for name, fn in calls.items()}
    first = {}
    for name in names:
        first.setdefault(name[:3], name)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else list(reversed(names))):
            times[name].append(do_bench(calls[name], warmup=25, rep=200, return_mode="median"))
    rows = []
    for name in names:
        ref = outs[first[name[:3]]]
        same = all(torch.equal(u, v) for u, v in zip(ref, outs[name], strict=True))
        diff = max((u.float() - v.float()).abs().max().item() for u, v in zip(ref, outs[name], strict=True))
        ts = sorted(times[name])
        rows.append(dict(shape=shape, variant=name, ms_median=ts[len(ts) // 2], ms_all=ts, same_outputs=same,
                         max_abs_difference=diff))
        print(f"{shape:<8} {name:<22} median of rounds {ts[len(ts) // 2]:.4f} ms  all {[round(t, 4) for t in ts]}  "
              f"equal to {first[name[:3]]!r}: {same} (largest difference {diff:.3g})", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--only", choices=list(VARIANTS), help="run this variant --calls times at the first shape (ncu)")
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    if args.only:
        fn = _calls(args.shapes[0], [args.only])[args.only]
        for _ in range(args.calls):
            fn()
        torch.cuda.synchronize()
        return
    rows = [row for shape in args.shapes for row in time_shape(shape, args.variants, args.rounds)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "swiglu_variant_ab.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
