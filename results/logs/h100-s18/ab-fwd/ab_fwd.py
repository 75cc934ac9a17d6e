"""Scratch A/B (session 18): the Gluon forward, a program per item vs persistent, through flash_forward."""
import dataclasses

import torch
import triton.testing

from cs336_systems.attention import _tuning
from cs336_systems.attention import flash_triton as ft

SHAPES = [(4, 25, 2048, True), (1, 16, 16384, True), (4, 25, 512, True), (8, 12, 512, True), (8, 16, 2048, False),
          (1, 1, 128, True)]


def main():
    torch.manual_seed(0)
    for b, h, n, causal in SHAPES:
        q, k, v = (torch.randn(b, h, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        base = _tuning.config_for(torch.device("cuda"), n, 64, torch.bfloat16)
        cfgs = {}
        for tiles in ((64, 64), (64, 128)):
            for p in (False, True):
                hf = dataclasses.replace(base.hopper_fwd, block_m=tiles[0], block_n=tiles[1], persistent=p)
                cfgs[f"{tiles[0]}x{tiles[1]}{'/p' if p else ''}"] = dataclasses.replace(base, hopper_fwd=hf)
        ref = {name: ft.flash_forward(q, k, v, causal, cfg) for name, cfg in cfgs.items()}
        times = {name: [] for name in cfgs}
        for _ in range(3):
            for name, cfg in cfgs.items():
                times[name].append(triton.testing.do_bench(lambda: ft.flash_forward(q, k, v, causal, cfg), warmup=25,
                                                           rep=150))
        same = {name: all(torch.equal(a, b) for a, b in zip(ft.flash_forward(q, k, v, causal, cfg), ref[name]))
                for name, cfg in cfgs.items()}
        eq = {t: torch.equal(ref[t + "/p"][0], ref[t][0]) for t in ("64x64", "64x128")}
        best = {name: min(t) for name, t in times.items()}
        print(f"{b}x{h}x{n}{' causal' if causal else ''}: "
              + " ".join(f"{name} {best[name]:.4f}" for name in cfgs)
              + f"; p/item 64x64 {best['64x64/p'] / best['64x64']:.3f} 64x128 {best['64x128/p'] / best['64x128']:.3f}"
              + f"; repeat-equal {same}; persistent==per-item {eq}", flush=True)


if __name__ == "__main__":
    main()
