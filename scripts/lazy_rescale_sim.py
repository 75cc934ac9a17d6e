"""What a lazy rescale threshold costs in accuracy and saves in work, simulated on the CPU.

    python scripts/lazy_rescale_sim.py [--n 2048] [--d 64] [--block-n 64] [--full] [--thresholds 1 2 4 8] [--seed 0]

The forwards' online softmax, tile by tile in fp32 as the kernels run it (64-key tiles as the one-warpgroup forward's,
128 as the warp-specialised one's, ``--block-n``; causal unless ``--full``; P
rounded to bf16 for P V, l summed from the unrounded P, O rounded to bf16 at the end), with the running maximum
moved every tile (``exact``) or only where the row's maximum passes it by more than a threshold in log2 units
(``flash_hopper._softmax_tile``'s LAZY). Prints, per input kind, O's largest error against an fp64 reference beside
SDPA's own (bf16, the same rounded inputs) and the share of (16-row warp, key tile) pairs where some row's alpha is
not 1, i.e. where ``_rescale_lazy`` still multiplies. Inputs: ``randn`` (q x 2), ``growing`` (key norms rising
along the sequence, row maxima jumping) and ``sharp`` (keys x 2.5, peaked rows).
"""

from __future__ import annotations

import argparse
import math

import torch

LOG2E = 1.4426950408889634


def simulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, threshold: float | None, block_n: int = 64,
             warp_rows: int = 16, causal: bool = True) -> tuple[torch.Tensor, float]:
    """Attention of one head through the kernel's online softmax; returns O (bf16) and the share of (warp, key
    tile) pairs after the first tile whose warp still rescales O."""
    n, d = q.shape
    qk = LOG2E / math.sqrt(d)
    scores = q @ k.T
    rows = torch.arange(n)
    m = torch.full((n,), float("-inf"))
    row_sum, acc = torch.zeros(n), torch.zeros(n, d)
    taken = total = 0
    for j in range(0, n, block_n):
        s = scores[:, j:j + block_n]
        if causal:
            s = s.masked_fill(torch.arange(j, min(j + block_n, n))[None, :] > rows[:, None], float("-inf"))
        m_row = s.max(1).values * qk
        m_new = torch.maximum(m, m_row) if threshold is None else torch.where(m_row > m + threshold, m_row, m)
        p = torch.nan_to_num(torch.exp2(s * qk - m_new[:, None]))  # rows that see no key of this tile: 0
        alpha = torch.nan_to_num(torch.exp2(m - m_new), nan=1.0)
        if j > 0:
            for r0 in range(0, n - warp_rows + 1, warp_rows):
                if not causal or r0 + warp_rows - 1 >= j:  # the warp's query tile reaches this key tile
                    total += 1
                    taken += bool((alpha[r0:r0 + warp_rows] != 1).any())
        acc = acc * alpha[:, None] + p.to(torch.bfloat16).float() @ v[j:j + block_n]
        row_sum = row_sum * alpha + p.sum(1)
        m = m_new
    return (acc / row_sum[:, None]).to(torch.bfloat16), taken / max(total, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--block-n", type=int, default=64, help="keys a tile (the warp-specialised forward's: 128)")
    p.add_argument("--full", action="store_true", help="no causal mask")
    p.add_argument("--thresholds", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.n < 64 or args.d < 1 or args.block_n < 1 or any(t <= 0 for t in args.thresholds):
        p.error("--n at least 64, --d and --block-n at least 1, thresholds positive")
    torch.manual_seed(args.seed)
    n, d = args.n, args.d
    mask = torch.ones(n, n, dtype=torch.bool).triu(1) if not args.full else torch.zeros(n, n, dtype=torch.bool)
    for kind in ("randn", "growing", "sharp"):
        q, k, v = torch.randn(n, d) * (2.0 if kind != "sharp" else 1.0), torch.randn(n, d), torch.randn(n, d)
        if kind == "growing":
            k = k * torch.linspace(0.05, 4.0, n)[:, None]
        if kind == "sharp":
            k = k * 2.5
        q, k, v = (t.to(torch.bfloat16).float() for t in (q, k, v))
        ref = torch.softmax((q.double() @ k.double().T / math.sqrt(d)).masked_fill(mask, float("-inf")), -1) \
            @ v.double()
        sdpa = torch.nn.functional.scaled_dot_product_attention(*(t[None].to(torch.bfloat16) for t in (q, k, v)),
                                                                is_causal=not args.full)[0]
        peer = (sdpa.double() - ref).abs().max().item()
        cells = [f"{kind}: SDPA {peer:.4f}"]
        for t in [None, *args.thresholds]:
            o, share = simulate(q, k, v, t, args.block_n, causal=not args.full)
            err = (o.double() - ref).abs().max().item()
            cells.append(f"{'exact' if t is None else f'T={t:g}'} {err:.4f} ({err / peer:.2f}x SDPA, "
                         f"rescaled {share:.2f})")
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
