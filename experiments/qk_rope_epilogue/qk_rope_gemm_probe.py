# Moved from scripts/device/ in session 30 with the kernel it times: see README.md here.
"""Probe (issue 19, the next epilogue candidate): RoPE in the epilogue of a dual GEMM that computes q and k.

In a warpgroup MMA's accumulator each thread holds pairs of adjacent columns, so rotating q's and k's (even, odd)
pairs by their position's angle is local to a thread: the dual GEMM of ``cs336_systems.fused.swiglu_gemm`` (one x
tile for both products) with a rotating epilogue would replace q = x Wq^T, k = x Wk^T by cuBLAS and RoPE's kernel
(``cs336_systems.fused.rope``), which reads and writes q and k once more. This times, at xl/2048's projections
(8,192 x 1,600 against 1,600 columns, head dim 64, positions 0..2047 per sequence):

- ``cublas+rope``: the two GEMMs and the Triton RoPE kernel on each (what the model runs with ``--rope triton``);
- ``cublas``: the two GEMMs alone;
- ``gluon-rope``: the warp-specialised dual GEMM with the rotation in its epilogue.

Timed as CUDA graphs (``triton.testing.do_bench_cudagraph``, medians), as the captured training step runs them:
with ``do_bench`` the RoPE kernels' host path dominates. Each output is checked against an fp32 reference with the
2x rule. Run on an H100 from the repository root:
``python experiments/qk_rope_epilogue/qk_rope_gemm_probe.py [--out DIR]`` (the kernel is ``qk_rope_gemm.py`` here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

from cs336_basics.model import RotaryEmbedding
from cs336_systems.fused import rope as fused_rope

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qk_rope_gemm import qk_rope as _qk_rope  # the kernel beside this script


def qk_rope(x, wq, wk, cos, sin, seq):
    """The kernel with row r at position r % seq."""
    return _qk_rope(x, wq, wk, cos[:seq].contiguous(), sin[:seq].contiguous())


def _rotate_ref(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: int, seq: int, dim: int):
    v = v.double().view(batch, seq, -1, dim)
    c, s = cos[:seq, None].double(), sin[:seq, None].double()
    even, odd = v[..., 0::2], v[..., 1::2]
    return torch.stack((even * c - odd * s, even * s + odd * c), -1).flatten(-2).view(batch * seq, -1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    from triton.testing import do_bench_cudagraph  # the RoPE kernels are ~20 us: time them without the host

    batch, seq, d, dim = 4, 2048, 1600, 64
    torch.manual_seed(0)
    x = torch.randn(batch * seq, d, device="cuda", dtype=torch.bfloat16)
    wq, wk = (torch.randn(d, d, device="cuda", dtype=torch.bfloat16) / d**0.5 for _ in range(2))
    rope = RotaryEmbedding(seq, dim, device="cuda")
    cos, sin = rope.cos.contiguous(), rope.sin.contiguous()
    cos_t, sin_t = cos[:seq, None], sin[:seq, None]  # (T, 1, dim/2) against (B, T, H, dim)

    def unfused():
        q, k = x @ wq.T, x @ wk.T
        return (fused_rope.rotate(q.view(batch, seq, -1, dim), cos_t, sin_t).view(batch * seq, d),
                fused_rope.rotate(k.view(batch, seq, -1, dim), cos_t, sin_t).view(batch * seq, d))

    refs = [_rotate_ref(x.float() @ w.float().T, cos, sin, batch, seq, dim) for w in (wq, wk)]
    base = unfused()
    rows = []
    for label, fn, check in (("cublas+rope", unfused, True), ("cublas", lambda: (x @ wq.T, x @ wk.T), False),
                             ("gluon-rope", lambda: qk_rope(x, wq, wk, cos, sin, seq), True)):
        try:
            out = fn()
            errs = []
            if check:
                for got, b, ref in zip(out, base, refs, strict=True):
                    err, base_err = (got.double() - ref).abs().max().item(), (b.double() - ref).abs().max().item()
                    errs.append((err, base_err, err <= 2 * base_err + ref.abs().max().item() * 2**-8))
            ms = do_bench_cudagraph(fn, rep=300, return_mode="median")
        except Exception as e:  # a compile or resource failure of the Gluon kernel
            print(f"{label:<12} {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        ok = all(e[2] for e in errs)
        rows.append(dict(variant=label, ms=ms, errors=errs, ok=ok))
        print(f"{label:<12} {ms:.4f} ms  errors {[f'{e[0]:.2e}/{e[1]:.2e}' for e in errs]} {'ok' if ok else 'FAIL'}",
              flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "qk_rope_gemm.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
