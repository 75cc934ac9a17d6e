"""Probe (issue 19): the fused SwiGLU GEMMs (``cs336_systems.fused.swiglu_gemm``) against cuBLAS plus the compiled
elementwise pass, at the model's feed-forward shapes.

- forward: ``cublas`` (x W1^T and x W3^T by cuBLAS, then silu(a) * b compiled: what ``--ffn torch`` runs),
  ``cublas-mm-only`` (the two products alone, as one GEMM against [W1; W3]: what a fused kernel has to approach),
  ``gluon <config>`` (the dual GEMM writing h, a and b);
- backward: ``cublas-bwd`` (dh = dy W2, then da and db compiled), ``cublas-bwd-mm-only``, ``bwd gluon <config>``.

Configurations are (BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M[, consumer registers]). Timed with
``triton.testing.do_bench`` (L2 flushed, medians); each output is checked against an fp32 reference with the 2x rule
(our error at most twice the cuBLAS path's, plus one bf16 rounding of the reference's magnitude). Variants measured
and dropped (Triton kernels, software-pipelined Gluon, stores from registers): ``experiments/swiglu_gemm_epilogues/``.

    python scripts/device/swiglu_dual_gemm_probe.py [--shapes xl_2048 xl_512] [--rounds N] [--out DIR]
    ncu --kernel-name regex:'swiglu|nvjet' --section SpeedOfLight --section WarpStateStats \\
        python scripts/device/swiglu_dual_gemm_probe.py --ncu --shapes xl_2048
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import triton

from cs336_systems.bench.flash import _interleaved
from cs336_systems.fused import swiglu_gemm
from cs336_systems.fused.swiglu import _gate_backward_reference, _gate_reference

SHAPES = {"xl_2048": (8192, 1600, 6400), "xl_512": (2048, 1600, 6400), "small_512": (2048, 768, 3072)}  # M, K, N
# (config, keyword arguments): the shipped configuration first
FWD_CONFIGS = ((swiglu_gemm.FWD_CONFIG, {}),)
BWD_CONFIGS = ((swiglu_gemm.BWD_CONFIG, {}), ((128, 128, 64, 4, 8), {}), ((128, 128, 64, 5, 16), {}))


def _errors(got: torch.Tensor, ref: torch.Tensor, base: torch.Tensor) -> tuple[float, float, bool]:
    err, base_err = (got.float() - ref).abs().max().item(), (base.float() - ref).abs().max().item()
    return err, base_err, err <= 2 * base_err + ref.abs().max().item() * 2**-8


def _inputs(name: str):
    m, k, n = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w13 = torch.randn(2 * n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
    dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w2 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / n**0.5
    return x, w13, w13[:n], w13[n:], dy, w2


def _launch(fn, cfg, kw):
    return lambda *args: fn(*args, config=cfg[:5], regs=cfg[5] if len(cfg) > 5 else swiglu_gemm.CONSUMER_REGS, **kw)


def _label(cfg, kw) -> str:
    return "x".join(map(str, cfg)) + "".join(f" {k}={v}" for k, v in kw.items())


def time_shape(name: str, do_bench, rounds: int = 1) -> list[dict]:
    """Each variant at one shape: median ms (of ``rounds`` interleaved rounds), TFLOP/s of its products, error
    against the fp32 reference."""
    m, k, n = SHAPES[name]
    x, w13, w1, w3, dy, w2 = _inputs(name)
    elementwise = torch.compile(lambda a, b: torch.nn.functional.silu(a) * b)
    bwd_elementwise = torch.compile(lambda dh, a, b: _gate_backward_reference_from_dh(dh, a, b))
    a, b = x @ w1.T, x @ w3.T
    a32, b32 = x.float() @ w1.float().T, x.float() @ w3.float().T
    sig = torch.sigmoid(a.float())
    dh32 = dy.float() @ w2.float()
    checks = {"fwd": (torch.nn.functional.silu(a32) * b32, _gate_reference(x, w1, w3)[0]),
              "bwd": (dh32 * b.float() * sig * (1 + a.float() * (1 - sig)), _gate_backward_reference(dy, w2, a, b)[0])}
    variants = [("cublas", "fwd", lambda: elementwise(x @ w1.T, x @ w3.T)),
                ("cublas-mm-only", None, lambda: x @ w13.T)]
    variants += [(f"gluon {_label(c, kw)}", "fwd",
                  lambda c=c, kw=kw: _launch(swiglu_gemm.dual_swiglu, c, kw)(x, w1, w3)[0]) for c, kw in FWD_CONFIGS]
    variants += [("cublas-bwd", "bwd", lambda: bwd_elementwise(dy @ w2, a, b)[0]),
                 ("cublas-bwd-mm-only", None, lambda: dy @ w2)]
    variants += [(f"bwd gluon {_label(c, kw)}", "bwd",
                  lambda c=c, kw=kw: _launch(swiglu_gemm.swiglu_backward, c, kw)(dy, w2, a, b)[0])
                 for c, kw in BWD_CONFIGS]
    shipped = {"fwd": swiglu_gemm.dual_swiglu(x, w1, w3), "bwd": swiglu_gemm.swiglu_backward(dy, w2, a, b)}
    full = {f"gluon {_label(c, kw)}": lambda c=c, kw=kw: _launch(swiglu_gemm.dual_swiglu, c, kw)(x, w1, w3)
            for c, kw in FWD_CONFIGS}
    full.update({f"bwd gluon {_label(c, kw)}": lambda c=c, kw=kw: _launch(swiglu_gemm.swiglu_backward, c, kw)(
        dy, w2, a, b) for c, kw in BWD_CONFIGS})
    rows, live = [], {}
    for label, check, fn in variants:
        try:
            out = fn()
            err, base_err, ok = (float("nan"), float("nan"), True) if check is None else _errors(out, *checks[check])
            # every output (h, a, b or da, db) bit for bit the shipped kernel's: the variants change schedules only
            same = all(torch.equal(u, v) for u, v in zip(full[label](), shipped[check])) if label in full else None
        except Exception as e:  # a configuration that does not fit (shared memory, registers)
            print(f"{name:<9} {label:<28} {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
            continue
        live[label] = fn
        rows.append(dict(shape=name, variant=label, err=err, base_err=base_err, ok=ok and same is not False,
                         same=same, rounds=[]))
    by_label = {row["variant"]: row for row in rows}
    for _r, label in _interleaved(live, rounds):  # the order rotated each round: every variant sees the same drift
        by_label[label]["rounds"].append(do_bench(live[label], warmup=50, rep=max(60, 300 // rounds),
                                                  return_mode="median"))
    for row in rows:
        label, ms = row["variant"], statistics.median(row["rounds"])
        flops = (2 if "bwd" in label else 4) * m * n * k  # the forward's two products, the backward's one
        row.update(ms=ms, tflops=flops / ms / 1e9)
        same = row["same"]
        print(f"{name:<9} {label:<36} {ms:.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s  err {row['err']:.2e} "
              f"(cuBLAS path {row['base_err']:.2e}) {'ok' if row['ok'] else 'FAIL'}"
              f"{'' if same is None else f' same={same}'}", flush=True)
    return rows


def _gate_backward_reference_from_dh(dh: torch.Tensor, a: torch.Tensor, b: torch.Tensor):
    """da, db from a stored dh, as the compiled unfused backward computes them."""
    dh, af, bf = dh.float(), a.float(), b.float()
    sig = torch.sigmoid(af)
    return (dh * bf * sig * (1 + af * (1 - sig))).to(a.dtype), (dh * af * sig).to(b.dtype)


def ncu_calls(name: str) -> None:
    """Two calls of each kernel at one shape, for ``ncu``."""
    x, w13, w1, w3, dy, w2 = _inputs(name)
    a, b = x @ w1.T, x @ w3.T
    torch.cuda.synchronize()
    for label, fn in (("cublas packed", lambda: x @ w13.T), ("cublas dh", lambda: dy @ w2),
                      ("gluon", lambda: swiglu_gemm.dual_swiglu(x, w1, w3)),
                      ("gluon bwd", lambda: swiglu_gemm.swiglu_backward(dy, w2, a, b))):
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        print(label, "done", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["xl_2048", "xl_512"], choices=list(SHAPES))
    p.add_argument("--ncu", action="store_true", help="two calls of each kernel at the first shape, for ncu")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--rounds", type=int, default=1, help="timing rounds, the order rotated by one each round; medians")
    args = p.parse_args()
    if args.ncu:
        ncu_calls(args.shapes[0])
        return
    from triton.testing import do_bench

    rows = [row for name in args.shapes for row in time_shape(name, do_bench, args.rounds)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "swiglu_dual_gemm.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
