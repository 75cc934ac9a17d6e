"""Do a block's backward matmuls gain from running on parallel CUDA streams? (issue 19)

At xl/2048 (8,192 tokens, d 1600, d_ff 6400) the weight gradients of q, k, v and the output projection are
1600 x 1600 outputs (K = 8,192): 81 tiles of cuBLAS's 192 x 192 kernel for 132 SMs, so each runs one partial
wave. The weight and input gradients of a linear layer (and those of q, k, v, or w1 and w3, among themselves)
are independent, so they can share the GPU. For each group of a block's projections this times, in CUDA graphs
(``triton.testing.do_bench_cudagraph``), the backward matmuls as autograd runs them (one stream) against the
weight gradients on side streams beside the input gradient, and prints each matmul alone with its TFLOP/s.

    python scripts/device/gemm_concurrency_probe.py [--tokens 8192 --d-model 1600 --d-ff 6400 --layers 48]
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench_cudagraph


def groups(m: int, d: int, f: int) -> dict[str, tuple[int, list[int]]]:
    """name -> (input width, output widths of the projections that share that input)."""
    return {"qkv": (d, [d, d, d]), "o": (d, [d]), "w1w3": (d, [f, f]), "w2": (f, [d])}


def run_group(m: int, d_in: int, outs: list[int], streams: list[torch.cuda.Stream]):
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(m, d_in, device=dev, dtype=dt)
    ws = [torch.randn(n, d_in, device=dev, dtype=dt) * d_in**-0.5 for n in outs]
    gs = [torch.randn(m, n, device=dev, dtype=dt) for n in outs]

    def input_grad():
        dx = gs[0] @ ws[0]
        for g, w in zip(gs[1:], ws[1:]):
            dx = torch.addmm(dx, g, w)
        return dx

    def serial():
        return input_grad(), [g.t() @ x for g in gs]

    def parallel(n_side: int):
        main = torch.cuda.current_stream()
        side = streams[:n_side]
        for s in side:
            s.wait_stream(main)
        dws = []
        for i, g in enumerate(gs):
            with torch.cuda.stream(side[i % n_side]):
                dws.append(g.t() @ x)
        dx = input_grad()
        for s in side:
            main.wait_stream(s)
        return dx, dws

    rows = {"serial": do_bench_cudagraph(serial, rep=300)}
    for n in sorted({1, len(gs)}):
        rows[f"parallel{n}"] = do_bench_cudagraph(lambda n=n: parallel(n), rep=300)
    singles = {
        f"dW {outs[0]}x{d_in} K{m}": (do_bench_cudagraph(lambda: gs[0].t() @ x, rep=300), 2 * m * d_in * outs[0]),
        f"dX {m}x{d_in} K{outs[0]}": (do_bench_cudagraph(lambda: gs[0] @ ws[0], rep=300), 2 * m * d_in * outs[0]),
        f"Y {m}x{outs[0]} K{d_in}": (do_bench_cudagraph(lambda: x @ ws[0].t(), rep=300), 2 * m * d_in * outs[0]),
    }
    return rows, singles


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=1600)
    p.add_argument("--d-ff", type=int, default=6400)
    p.add_argument("--layers", type=int, default=48)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, f"tokens {a.tokens} d {a.d_model} d_ff {a.d_ff}")
    streams = [torch.cuda.Stream() for _ in range(3)]
    serial = best = 0.0
    for name, (d_in, outs) in groups(a.tokens, a.d_model, a.d_ff).items():
        rows, singles = run_group(a.tokens, d_in, outs, streams)
        base = rows["serial"]
        text = "  ".join(f"{k} {v * 1e3:7.1f} us ({v / base:.3f})" for k, v in rows.items())
        print(f"{name:5s} {text}")
        for k, (ms, flop) in singles.items():
            print(f"      {k:24s} {ms * 1e3:7.1f} us  {flop / ms / 1e9:6.0f} TFLOP/s")
        serial += base
        best += min(v for k, v in rows.items() if k != "serial")
    print(f"block backward matmuls: serial {serial * 1e3:.1f} us, best parallel {best * 1e3:.1f} us; "
          f"x{a.layers} layers: {(serial - best) * a.layers:.2f} ms a step less")


if __name__ == "__main__":
    main()
