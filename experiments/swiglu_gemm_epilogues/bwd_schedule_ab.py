"""Session 30: the SwiGLU backward GEMM's two schedules timed alternately (a probe's first variant ran slow in
some runs, so an A/B in one order is not enough): the cooperative warp-specialised kernel that shipped in session 29
(``swiglu_gemm_variants.py`` here, ``ws=True``) against the ping-pong kernel in the package. Also the forward's
ping-pong variant (``swiglu_gemm_pingpong_forward.py`` here) against the package's cooperative forward.

    python experiments/swiglu_gemm_epilogues/bwd_schedule_ab.py [--rounds 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
from triton.testing import do_bench

from cs336_systems.fused import swiglu_gemm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import swiglu_gemm_pingpong_forward as pp_forward  # the snapshots beside this script
import swiglu_gemm_variants as variants

SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400)}  # M, K (d_model), N (d_ff)


def time_shape(name: str, rounds: int) -> list[dict]:
    """Each kernel's median over ``rounds`` rounds of ``do_bench`` medians, the order reversed every other round."""
    m, k, n = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w1, w3 = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5 for _ in range(2))
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w2 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / n**0.5
    a, b = x @ w1.T, x @ w3.T
    kernels = {
        "bwd cooperative (session 29)": lambda: variants.swiglu_backward(dy, w2, a, b, variants.BWD_WS_CONFIG,
                                                                         ws=True),
        "bwd ping-pong (package)": lambda: swiglu_gemm.swiglu_backward(dy, w2, a, b),
        "fwd cooperative (package)": lambda: swiglu_gemm.dual_swiglu(x, w1, w3),
        "fwd ping-pong": lambda: pp_forward.dual_swiglu(x, w1, w3, pingpong=True),
    }
    outs = {label: fn() for label, fn in kernels.items()}
    same = {kind: all(torch.equal(u, v) for u, v in zip(*(o for lb, o in outs.items() if lb.startswith(kind))))
            for kind in ("bwd", "fwd")}
    times = {label: [] for label in kernels}
    for r in range(rounds):
        for label in (list(kernels) if r % 2 == 0 else list(reversed(kernels))):
            times[label].append(do_bench(kernels[label], warmup=25, rep=200, return_mode="median"))
    rows = []
    for label, ts in times.items():
        ts = sorted(ts)
        rows.append(dict(shape=name, kernel=label, ms_median=ts[len(ts) // 2], ms_all=ts, same_outputs=same[label[:3]]))
        print(f"{name:<8} {label:<30} median of rounds {ts[len(ts) // 2]:.4f} ms  all {[round(t, 4) for t in ts]}  "
              f"outputs equal: {same[label[:3]]}", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    rows = [row for name in SHAPES for row in time_shape(name, args.rounds)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "bwd_schedule_ab.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
