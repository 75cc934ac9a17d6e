"""The fused feed-forward's Gluon GEMMs and cuBLAS GEMMs of the same sizes at one model shape, a few calls each, for
``ncu`` to profile (session 32: L2 traffic, the forward's epilogue, the release barriers and the MMA count all
turned out not to set their speed; docs/training_step.md):

    ncu --kernel-name regex:'swiglu|nvjet' --launch-skip 2 --launch-count 16 --section SpeedOfLight \\
        --section WarpStateStats --section ComputeWorkloadAnalysis python3 scripts/device/ncu_swiglu.py

Ours: the dual forward (h, a, b from x, W1, W3) and the backward (da, db from dy, W2, a, b). cuBLAS: a = x W1^T (one
of the forward's two products) and dh = dy W2 (the backward's product without its epilogue).
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.fused import swiglu_gemm

SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400)}  # M, K (d_model), N (d_ff)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="xl_2048", choices=list(SHAPES))
    p.add_argument("--calls", type=int, default=4)
    args = p.parse_args()
    m, k, n = SHAPES[args.shape]
    bf16 = torch.bfloat16
    x, dy = torch.randn(m, k, device="cuda", dtype=bf16), torch.randn(m, k, device="cuda", dtype=bf16)
    w1, w3 = (torch.randn(n, k, device="cuda", dtype=bf16) / k**0.5 for _ in range(2))
    w2 = torch.randn(k, n, device="cuda", dtype=bf16) / n**0.5
    a, b = x @ w1.T, x @ w3.T
    for name, fn in (("gluon forward", lambda: swiglu_gemm.dual_swiglu(x, w1, w3)),
                     ("cublas x W1^T", lambda: x @ w1.T),
                     ("gluon backward", lambda: swiglu_gemm.swiglu_backward(dy, w2, a, b)),
                     ("cublas dy W2", lambda: dy @ w2)):
        for _ in range(args.calls):
            fn()
        torch.cuda.synchronize()
        print(name, "done", flush=True)


if __name__ == "__main__":
    main()
