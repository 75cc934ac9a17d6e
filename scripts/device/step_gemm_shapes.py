"""Every cuBLAS GEMM shape of one transformer block's training step, timed alone (issue 19).

The captured xl/2048 step spends about 145 ms in cuBLAS (docs/training_step.md, session 25). This times each shape
the block runs, in the operand layouts the step gives cuBLAS (``y = x W^T``; ``dx = dy W``; ``dW = dy^T x``), with
``triton.testing.do_bench`` (medians), and prints TFLOP/s beside the best shape's: a shape far below it (a tile grid
that fills the GPU's SMs badly, say) is where a different split could pay. Run with the step's cuBLAS setting
(``CUBLAS_WORKSPACE_CONFIG=:0:0``, bench's CUDA default) to see the algorithms the step gets.

    CUBLAS_WORKSPACE_CONFIG=:0:0 python scripts/device/step_gemm_shapes.py [--preset xl --context-length 2048] \
        [--variants]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from triton.testing import do_bench

from cs336_systems.configs import get_preset


def shapes(tokens: int, d: int, d_ff: int, vocab: int) -> list[tuple[str, int, int, int, str, int]]:
    """(name, M, N, K, layout, calls a block) for y (M, N) = A (M, K) B (K, N); layout: how A and B are stored
    ('nt': y = x W^T with W (N, K); 'nn': dx = dy W; 'tn': dW = dy^T x)."""
    return [
        ("q/k/v/o forward", tokens, d, d, "nt", 4),
        ("q/k/v/o dx", tokens, d, d, "nn", 4),
        ("q/k/v/o dW", d, d, tokens, "tn", 4),
        ("w1/w3 forward (unfused)", tokens, d_ff, d, "nt", 2),
        ("w2 forward", tokens, d, d_ff, "nt", 1),
        ("w1/w3 dx", tokens, d, d_ff, "nn", 2),
        ("w2 dh (unfused)", tokens, d_ff, d, "nn", 1),
        ("w1/w3 dW", d_ff, d, tokens, "tn", 2),
        ("w2 dW", d, d_ff, tokens, "tn", 1),
        ("lm head forward (per step)", tokens, vocab, d, "nt", 0),
        ("lm head dx (per step)", tokens, d, vocab, "nn", 0),
        ("lm head dW (per step)", vocab, d, tokens, "tn", 0),
    ]


def operands(m: int, n: int, k: int, layout: str):
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    if layout == "nt":
        return torch.randn(m, k, **bf16), torch.randn(n, k, **bf16).T
    if layout == "nn":
        return torch.randn(m, k, **bf16), torch.randn(k, n, **bf16)
    return torch.randn(k, m, **bf16).T, torch.randn(k, n, **bf16)  # tn: dW = dy^T x


def variants(tokens: int, d: int, d_ff: int) -> list[tuple[str, int, int, int, object]]:
    """Other ways to run the 1,600-column products (``--variants``): the transposed problem (cuBLAS picks tiles by
    the output's shape), the three q/k/v weight gradients as one batched product (243 tiles of 192 x 192 against 81
    each), the packed q/k/v products (one 4,800-wide operand), and the input gradients in the forward's NT layout
    against transposed weight copies (with the copies' own time). (name, M, N, K, a function of no arguments) with
    2 M N K the FLOPs."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, dy, w = torch.randn(tokens, d, **bf16), torch.randn(tokens, d, **bf16), torch.randn(d, d, **bf16)
    g3 = torch.randn(3, tokens, d, **bf16)  # dq, dk, dv in one buffer, head-major
    gp = torch.randn(tokens, 3 * d, **bf16)  # token-major: [dq dk dv] a row
    w3 = torch.randn(3 * d, d, **bf16)
    # the input gradients as the forward's layout (y = x W^T: "NT") against a transposed copy of W, made per step
    wt = w.T.contiguous()
    g, w1 = torch.randn(tokens, d_ff, **bf16), torch.randn(d_ff, d, **bf16)
    w1t, acc = w1.T.contiguous(), torch.randn(tokens, d, **bf16)
    # the feed-forward's da and db side by side (as halves of one buffer) against W1 and W3 stacked
    gab, w13 = torch.randn(tokens, 2 * d_ff, **bf16), torch.randn(2 * d_ff, d, **bf16)
    ga, gb, w1v, w3v = gab[:, :d_ff], gab[:, d_ff:], w13[:d_ff], w13[d_ff:]
    return [
        ("w1/w3 dx pair, second accumulated", tokens, d, 2 * d_ff, lambda: (ga @ w1v).addmm_(gb, w3v)),
        ("w1/w3 dx packed (K = 2 d_ff)", tokens, d, 2 * d_ff, lambda: gab @ w13),
        ("w1/w3 dx packed, transposed", tokens, d, 2 * d_ff, lambda: (w13.T @ gab.T).T),
        ("w1/w3 dx, transposed", tokens, d, d_ff, lambda: (w1.T @ g.T).T),
        ("w1/w3 dW pair", 2 * d_ff, d, tokens, lambda: (ga.T @ x, gb.T @ x)),
        ("w1/w3 dW packed", 2 * d_ff, d, tokens, lambda: gab.T @ x),
        ("q/k/v/o dx as NT (W^T copy)", tokens, d, d, lambda: dy @ wt.T),
        ("transpose of a q/k/v/o weight", d, d, 1, lambda: w.T.contiguous()),
        ("w1/w3 dx", tokens, d, d_ff, lambda: g @ w1),
        ("w1/w3 dx as NT (W^T copy)", tokens, d, d_ff, lambda: g @ w1t.T),
        ("w1/w3 dx accumulated", tokens, d, d_ff, lambda: acc.addmm_(g, w1)),
        ("w1/w3 dx accumulated as NT", tokens, d, d_ff, lambda: acc.addmm_(g, w1t.T)),
        ("transpose of w1", d_ff, d, 1, lambda: w1.T.contiguous()),
        ("q/k/v/o forward, transposed", tokens, d, d, lambda: (w @ x.T).T),
        ("q/k/v/o dx, transposed", tokens, d, d, lambda: (w.T @ dy.T).T),
        ("q/k/v/o dW, transposed", d, d, tokens, lambda: (x.T @ dy).T),
        ("q/k/v dW x3 as bmm", 3 * d, d, tokens, lambda: torch.bmm(g3.mT, x.expand(3, tokens, d))),
        ("q/k/v dW x3 as bmm, transposed", 3 * d, d, tokens, lambda: torch.bmm(x.T.expand(3, d, tokens), g3)),
        ("q/k/v forward packed", tokens, 3 * d, d, lambda: x @ w3.T),
        ("q/k/v dx packed", tokens, d, 3 * d, lambda: gp @ w3),
        ("q/k/v dW packed", 3 * d, d, tokens, lambda: gp.T @ x),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="xl")
    p.add_argument("--context-length", type=int, default=2048)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--variants", action="store_true", help="also time other forms of the 1,600-column products")
    args = p.parse_args()
    cfg = get_preset(args.preset)
    tokens = cfg.batch_size * args.context_length
    rows = []
    for name, m, n, k, layout, calls in shapes(tokens, cfg.d_model, cfg.d_ff, cfg.vocab_size):
        a, b = operands(m, n, k, layout)
        ms = do_bench(lambda a=a, b=b: a @ b, warmup=50, rep=300, return_mode="median")
        tflops = 2 * m * n * k / ms / 1e9
        rows.append(dict(name=name, m=m, n=n, k=k, layout=layout, calls_a_block=calls, ms=ms, tflops=tflops))
    if args.variants:
        for name, m, n, k, fn in variants(tokens, cfg.d_model, cfg.d_ff):
            ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
            rows.append(dict(name=name, m=m, n=n, k=k, layout="variant", calls_a_block=0, ms=ms,
                             tflops=2 * m * n * k / ms / 1e9))
    best = max(r["tflops"] for r in rows)
    layers = cfg.num_layers
    for r in rows:
        per_step = r["ms"] * (r["calls_a_block"] * layers or 1)
        lost = per_step * (1 - r["tflops"] / best)
        print(f"{r['name']:<28} {r['m']:>6} x {r['n']:>6} x {r['k']:>6} {r['layout']}  {r['ms']:.4f} ms  "
              f"{r['tflops']:6.1f} TFLOP/s  {per_step:7.2f} ms a step  ({lost:5.2f} ms below the best shape's rate)",
              flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", ""), "cublas_workspace_config":
            os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""), "preset": args.preset, "context_length": args.context_length}
    with open(os.path.join(args.out, "step_gemm_shapes.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
