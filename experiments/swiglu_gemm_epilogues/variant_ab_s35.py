"""Session 35: where the fused feed-forward kernels' time goes beyond their products, timed in alternating rounds.

``s35_variants.patch`` (beside this script; ``git apply`` at the repository root) gives the package module an ``epi``
option: 2 the shipped epilogue, 1 the same memory traffic without the arithmetic (the backward stores a and b back
unchanged; the forward stores h only), 0 the products alone (the epilogue stays in the code under a condition that
never holds, so the compiler keeps the MMAs); and the backward a ``prefetch`` option: both halves' a and b loaded
during the products into four buffers a consumer, with 32-wide K slices so that six ring stages still fit. cuBLAS's
plain products of the same shapes run beside them. Each variant's time is the median over rounds of ``do_bench``
medians, the order reversed every other round; outputs of the shipped-arithmetic variants are compared bit for bit
with the shipped kernel's.

    python experiments/swiglu_gemm_epilogues/variant_ab_s35.py [--rounds 6] [--shapes xl_2048 xl_512]
    python experiments/swiglu_gemm_epilogues/variant_ab_s35.py --only bwd-copy --calls 4   # for ncu
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.testing import do_bench
from variant_ab_s34 import _inputs  # beside this script: the same inputs as session 34's probe

from cs336_systems.fused import swiglu_gemm  # with s35_variants.patch applied

SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400)}  # M, K (d_model), N (d_ff)
VARIANTS = {  # name: (kind, options, whether the outputs must equal the shipped kernel's)
    "fwd-shipped": ("fwd", {}, True),
    "fwd-h-only": ("fwd", {"epi": 1}, False),
    "fwd-products": ("fwd", {"epi": 0}, False),
    "fwd-cublas-two": ("fwd-cublas", {}, False),
    "bwd-shipped": ("bwd", {}, True),
    "bwd-copy": ("bwd", {"epi": 1}, False),
    "bwd-products": ("bwd", {"epi": 0}, False),
    "bwd-k32s10": ("bwd", {"config": (128, 128, 32, 10, 8)}, True),
    "bwd-prefetch-k32s6": ("bwd", {"prefetch": True, "config": (128, 128, 32, 6, 8)}, True),
    "bwd-cublas": ("bwd-cublas", {}, False),
    # epi 3, backward: the first half's a and b requested before the consumer's turn at the products, not inside
    # their loop; forward: two output buffers a consumer (three ring stages then fit), stores in turn without
    # waiting for the previous one to leave its buffer
    "bwd-early-ab": ("bwd", {"epi": 3}, True),
    "fwd-s3": ("fwd", {"config": (128, 128, 64, 3, 8)}, True),
    "fwd-outring-s3": ("fwd", {"epi": 3, "config": (128, 128, 64, 3, 8)}, True),
    # epi 4, backward: a and b loaded into registers and da, db stored from them, an eighth of a tile (32 columns)
    # at a time, no shared memory for them, so the ring can take seven stages
    "bwd-regs": ("bwd", {"epi": 4}, True),
    "bwd-regs-s7": ("bwd", {"epi": 4, "config": (128, 128, 64, 7, 8)}, True),
    # epi 5: the epilogue's loads and stores at coordinates wrapped into the first 256 x 256 (the forward's three
    # stores, the backward's copy of epi 1): the same TMA and shared-memory work with its traffic held in L2, no DRAM
    "fwd-l2-stores": ("fwd", {"epi": 5}, False),
    "bwd-l2-copy": ("bwd", {"epi": 5}, False),
    # session 36 (s36_variants.patch): da, db stored by the LSU, the second half's a, b loaded without a store drain
    "bwd-lsu": ("bwd", {"epi": 6}, True),
}
# the tile order: GROUP_M row tiles at a time (8 shipped), which sets how long a weight's column panel stays in use
# while a, b, h (forward) or a, b, da, db (backward) stream through the L2 cache
for _g in (2, 4, 16, 64):
    VARIANTS[f"fwd-group{_g}"] = ("fwd", {"config": (128, 128, 64, 4, _g)}, True)
    VARIANTS[f"bwd-group{_g}"] = ("bwd", {"config": (128, 128, 64, 5, _g)}, True)


def _calls(shape: str, names: list[str]):
    x, w1, w3, dy, w2, a, b = _inputs(*SHAPES[shape])
    kinds = {"fwd": lambda kw: swiglu_gemm.dual_swiglu(x, w1, w3, **kw),
             "bwd": lambda kw: swiglu_gemm.swiglu_backward(dy, w2, a, b, **kw),
             "fwd-cublas": lambda kw: (x @ w1.T, x @ w3.T),
             "bwd-cublas": lambda kw: (dy @ w2,)}
    return {name: (lambda kind=VARIANTS[name][0], kw=VARIANTS[name][1]: kinds[kind](kw)) for name in names}


def time_shape(shape: str, names: list[str], rounds: int) -> list[dict]:
    calls = _calls(shape, names)
    outs = {name: fn() for name, fn in calls.items()}
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else list(reversed(names))):
            times[name].append(do_bench(calls[name], warmup=25, rep=200, return_mode="median"))
    rows = []
    for name in names:
        kind, _, check = VARIANTS[name]
        ref = outs.get(f"{kind}-shipped")
        same = (all(torch.equal(u, v) for u, v in zip(ref, outs[name], strict=True))
                if check and ref is not None else None)
        ts = sorted(times[name])
        rows.append(dict(shape=shape, variant=name, ms_median=ts[len(ts) // 2], ms_all=ts, same_outputs=same))
        print(f"{shape:<8} {name:<20} median of rounds {ts[len(ts) // 2]:.4f} ms  all {[round(t, 4) for t in ts]}"
              f"{'' if same is None else f'  equal to the shipped kernel: {same}'}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--only", choices=list(VARIANTS), help="run this variant --calls times at the first shape (ncu)")
    p.add_argument("--calls", type=int, default=4)
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
    with open(os.path.join(args.out, "swiglu_variant_ab_s35.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
