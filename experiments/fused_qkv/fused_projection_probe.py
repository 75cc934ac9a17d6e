"""Would one matmul for q/k/v (and one for w1/w3) beat separate ones at our models' shapes? (issue 19)

Times, with CUDA graphs (``triton.testing.do_bench_cudagraph``, so the host does not set the pace), the matmuls of
a block's input projections in bf16, forward and backward, as autograd runs them:
  separate: y_i = x W_i^T (n mm); dx = sum_i g_i W_i (n mm, n - 1 adds); dW_i = g_i^T x (n mm)
  fused:    W = cat(W_i) (a copy per step); y = x W^T; dx = g W; dW = g^T x (3 mm)
  fused, no cat: the same with the weights already adjacent (what bf16 copies laid out side by side would allow)
Prints a table and ratios; writes nothing.
    python experiments/fused_qkv/fused_projection_probe.py
"""

import torch
from triton.testing import do_bench_cudagraph

SHAPES = [  # name, tokens (batch x context), d_model, output widths of the fused projections
    ("xl/2048 qkv", 4 * 2048, 1600, [1600, 1600, 1600]),
    ("xl/2048 w1w3", 4 * 2048, 1600, [6400, 6400]),
    ("xl/512 qkv", 4 * 512, 1600, [1600, 1600, 1600]),
    ("xl/512 w1w3", 4 * 512, 1600, [6400, 6400]),
    ("small/512 qkv", 4 * 512, 768, [768, 768, 768]),
    ("small/512 w1w3", 4 * 512, 768, [3072, 3072]),
]


def time_shape(m: int, d: int, outs: list[int]) -> tuple[float, float, float]:
    """(separate, fused with the weight cat, fused without it) in ms."""
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(m, d, device=dev, dtype=dt)
    ws = [torch.randn(n, d, device=dev, dtype=dt) * d**-0.5 for n in outs]
    gs = [torch.randn(m, n, device=dev, dtype=dt) for n in outs]
    w_cat, g_cat = torch.cat(ws), torch.cat(gs, dim=1)

    def separate():
        ys = [x @ w.t() for w in ws]
        dx = gs[0] @ ws[0]
        for g, w in zip(gs[1:], ws[1:]):
            dx = dx + g @ w
        return ys, dx, [g.t() @ x for g in gs]

    def fused(cat: bool):
        w = torch.cat(ws) if cat else w_cat
        return x @ w.t(), g_cat @ w, g_cat.t() @ x

    return (do_bench_cudagraph(separate, rep=200), do_bench_cudagraph(lambda: fused(True), rep=200),
            do_bench_cudagraph(lambda: fused(False), rep=200))


def main() -> None:
    print(f"{'shape':16s} {'separate':>9s} {'fused':>9s} {'no cat':>9s}  fused/sep  nocat/sep  (ms, fwd+bwd)")
    for name, m, d, outs in SHAPES:
        t_sep, t_fused, t_nocat = time_shape(m, d, outs)
        print(f"{name:16s} {t_sep:9.4f} {t_fused:9.4f} {t_nocat:9.4f}  {t_fused / t_sep:9.3f}  {t_nocat / t_sep:9.3f}")


if __name__ == "__main__":
    main()
