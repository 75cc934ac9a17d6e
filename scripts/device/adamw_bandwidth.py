"""Memory bandwidth of the fused AdamW step at a preset's parameter shapes (issue 19: a quarter of the xl step).

For each (elements per program, warps, master layout) of ``cs336_systems.fused.adamw``'s multi-tensor kernel:
the median time of ``FusedAdamW.step`` over the preset's parameters with bf16 copies of fp32 masters (what
``bench --optimizer fused`` under bf16 runs: 26 bytes per Linear weight with split masters, the default, 28 with
whole ones; 24 per other parameter), the bandwidth that makes, and ``torch.optim.AdamW(fused=True)`` on fp32
parameters and gradients (the peer's, 28 bytes each) for reference.

    python scripts/device/adamw_bandwidth.py --preset xl [--split yes no]
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

import cs336_systems.fused.adamw as fa
from cs336_basics.model import BasicsTransformerLM
from cs336_systems.configs import get_preset


def bench_step(opt, params) -> float:
    for p in params:
        p.grad = torch.randn_like(p)
    return triton.testing.do_bench(opt.step, warmup=5, rep=200, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="xl")
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--split", nargs="+", default=["yes"], choices=("yes", "no"),
                        help="FusedAdamW's split_masters (yes: bf16 copy + int16 low halves; no: whole fp32)")
    args = parser.parse_args()
    kwargs = get_preset(args.preset).model_kwargs()
    model = BasicsTransformerLM(**kwargs, device="cuda")
    low = fa.low_precision_params(model)
    n_low = sum(p.numel() for p in low)
    n_all = sum(p.numel() for p in model.parameters())
    print(f"{args.preset}: {n_all / 1e9:.3f} B parameters ({n_low / 1e9:.3f} B with bf16 copies)")
    masters = {p: p.detach().clone() for p in model.parameters()}
    for split, block, warps in itertools.product(args.split, args.blocks, args.warps):
        fa._BLOCK, fa._NUM_WARPS, fa._NUM_WARPS_SPLIT = block, warps, warps
        fa._SPLIT_BY_GPU = {}  # the swept tile, not this GPU's entry of the table
        moved = (26 if split == "yes" else 28) * n_low + 24 * (n_all - n_low)
        for p in model.parameters():
            p.data = masters[p].clone()
        opt = fa.FusedAdamW(model.parameters(), lr=1e-4, compute_dtype=torch.bfloat16, low_precision=low,
                            split_masters=split == "yes")
        ms = bench_step(opt, list(model.parameters()))
        print(f"  fused split {split:3s} block {block:6d} warps {warps:2d}: {ms:7.2f} ms, {moved / 1e9:5.1f} GB, "
              f"{moved / ms / 1e9:6.2f} TB/s", flush=True)
        del opt
        torch.cuda.empty_cache()
    for p in model.parameters():
        p.data = masters[p].clone()
    params = list(model.parameters())
    torch_opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    ms = bench_step(torch_opt, params)
    print(f"  torch fused AdamW (fp32): {ms:7.2f} ms, {28 * n_all / ms / 1e9:6.2f} TB/s")


if __name__ == "__main__":
    main()
