# ruff: noqa: B023  (each closure is timed at once, inside its loop iteration)
"""Tile sweep of the FlashAttention-2 Triton kernels on the GPU; pins the winners in the config table.

    python scripts/device/flash_tune.py --out tune.json --pin cs336_systems/attention/flash_tune_h100.json \
        [--shapes lb2025 d128_4k ...] [--kernels fwd bwd dkdv dq] [--budget-s 240]

For each shape (``cs336_systems.bench.flash.MODEL_SHAPES``, bf16) and kernel, times each candidate with
``triton.testing.do_bench`` (the other kernels at the table's choice). A candidate's outputs must agree
with the table config's (relative Frobenius error < 2e-2: bf16 outputs, other summation orders); one that
fails to compile, errs or disagrees is logged and skipped. The winners are pinned per (kernel, head dim,
dtype, query-length bucket), and the first shape of each head dim also sets that head dim's default.
Writes ``--out`` (every measurement) and ``--pin`` after each shape, so an interrupted run keeps what it
measured and the later steps of the same device call use the new table.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from cs336_systems.attention import _tuning
from cs336_systems.attention._tuning import KernelConfig as K
from cs336_systems.attention.flash_triton import flash_backward, flash_forward
from cs336_systems.bench.flash import MODEL_SHAPES

CANDIDATES = {  # (block_m, block_n, num_warps, num_stages), all TMA; by padded head dim
    64: {
        "fwd": [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 64, 8, 2), (64, 64, 4, 4)],
        "bwd": [(64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2), (64, 32, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3),
                (128, 128, 8, 2), (32, 128, 4, 3)],
        "dkdv": [(64, 64, 4, 3), (64, 128, 8, 2), (32, 128, 4, 3)],
        "dq": [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2)],
    },
    128: {
        "fwd": [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 8, 2), (64, 128, 4, 2)],
        "bwd": [(64, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 3), (32, 64, 4, 4), (64, 64, 4, 3), (32, 128, 8, 2),
                (64, 64, 4, 2)],
        "dkdv": [(64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 2)],
        "dq": [(128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 8, 2)],
    },
}


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def tune_shape(name: str, kernels: list[str], deadline: float, log: list[dict]) -> dict[str, K]:
    s = MODEL_SHAPES[name]
    dtype = torch.bfloat16
    q, k, v, do = (torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, device="cuda", dtype=dtype) for _ in range(4))
    d_pad = max(16, triton.next_power_of_2(s.head_dim))
    table = _tuning.config_for(q.device, s.seq_len, d_pad, dtype)
    o, lse = flash_forward(q, k, v, s.causal, config=table)
    ref = {"fwd": (o,), "bwd": flash_backward(q, k, v, o, lse, do, s.causal, config=table)}
    ref["dkdv"] = ref["dq"] = ref["bwd"]
    winners = {}
    for kernel in kernels:
        base = getattr(table, kernel)
        cands = [base] + [c for c in (K(*t, tma=True) for t in CANDIDATES[d_pad][kernel]) if c != base]
        best, best_ms = base, float("inf")
        for cand in cands:
            if time.monotonic() > deadline:
                print(f"{name} {kernel}: time budget spent, remaining candidates skipped", flush=True)
                break
            cfg = replace(table, **{kernel: cand})
            det = kernel in ("dkdv", "dq")
            if kernel == "fwd":
                def run():
                    return flash_forward(q, k, v, s.causal, config=cfg)[:1]
            else:
                def run():
                    return flash_backward(q, k, v, o, lse, do, s.causal, config=cfg, deterministic=det)
            row = {"shape": name, "kernel": kernel, "config": asdict(cand), "short": cand.short()}
            try:
                err = max(_rel_err(a, b) for a, b in zip(run(), ref[kernel]))
                if not err < 2e-2:
                    row.update(status=f"disagrees (rel err {err:.3g})")
                else:
                    ms = do_bench(run, warmup=10, rep=40, return_mode="median")
                    row.update(status="ok", ms=ms, rel_err=err)
                    if ms < best_ms:
                        best, best_ms = cand, ms
            except Exception as err:  # a tile that does not fit (OutOfResources), a compile failure
                row.update(status=f"error: {type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}")
            log.append(row)
            print(f"{name:14s} {kernel:5s} {cand.short():22s} {row.get('ms', float('nan')):9.4f} ms  {row['status']}",
                  flush=True)
        winners[kernel] = best
        print(f"{name:14s} {kernel:5s} WINNER {best.short()} {best_ms:.4f} ms", flush=True)
    return winners


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--pin", default=None)
    p.add_argument("--shapes", nargs="+", default=["lb2025", "d128_4k", "xl_2048", "xl_512", "noncausal_2k"],
                   choices=list(MODEL_SHAPES))
    p.add_argument("--kernels", nargs="+", default=["fwd", "bwd"], choices=list(_tuning.KERNELS))
    p.add_argument("--budget-s", type=float, default=240.0)
    args = p.parse_args()
    deadline = time.monotonic() + args.budget_s
    pin_path = Path(args.pin) if args.pin else None
    pinned = json.loads(pin_path.read_text()) if pin_path and pin_path.exists() else {"configs": {}}
    pinned.update(capability=list(torch.cuda.get_device_capability()), device=torch.cuda.get_device_name(),
                  torch=torch.__version__, triton=triton.__version__, source="scripts/device/flash_tune.py",
                  created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    log: list[dict] = []
    seen_d: set[int] = set()
    for name in args.shapes:
        s = MODEL_SHAPES[name]
        winners = tune_shape(name, args.kernels, deadline, log)
        d_pad = max(16, triton.next_power_of_2(s.head_dim))
        for kernel, cfg in winners.items():
            pinned["configs"][_tuning.pinned_key(kernel, d_pad, torch.bfloat16, s.seq_len)] = asdict(cfg)
            if d_pad not in seen_d:
                pinned["configs"][_tuning.pinned_key(kernel, d_pad, torch.bfloat16)] = asdict(cfg)
        seen_d.add(d_pad)
        Path(args.out).write_text(json.dumps(log, indent=1))
        if pin_path:
            pin_path.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
            _tuning.clear_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
