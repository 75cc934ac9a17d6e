"""The fused feed-forward's Gluon kernels with one CTA a cluster against two (the row operand's tiles multicast to
a pair of column tiles, ``cs336_systems.fused.cluster_ptx``): same outputs bit for bit, and their times taken
alternately, the order reversed every other round (session 30's lesson: a probe's first variant can run slow).

    python scripts/device/swiglu_cluster_ab.py [--rounds 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.testing import do_bench

from cs336_systems.fused import swiglu_gemm  # with the patch beside this script applied

SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400), "odd": (777, 200, 328)}  # M, K, N


def time_shape(name: str, rounds: int) -> list[dict]:
    m, k, n = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w1, w3 = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5 for _ in range(2))
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w2 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / n**0.5
    a, b = x @ w1.T, x @ w3.T
    kernels = {f"{kind} cluster {c}": (lambda c=c: swiglu_gemm.dual_swiglu(x, w1, w3, cluster=c)) if kind == "fwd"
               else (lambda c=c: swiglu_gemm.swiglu_backward(dy, w2, a, b, cluster=c))
               for kind in ("fwd", "bwd") for c in (1, 2)}
    outs = {label: fn() for label, fn in kernels.items()}
    torch.cuda.synchronize()
    same = {kind: all(torch.equal(u, v) for u, v in zip(outs[f"{kind} cluster 1"], outs[f"{kind} cluster 2"]))
            for kind in ("fwd", "bwd")}
    print(f"{name}: outputs equal {same}", flush=True)
    times = {label: [] for label in kernels}
    for r in range(rounds):
        for label in (list(kernels) if r % 2 == 0 else list(reversed(kernels))):
            times[label].append(do_bench(kernels[label], warmup=25, rep=200, return_mode="median"))
    rows = []
    for label, ts in times.items():
        ts = sorted(ts)
        rows.append(dict(shape=name, kernel=label, ms_median=ts[len(ts) // 2], ms_all=ts, same_outputs=same[label[:3]]))
        print(f"{name:<8} {label:<16} median of rounds {ts[len(ts) // 2]:.4f} ms  all {[round(t, 4) for t in ts]}",
              flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    rows = [row for name in args.shapes for row in time_shape(name, args.rounds)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "swiglu_cluster_ab.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
