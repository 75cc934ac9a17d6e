"""Check and time the Gluon (Hopper) backward kernel on an H100: numerics of every variant against an fp64
reference, our Triton backward and PyTorch SDPA; then the middle kernel alone against the Triton
``_flash_bwd_dkdv_kernel`` (atomic dQ, the config table's ``bwd`` tiles).

    python scripts/device/gluon_bwd_check.py [--dtype bf16|fp16] [--quick] [--only NAME ...] [--rounds N]
        [--time-shapes I ...] [--no-triton]

Pass rule per gradient: max |ours - fp64| <= 2 x max |SDPA - fp64| (SDPA in the same dtype) + the dtype's rounding
step at the gradient's magnitude. Prints tables; writes ``$OUT/gluon_bwd_check.json`` when ``OUT`` is set. Exit code
1 if any variant fails the rule or produces NaN/Inf.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.testing

from cs336_systems.attention import _tuning
from cs336_systems.attention import flash_hopper_bwd as hb
from cs336_systems.attention import flash_triton as ft

# (batch, query heads, key/value heads, Nq, Nk, head dim, causal)
CHECK_SHAPES = [
    (1, 2, 2, 1, 1, 64, True),
    (1, 2, 2, 77, 33, 64, True),  # Nq > Nk, causal top-left
    (1, 2, 2, 100, 300, 128, True),  # Nq < Nk: keys past Nq are seen by nobody
    (1, 2, 2, 1000, 1000, 64, False),
    (2, 3, 3, 257, 513, 128, False),
    (1, 4, 4, 4096, 4096, 64, True),
    (4, 25, 25, 2048, 2048, 64, True),
    (1, 16, 16, 4096, 4096, 128, True),
    (2, 8, 2, 1024, 1024, 128, True),  # grouped-query heads
    (2, 8, 4, 1000, 1000, 64, True),
]
QUICK = [*CHECK_SHAPES[:5], CHECK_SHAPES[8]]
TIME_SHAPES = [
    (2, 32, 32, 32768, 32768, 128, True),
    (1, 16, 16, 16384, 16384, 64, True),
    (4, 25, 25, 2048, 2048, 64, True),
    (1, 16, 16, 4096, 4096, 128, True),
    (8, 16, 16, 2048, 2048, 128, False),
    (2, 32, 8, 8192, 8192, 128, True),  # grouped-query heads (issue 21's shape)
    (4, 16, 16, 4096, 4096, 128, False),
    (16, 16, 16, 1024, 1024, 128, False),
]


def reference_grads(q, k, v, do, causal):
    """fp64 autograd of plain attention (k, v repeated to the query heads); top-left causal."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk, vv = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    s = q64 @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    (torch.softmax(s, -1) @ vv).backward(do.double())
    return q64.grad, k64.grad, v64.grad


def sdpa_grads(q, k, v, do, causal):
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=ks.shape[1] != qs.shape[1])
    o.backward(do)
    return qs.grad, ks.grad, vs.grad


def rounding_step(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """Twice the dtype's rounding error at the reference's magnitude, plus the fp32 noise of dS = P (dP - D)
    (about 4 d fp32 epsilons where the exact gradient is 0)."""
    step = ((ref + 0.3 - 0.3).to(dtype).double() - ref).abs().max().item()
    return 2 * step + max(1e-6, 4 * ref.shape[-1] * torch.finfo(torch.float32).eps)


def check(shapes, variants, dtype, rows, failures):
    for b, hq, hkv, n_q, n_k, d, causal in shapes:
        torch.manual_seed(hash((b, hq, n_q, n_k, d)) & 0xFFFF)
        q = torch.randn(b, hq, n_q, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hkv, n_k, d, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        ref = reference_grads(q, k, v, do, causal)
        peer = sdpa_grads(q, k, v, do, causal)
        o, lse = ft.flash_forward(q, k, v, causal)
        tri = ft.flash_backward(q, k, v, o, lse, do, causal)
        shape = f"{b}x{hq}/{hkv}x{n_q}x{n_k}x{d}{' causal' if causal else ''}"
        for var in variants:
            if var.head_dim != d:
                continue
            ours = hb.run_backward(q, k, v, o, lse, do, causal, var)
            torch.cuda.synchronize()
            row = dict(shape=shape, variant=var.name(), dtype=str(dtype).removeprefix("torch."))
            ok = True
            for name, g, r, p, t in zip(("dQ", "dK", "dV"), ours, ref, peer, tri, strict=True):
                err = (g.double() - r).abs().max().item()
                bound = 2 * (p.double() - r).abs().max().item() + rounding_step(r, dtype)
                finite = bool(torch.isfinite(g).all())
                row[name] = dict(err=err, bound=bound, sdpa=(p.double() - r).abs().max().item(),
                                 triton=(t.double() - r).abs().max().item(),
                                 vs_triton=(g.double() - t.double()).abs().max().item(), finite=finite)
                ok &= finite and err <= bound
            row["ok"] = ok
            rows.append(row)
            if not ok:
                failures.append(f"{shape} {var.name()}")
            errs = " ".join(f"{n}={row[n]['err']:.2e}/{row[n]['bound']:.2e}(tri {row[n]['triton']:.2e})"
                            for n in ("dQ", "dK", "dV"))
            print(f"{shape:<32} {var.name():<26} {errs}{'' if ok else '  FAIL'}", flush=True)


def backward_flops(b, hq, n_q, n_k, d, causal):
    """Five matmuls of 2 Nq Nk d each per head; causal halves the pairs (square)."""
    return 5 * 2 * b * hq * n_q * n_k * d * (0.5 if causal else 1.0)


def triton_middle(d, n_q, dtype, causal):
    cfg = _tuning.config_for(torch.device("cuda"), n_q, d, dtype).bwd
    constexprs = dict(HEAD_DIM=d, D_PAD=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, LIMIT_LEFT=0,
                      LIMIT_RIGHT=1 if causal else 0, HAS_DOCS=False, EVEN_D=True, TMA=cfg.tma, ATOMIC_DQ=True,
                      INPUT_PRECISION="tf32", INTERPRET=False)
    return (ft._flash_bwd_dkdv_kernel, constexprs, cfg.num_warps, cfg.num_stages), cfg.short()


def bench(shapes, variants, dtype, rows, rounds=1, triton_base=True):
    """Each shape's middle kernel (plus the preprocess) per variant, and the Triton kernel first as the base unless
    ``triton_base`` is off (then the first variant is): ``rounds`` interleaved rounds of ``do_bench``, the order
    rotated each round, median of the rounds (so a variant and its base see the same drift of the GPU's clocks)."""
    print(f"\n{'shape':<30} {'kernel':<34} {'ms':>8} {'TFLOP/s':>8} {'vs base':>9}")
    for b, hq, hkv, n_q, n_k, d, causal in shapes:
        q = torch.randn(b, hq, n_q, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hkv, n_k, d, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        o, lse = ft.flash_forward(q, k, v, causal)
        flops = backward_flops(b, hq, n_q, n_k, d, causal)
        shape = f"{b}x{hq}{f'/{hkv}' if hkv != hq else ''}x{n_q}x{d}{' causal' if causal else ''}"
        timed = [(var.name(), None, var) for var in variants if var.head_dim == d]
        if triton_base:
            middle, name = triton_middle(d, n_q, dtype, causal)
            timed.insert(0, (f"triton {name}", middle, None))
        calls = []
        for _label, mid_kernel, var in timed:
            (pre, mid, _post), _ = hb.backward_launches(q, k, v, o, lse, do, causal, var, middle=mid_kernel)
            pre()
            mid()  # compile
            # the preprocess too: it zeroes the dQ accumulator and the persistent kernel's work counter
            calls.append(lambda pre=pre, mid=mid: (pre(), mid()))
        times = [[] for _ in timed]
        for r in range(rounds):
            for i in [(j + r) % len(timed) for j in range(len(timed))]:
                times[i].append(triton.testing.do_bench(calls[i], warmup=25, rep=max(20, 200 // rounds)))
        base = None
        for (label, _m, _v), ts in zip(timed, times, strict=True):
            ms = sorted(ts)[len(ts) // 2]
            base = base or ms
            rows.append(dict(shape=shape, kernel=label, ms=ms, rounds=ts, tflops=flops / ms * 1e-9, vs_base=base / ms))
            print(f"{shape:<30} {label:<34} {ms:8.3f} {flops / ms * 1e-9:8.1f} {base / ms:8.3f}x", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--quick", action="store_true", help="the small check shapes only, no timing")
    p.add_argument("--only", nargs="+", default=None, help="variants by name (Variant.name())")
    p.add_argument("--no-bench", action="store_true")
    p.add_argument("--rounds", type=int, default=1, help="interleaved timing rounds per shape (median)")
    p.add_argument("--time-shapes", nargs="+", type=int, default=None, metavar="I",
                   help="indices into TIME_SHAPES (default: all)")
    p.add_argument("--no-triton", action="store_true", help="time the variants only, the first as the base")
    args = p.parse_args()
    if torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU (H100 / H200)", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    variants = [v for v in hb.VARIANTS if args.only is None or v.name() in args.only]
    if not variants:
        raise SystemExit(f"no variant {args.only!r}; have {[v.name() for v in hb.VARIANTS]}")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "dtype": args.dtype, "check": [], "bench": []}
    failures: list[str] = []
    try:
        check(QUICK if args.quick else CHECK_SHAPES, variants, dtype, out["check"], failures)
        if not (args.quick or args.no_bench):
            shapes = TIME_SHAPES if args.time_shapes is None else [TIME_SHAPES[i] for i in args.time_shapes]
            bench(shapes, variants, dtype, out["bench"], args.rounds, not args.no_triton)
    finally:
        out["failures"] = failures
        if os.environ.get("OUT"):
            path = os.path.join(os.environ["OUT"], "gluon_bwd_check.json")
            with open(path, "w") as f:
                json.dump(out, f, indent=1)
            print(f"wrote {path}")
    print(f"\n{len(failures)} failing: {failures}" if failures else "\nall variants within the 2x-SDPA rule")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
