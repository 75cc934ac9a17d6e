"""Check and time the Gluon forward (``flash_hopper``) on an sm_90 GPU against the Triton forward and SDPA.

    python scripts/device/hopper_fwd_check.py [--out DIR] [--skip-sweep] [--variants] [--shapes NAME ...]

1. Numerics: O and L of ``flash_forward`` (which takes the Gluon kernel on sm_90 where its scope allows; the
   script fails if it did not; ``--variants``: with each tile variant too) against an fp64 reference, odd shapes
   included; the rule is our error at most
   twice SDPA's own error in the same dtype plus one bf16 ulp of the output's scale.
2. Tiles: forward medians (``triton.testing.do_bench``) of each Gluon tile variant, the Triton forward and
   SDPA cuDNN / flash on the model shapes of ``flash-bench``, one process, same inputs. Writes
   ``hopper_fwd.json`` under ``--out`` (or ``$OUT``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton

from cs336_systems.attention import _tuning
from cs336_systems.attention import flash_triton as ft
from cs336_systems.bench.flash import MODEL_SHAPES

K = _tuning.KernelConfig
VARIANTS = {  # (block_m, block_n, warps, stages, tma, warp_specialize, persistent)
    64: [K(64, 64, 4, 3, True, False, True), K(64, 128, 4, 3, True, False, True), K(128, 128, 4, 2, True, True),
         K(128, 128, 4, 3, True, True), K(128, 128, 4, 2, True, True, True), K(128, 128, 4, 3, True, True, True),
         K(128, 128, 4, 4, True, True, True), K(128, 64, 4, 4, True, True, True)],
    128: [K(128, 128, 4, 2, True, True), K(128, 128, 4, 2, True, True, True), K(128, 64, 4, 3, True, True, True)],
}


def reference(q, k, v, causal, group):
    """fp64 attention and logsumexp (top-left causal)."""
    q, k, v = (t.double() for t in (q, k, v))
    if group > 1:
        k, v = (t.repeat_interleave(group, dim=-3) for t in (k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def check_numerics(variants: bool = False) -> list[dict]:
    """The default config's forward on every case; ``variants``: each of ``VARIANTS`` too (at its head dim)."""
    cases = [  # (batch, q heads, kv heads, n_q, n_k, d, causal, non-contiguous)
        (1, 2, 2, 1000, 1000, 64, True, False), (2, 3, 3, 257, 513, 128, False, False),
        (1, 4, 4, 4096, 4096, 64, True, False), (2, 8, 2, 1024, 1024, 128, True, False),
        (1, 2, 2, 300, 200, 64, True, False), (1, 2, 2, 200, 300, 128, True, False),
        (1, 1, 1, 1, 1, 64, True, False), (1, 1, 1, 128, 128, 64, True, False),
        (2, 4, 4, 777, 777, 64, True, True), (1, 2, 2, 65, 4000, 128, False, True),
        # more query tiles than SMs (the persistent kernels' items), grouped heads
        (4, 25, 25, 1000, 1000, 64, True, False), (2, 16, 4, 1500, 1500, 128, True, False),
        (3, 16, 16, 1100, 1100, 128, False, True),
    ]
    rows = []
    for b, hq, hkv, n_q, n_k, d, causal, strided in cases:
        configs = [None] + (VARIANTS[d] if variants else [])
        for dtype, tile in [(dt, tile) for dt in (torch.bfloat16, torch.float16) for tile in configs]:
            g = torch.Generator(device="cuda").manual_seed(n_q * 7 + n_k + d)
            if strided:  # (b, n, h, d) storage viewed as (b, h, n, d)
                q = torch.randn(b, n_q, hq, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
                k = torch.randn(b, n_k, hkv, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
                v = torch.randn(b, n_k, hkv, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
            else:
                q = torch.randn(b, hq, n_q, d, device="cuda", dtype=dtype, generator=g)
                k = torch.randn(b, hkv, n_k, d, device="cuda", dtype=dtype, generator=g)
                v = torch.randn(b, hkv, n_k, d, device="cuda", dtype=dtype, generator=g)
            q = q * 3  # larger logits than unit variance: exercises the running max
            left, right = ft.normalize_window(None, causal, n_q, n_k)
            cfg = None
            if tile is not None:
                cfg = dataclasses.replace(_tuning.config_for(q.device, n_q, d, dtype), hopper_fwd=tile)
            plan = ft._plan_forward(q, k, v, cfg, left, right, False)
            used = plan[0].kernel.__name__.removesuffix("_kernel")  # _hopper_fwd, _hopper_fwd_ws, ..._persistent
            o, lse = ft.flash_forward(q, k, v, is_causal=causal, config=cfg)
            ref_o, ref_l = reference(q, k, v, causal, hq // hkv)
            kk, vv = (k, v) if hq == hkv else (t.repeat_interleave(hq // hkv, dim=-3) for t in (k, v))
            mask = None
            if causal:
                mask = torch.ones(n_q, n_k, dtype=torch.bool, device="cuda").tril()
            peer = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
            err = (o.double() - ref_o).abs().max().item()
            peer_err = (peer.double() - ref_o).abs().max().item()
            ulp = ref_o.abs().max().item() * torch.finfo(dtype).eps
            lse_err = (lse.double() - ref_l).abs().max().item()
            ok = used.startswith("_hopper_fwd") and err <= 2 * peer_err + ulp and lse_err <= 1e-3 * max(
                1.0, ref_l.abs().max().item()) and not o.isnan().any().item()
            rows.append(dict(case=f"{b}x{hq}/{hkv}x{n_q}x{n_k}x{d}{' causal' if causal else ''}"
                             f"{' strided' if strided else ''}", dtype=str(dtype).removeprefix("torch."),
                             tile=tile.short() if tile else "default", kernel=used, err=err, sdpa_err=peer_err,
                             lse_err=lse_err, ok=ok))
            print(f"{rows[-1]['case']:<36} {rows[-1]['dtype']:<9} {rows[-1]['tile']:<22} {used:<30} err {err:.2e} "
                  f"sdpa {peer_err:.2e} lse {lse_err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return rows


def time_shape(name: str) -> list[dict]:
    """Forward medians of every implementation at one model shape, same inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s = MODEL_SHAPES[name]
    q, k, v = (torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    base = _tuning.config_for(q.device, s.seq_len, s.head_dim, q.dtype)

    def ours(hopper):
        cfg = dataclasses.replace(base, hopper_fwd=hopper)
        return lambda: ft.flash_forward(q, k, v, s.causal, cfg)

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=s.causal)
        return run

    fns = {f"gluon {c.short()}": ours(c) for c in VARIANTS[s.head_dim]}
    fns["triton"] = ours(None)
    fns["sdpa_cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    fns["sdpa_flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
    times = {}
    for impl, fn in fns.items():
        try:
            times[impl] = triton.testing.do_bench(fn, warmup=25, rep=100)
        except Exception as e:  # a variant that does not fit is recorded, not fatal
            times[impl] = None
            print(f"{name} {impl}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    best_peer = min(t for i, t in times.items() if i.startswith("sdpa") and t)
    print(f"{name}: " + "  ".join(f"{i} {t:.4f}" if t else f"{i} -" for i, t in times.items()), flush=True)
    return [dict(shape=name, impl=i, ms=t, vs_best_sdpa=t / best_peer if t else None) for i, t in times.items()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--variants", action="store_true", help="check the numerics of every tile variant too")
    p.add_argument("--shapes", nargs="*", default=list(MODEL_SHAPES))
    args = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    out["numerics"] = check_numerics(args.variants)
    if not args.skip_sweep:
        out["sweep"] = [row for name in args.shapes for row in time_shape(name)]
    with open(os.path.join(args.out, "hopper_fwd.json"), "w") as f:
        json.dump(out, f, indent=1)
    if not all(r["ok"] for r in out["numerics"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
