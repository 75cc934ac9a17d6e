"""The fused feed-forward's forward with two m64n128 products a K slice (``wide=False``) against one m64n256 over
both weights' tiles side by side (``wide=True``, session 32): outputs compared (bit for bit, else the largest
difference), times taken in alternating rounds, the order reversed every other round.

    python experiments/swiglu_gemm_epilogues/swiglu_wide_ab.py [--rounds 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.testing import do_bench

from cs336_systems.fused import swiglu_gemm  # with wide.patch beside this script applied

SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400), "odd": (777, 200, 328)}  # M, K, N


def time_shape(name: str, rounds: int) -> list[dict]:
    m, k, n = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w1, w3 = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5 for _ in range(2))
    kernels = {f"wide={w}": (lambda w=w: swiglu_gemm.dual_swiglu(x, w1, w3, wide=w)) for w in (False, True)}
    outs = [fn() for fn in kernels.values()]
    same = all(torch.equal(u, v) for u, v in zip(*outs, strict=True))
    diff = max((u.float() - v.float()).abs().max().item() for u, v in zip(*outs, strict=True))
    times = {label: [] for label in kernels}
    for r in range(rounds):
        for label in (list(kernels) if r % 2 == 0 else list(reversed(kernels))):
            times[label].append(do_bench(kernels[label], warmup=25, rep=200, return_mode="median"))
    rows = []
    for label, ts in times.items():
        ts = sorted(ts)
        rows.append(dict(shape=name, kernel=label, ms_median=ts[len(ts) // 2], ms_all=ts, same_outputs=same,
                         max_abs_difference=diff))
        print(f"{name:<8} {label:<12} median of rounds {ts[len(ts) // 2]:.4f} ms  all {[round(t, 4) for t in ts]}  "
              f"outputs equal: {same} (largest difference {diff:.3g})", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    rows = [row for name in SHAPES for row in time_shape(name, args.rounds)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "swiglu_wide_ab.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
