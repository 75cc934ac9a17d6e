"""Backward of the FlashAttention-2 kernels at head dim 128, by mode and tiles (issue 18/21 experiment).

For each shape (bf16, causal; the window and grouped-query shapes of issue 21, and issue 18's d128_4k),
times ``flash_backward`` (D, dK/dV, dQ; no autograd) with ``triton.testing.do_bench`` medians: the atomic
five-matmul backward and the deterministic seven-matmul one, each with a few dK/dV (and dQ) tiles, and
SDPA cuDNN's backward beside them. Prints one line per candidate; any candidate that fails is reported.

    python scripts/device/flash_bwd_probe.py [--rep-ms 200]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from cs336_systems.attention import _tuning
from cs336_systems.attention._tuning import FlashConfig
from cs336_systems.attention._tuning import KernelConfig as K
from cs336_systems.attention.flash_triton import flash_backward, flash_forward

SHAPES = {  # name: (batch, q heads, kv heads, seq, window)
    "d128_4k": (1, 16, 16, 4096, None),
    "window": (1, 16, 16, 32768, (4096, 0)),
    "gqa": (2, 32, 8, 8192, None),
}
ATOMIC = [(64, 128, 8, 2), (64, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (32, 128, 4, 2)]
DETERMINISTIC = [((64, 128, 8, 3), (128, 64, 8, 3)), ((64, 128, 8, 2), (128, 128, 8, 2)),
                 ((64, 128, 8, 3), (64, 64, 4, 3))]


def probe(name: str, b: int, hq: int, hkv: int, n: int, window, rep_ms: float) -> None:
    q = torch.randn(b, hq, n, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    base = _tuning.config_for(q.device, n, 128, torch.bfloat16)
    o, lse = flash_forward(q, k, v, True, window=window)
    ref = flash_backward(q, k, v, o, lse, do, True, window=window)

    def timed(label: str, cfg: FlashConfig, deterministic: bool) -> None:
        def run():
            return flash_backward(q, k, v, o, lse, do, True, cfg, deterministic=deterministic, window=window)

        try:
            err = max(((a.float() - r.float()).norm() / r.float().norm()).item() for a, r in zip(run(), ref))
            ms = do_bench(run, warmup=25, rep=rep_ms, return_mode="median")
            print(f"{name:8s} {label:48s} {ms:8.3f} ms  rel err vs default {err:.1e}", flush=True)
        except Exception as exc:  # a candidate that fails to compile or run is reported, the rest go on
            print(f"{name:8s} {label:48s} failed: {type(exc).__name__}: {str(exc)[:100]}", flush=True)

    for t in ATOMIC:
        timed(f"atomic dkdv {t}", FlashConfig(base.fwd, K(*t, tma=True), base.dkdv, base.dq), False)
    for dkdv, dq in DETERMINISTIC:
        timed(f"deterministic dkdv {dkdv} dq {dq}",
              FlashConfig(base.fwd, base.bwd, K(*dkdv, tma=True), K(*dq, tma=True)), True)
    if window is None:
        qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=hq != hkv)
            ms = do_bench(lambda: out.backward(do, retain_graph=True), warmup=25, rep=rep_ms,
                          grad_to_none=[qs, ks, vs], return_mode="median")
        print(f"{name:8s} {'sdpa cudnn backward':48s} {ms:8.3f} ms", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rep-ms", type=float, default=200.0)
    args = p.parse_args()
    for name, shape in SHAPES.items():
        probe(name, *shape, args.rep_ms)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
