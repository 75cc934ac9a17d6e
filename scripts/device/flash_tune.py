# ruff: noqa: B023  (each closure is timed at once, inside its loop iteration)
"""Tile sweep for the FlashAttention-2 Triton kernels on the device (forward, dK/dV and dQ kernels).

Times each candidate configuration of one kernel with the other kernels fixed, at the target shapes,
and prints / writes JSON of median ms. Used to fill the pinned table in cs336_systems/attention/_tuning.py.
Usage: python scripts/device/flash_tune.py OUT.json [shape ...]   (shapes: leaderboard d128 long)
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench

from cs336_systems.attention._tuning import FlashConfig, KernelConfig, pinned_config
from cs336_systems.attention.flash_triton import flash_backward, flash_forward
from cs336_systems.bench.flash import LEADERBOARD_SHAPES

K = KernelConfig
CANDIDATES = {  # by head dim: (fwd, dkdv, dq)
    64: (
        [K(128, 64, 4, 3), K(128, 128, 8, 3), K(128, 64, 8, 3), K(128, 128, 4, 3), K(128, 64, 4, 4), K(64, 64, 4, 3),
         K(64, 128, 4, 3), K(128, 128, 8, 2)],
        [K(32, 128, 4, 3), K(64, 128, 8, 3), K(64, 128, 8, 2), K(32, 128, 8, 3), K(64, 64, 4, 3), K(16, 128, 4, 4),
         K(64, 128, 4, 2), K(32, 128, 4, 4), K(128, 128, 8, 2), K(32, 64, 4, 4)],
        [K(128, 32, 4, 3), K(128, 64, 8, 3), K(128, 64, 8, 2), K(128, 128, 8, 2), K(64, 64, 4, 3), K(128, 64, 4, 3),
         K(64, 128, 4, 3), K(128, 32, 8, 4), K(64, 32, 4, 4)],
    ),
    128: (
        [K(128, 64, 8, 3), K(128, 128, 8, 2), K(128, 64, 4, 3), K(64, 64, 4, 3), K(128, 32, 8, 4), K(64, 128, 4, 2),
         K(128, 64, 8, 2), K(64, 64, 4, 4)],
        [K(32, 128, 4, 3), K(32, 128, 8, 3), K(64, 128, 8, 2), K(32, 64, 4, 3), K(64, 64, 4, 3), K(16, 128, 8, 3),
         K(32, 128, 8, 2), K(64, 64, 8, 3), K(16, 64, 4, 4)],
        [K(128, 32, 4, 3), K(128, 32, 8, 3), K(64, 64, 4, 3), K(128, 64, 8, 2), K(64, 32, 4, 3), K(128, 64, 8, 3),
         K(64, 64, 8, 3), K(64, 32, 4, 4)],
    ),
}


def main() -> None:
    out_path = sys.argv[1]
    names = sys.argv[2:] or ["leaderboard"]
    results = {}
    for name in names:
        s = LEADERBOARD_SHAPES[name]
        q, k, v, do = (torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, device="cuda", dtype=torch.bfloat16)
                       for _ in range(4))
        base = pinned_config(q.device, max(16, s.head_dim), q.dtype)
        o, lse = flash_forward(q, k, v, True)
        rows = []

        def bench(kind, cfg, fn):
            try:
                ms = do_bench(fn, warmup=25, rep=150, return_mode="median")
            except Exception as err:  # out of shared memory / registers for this tile
                ms = None
                print(kind, cfg, "failed:", type(err).__name__, str(err)[:100], flush=True)
            rows.append({"kernel": kind, **cfg.__dict__, "ms": ms})
            print(name, kind, cfg, ms, flush=True)
            return ms

        FWD, DKDV, DQ = CANDIDATES[s.head_dim]
        for cfg in FWD:
            c = FlashConfig(cfg, base.dkdv, base.dq)
            bench("fwd", cfg, lambda c=c: flash_forward(q, k, v, True, config=c))
        for cfg in DKDV:
            c = FlashConfig(base.fwd, cfg, base.dq)
            bench("bwd(dkdv varies)", cfg, lambda c=c: flash_backward(q, k, v, o, lse, do, True, config=c))
        for cfg in DQ:
            c = FlashConfig(base.fwd, base.dkdv, cfg)
            bench("bwd(dq varies)", cfg, lambda c=c: flash_backward(q, k, v, o, lse, do, True, config=c))
        results[name] = rows
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    for name, rows in results.items():
        for kind in ("fwd", "bwd(dkdv varies)", "bwd(dq varies)"):
            ok = [r for r in rows if r["kernel"] == kind and r["ms"] is not None]
            best = min(ok, key=lambda r: r["ms"]) if ok else None
            print(f"BEST {name} {kind}: {best}")


if __name__ == "__main__":
    main()
