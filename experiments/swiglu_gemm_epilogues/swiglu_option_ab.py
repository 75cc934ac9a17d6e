"""Session 32: the fused feed-forward's kernels with one option of a patch beside this script off and on, in one
process: outputs compared (bit for bit, else the largest difference) and times taken in alternating rounds, the
order reversed every other round. Apply the option's patch at the repository root first, then on an H100:

    python experiments/swiglu_gemm_epilogues/swiglu_option_ab.py --option defer_ab     # defer_ab.patch
    python experiments/swiglu_gemm_epilogues/swiglu_option_ab.py --option lean_release # lean_release.patch
    python experiments/swiglu_gemm_epilogues/swiglu_option_ab.py --option wide         # wide.patch

``defer_ab`` and ``wide`` are the forward's options, ``lean_release`` both kernels'.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.testing import do_bench

from cs336_systems.fused import swiglu_gemm  # with the option's patch applied

SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400), "odd": (777, 200, 328)}  # M, K, N
KINDS = {"defer_ab": ("fwd",), "wide": ("fwd",), "lean_release": ("fwd", "bwd")}


def time_shape(name: str, option: str, rounds: int) -> list[dict]:
    m, k, n = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w1, w3 = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5 for _ in range(2))
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w2 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / n**0.5
    a, b = x @ w1.T, x @ w3.T
    calls = {"fwd": lambda on: swiglu_gemm.dual_swiglu(x, w1, w3, **{option: on}),
             "bwd": lambda on: swiglu_gemm.swiglu_backward(dy, w2, a, b, **{option: on})}
    kernels = {f"{kind} {option}={on}": (lambda kind=kind, on=on: calls[kind](on))
               for kind in KINDS[option] for on in (False, True)}
    outs = {label: fn() for label, fn in kernels.items()}
    same, diff = {}, {}
    for kind in KINDS[option]:
        pairs = list(zip(outs[f"{kind} {option}=False"], outs[f"{kind} {option}=True"], strict=True))
        same[kind] = all(torch.equal(u, v) for u, v in pairs)
        diff[kind] = max((u.float() - v.float()).abs().max().item() for u, v in pairs)
    times = {label: [] for label in kernels}
    for r in range(rounds):
        for label in (list(kernels) if r % 2 == 0 else list(reversed(kernels))):
            times[label].append(do_bench(kernels[label], warmup=25, rep=200, return_mode="median"))
    rows = []
    for label, ts in times.items():
        ts, kind = sorted(ts), label[:3]
        rows.append(dict(shape=name, kernel=label, ms_median=ts[len(ts) // 2], ms_all=ts, same_outputs=same[kind],
                         max_abs_difference=diff[kind]))
        print(f"{name:<8} {label:<24} median of rounds {ts[len(ts) // 2]:.4f} ms  all {[round(t, 4) for t in ts]}  "
              f"outputs equal: {same[kind]} (largest difference {diff[kind]:.3g})", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--option", required=True, choices=list(KINDS))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    rows = [row for name in SHAPES for row in time_shape(name, args.option, args.rounds)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", ""), "option": args.option}
    with open(os.path.join(args.out, f"swiglu_{args.option}_ab.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
