"""What a lazy rescale threshold costs in accuracy and saves in work, simulated on the CPU.

    python scripts/lazy_rescale_sim.py [--n 2048] [--d 64] [--block-n 64] [--full] [--thresholds 1 2 4 8] [--seed 0]
        [--draws 1]

The forwards' online softmax, tile by tile in fp32 as the kernels run it (64-key tiles as the one-warpgroup forward's,
128 as the warp-specialised one's, ``--block-n``; causal unless ``--full``; P
rounded to bf16 for P V, l summed from the unrounded P, O rounded to bf16 at the end), with the running maximum
moved every tile (``exact``) or only where the row's maximum passes it by more than a threshold in log2 units
(``flash_hopper._softmax_tile``'s LAZY), O's denominator plain (``T=4``) or compensated for the rounding of each
tile's largest P as the kernels do (``T=4c``). Prints, per input kind, O's largest error against an fp64 reference
over SDPA's own (bf16, the same rounded inputs), the largest ratio of ``--draws`` fresh draws, and the share of
(16-row warp, key tile) pairs where some row's alpha is not 1, i.e. where ``_rescale_lazy`` still multiplies.
Inputs: ``randn`` (q x 2), ``growing`` (key norms rising along the sequence, row maxima jumping) and ``sharp``
(keys x 2.5, peaked rows). Session 45, ``--draws 40``: at ``--n 777`` (64-key tiles, causal) the exact form 1.02-1.29x,
T=4 1.61-1.91x, T=4c 1.02-1.35x, T=8 1.86-2.29x, T=8c 1.10-1.35x; at ``--n 1000 --d 128 --block-n 128 --full``
the exact form 1.00-1.33x, T=4 1.53-2.12x, T=4c 1.17-1.37x. ``--rounded-sum`` at ``--n 777``: O 1.12-1.35x in every
form, but L's error 1.3e-3 to 3.5e-3 against 1.5e-6 to 5.1e-6 with l from the unrounded P.
"""

from __future__ import annotations

import argparse
import math

import torch

LOG2E = 1.4426950408889634


def simulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, threshold: float | None, block_n: int = 64,
             warp_rows: int = 16, causal: bool = True, compensate: bool = False,
             rounded_sum: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Attention of one head through the kernel's online softmax; returns O (bf16), L (natural log) and the share
    of (warp, key tile) pairs after the first tile whose warp still rescales O. ``compensate``: O's denominator
    l + c, c the rounding of each tile's largest P (rescaled like l). ``rounded_sum``: l summed from the 16-bit P
    that P V multiplies (what a row sum by the tensor cores, P times a column of ones, would give), for O and L."""
    n, d = q.shape
    qk = LOG2E / math.sqrt(d)
    scores = q @ k.T
    rows = torch.arange(n)
    m = torch.full((n,), float("-inf"))
    row_sum, comp, acc = torch.zeros(n), torch.zeros(n), torch.zeros(n, d)
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
        row_sum = row_sum * alpha + (p.to(torch.bfloat16).float() if rounded_sum else p).sum(1)
        p_max = torch.nan_to_num(torch.exp2(m_row - m_new))
        comp = comp * alpha + (p_max.to(torch.bfloat16).float() - p_max)
        m = m_new
    den = row_sum + comp if compensate else row_sum
    lse = (m + torch.log2(row_sum)) / LOG2E
    return (acc / den[:, None]).to(torch.bfloat16), lse, taken / max(total, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--block-n", type=int, default=64, help="keys a tile (the warp-specialised forward's: 128)")
    p.add_argument("--full", action="store_true", help="no causal mask")
    p.add_argument("--thresholds", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draws", type=int, default=1, help="fresh inputs per kind; the largest ratio is printed")
    p.add_argument("--rounded-sum", action="store_true",
                   help="also l summed from the 16-bit P (the exact form and each threshold): forms 'r'")
    args = p.parse_args()
    if args.n < 64 or args.d < 1 or args.block_n < 1 or args.draws < 1 or any(t <= 0 for t in args.thresholds):
        p.error("--n at least 64, --d, --block-n and --draws at least 1, thresholds positive")
    torch.manual_seed(args.seed)
    n, d = args.n, args.d
    mask = torch.ones(n, n, dtype=torch.bool).triu(1) if not args.full else torch.zeros(n, n, dtype=torch.bool)
    forms = [(None, False, False)] + [(t, c, False) for t in args.thresholds for c in (False, True)]
    if args.rounded_sum:
        forms += [(None, False, True)] + [(t, False, True) for t in args.thresholds]
    for kind in ("randn", "growing", "sharp"):
        worst = [0.0] * len(forms)
        worst_lse = [0.0] * len(forms)
        shares = [0.0] * len(forms)
        for _ in range(args.draws):
            q, k, v = torch.randn(n, d) * (2.0 if kind != "sharp" else 1.0), torch.randn(n, d), torch.randn(n, d)
            if kind == "growing":
                k = k * torch.linspace(0.05, 4.0, n)[:, None]
            if kind == "sharp":
                k = k * 2.5
            q, k, v = (t.to(torch.bfloat16).float() for t in (q, k, v))
            logits = (q.double() @ k.double().T / math.sqrt(d)).masked_fill(mask, float("-inf"))
            ref, ref_lse = torch.softmax(logits, -1) @ v.double(), torch.logsumexp(logits, -1)
            sdpa = torch.nn.functional.scaled_dot_product_attention(*(t[None].to(torch.bfloat16) for t in (q, k, v)),
                                                                    is_causal=not args.full)[0]
            peer = (sdpa.double() - ref).abs().max().item()
            for i, (t, c, r) in enumerate(forms):
                o, lse, share = simulate(q, k, v, t, args.block_n, causal=not args.full, compensate=c, rounded_sum=r)
                worst[i] = max(worst[i], (o.double() - ref).abs().max().item() / peer)
                worst_lse[i] = max(worst_lse[i], (lse.double() - ref_lse).abs().max().item())
                shares[i] += share / args.draws
        cells = [f"{'exact' if t is None else f'T={t:g}'}{'c' if c else ''}{'r' if r else ''} {w:.2f}x SDPA, "
                 f"L {e:.1e} (rescaled {sh:.2f})" for (t, c, r), w, e, sh in zip(forms, worst, worst_lse, shares)]
        print(f"{kind}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
