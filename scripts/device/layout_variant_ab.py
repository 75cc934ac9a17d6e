"""A/B of the Gluon kernels' work order (``KernelConfig.interleave``) by layout of q, k, v, dO (issue 18, item 5).

Session 27's per-kernel profile (``flash_small_profile.py --layout model``) put the model layout's cost at xl_2048 in
the backward's middle kernel (0.381 -> 0.405 ms against (B, H, T, d) inputs; cuDNN's 0.376 -> 0.382). This times, per
shape and layout, ``flash_forward`` and ``flash_backward`` with each ``interleave`` of the persistent kernels (kernel
time under ``torch.profiler``, L2 flushed: ``bench.flash.kernel_ms``) beside SDPA cuDNN's forward+backward, and
checks each variant's outputs against an fp64 reference with the 2x-SDPA rule (where it fits in memory; else
against the first variant's).

    python scripts/device/layout_variant_ab.py [--shapes xl_2048 xl_512] [--layouts model bhtd] [--tiles] [--out DIR]

``--tiles`` also times the kernels in ``TILES`` (the planner's work order), after the default tiles' orders.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import _tuning
from cs336_systems.attention import flash_triton as ft
from cs336_systems.bench.flash import kernel_ms

SHAPES = {"xl_2048": (4, 25, 2048, 64, True), "xl_512": (4, 25, 512, 64, True), "small_512": (8, 12, 512, 64, True),
          "lb2025": (1, 16, 16384, 64, True), "d128_4k": (1, 16, 4096, 128, True),
          "noncausal_2k": (8, 16, 2048, 128, False), "d64_full_2k": (8, 16, 2048, 64, False)}
# per shape, the interleave values timed with the default tiles (session 27's first run, 39d980e, timed other tiles:
# none faster with either layout)
INTERLEAVE = {"xl_2048": (1, 25, 0), "xl_512": (1, 25, 100, 0), "small_512": (1, 96, 0), "lb2025": (1, 2, 0),
              "d128_4k": (1, 4, 0), "noncausal_2k": (1, 0), "d64_full_2k": (1, 16, 0)}  # 0: the planner's choice

_KC = _tuning.KernelConfig
# --tiles: other forward tiles (session 28: the warp-specialised 128 x 128 and the one-warpgroup 64 x 128 forward,
# persistent, with the grouped work order that session 27 gave the default one)
TILES = {"fwd": (_KC(128, 128, 4, 3, tma=True, warp_specialize=True, persistent=True),
                 _KC(64, 128, 4, 3, tma=True, persistent=True), _KC(64, 64, 4, 4, tma=True, persistent=True)),
         "bwd": ()}


def tensors(layout: str, b: int, h: int, n: int, d: int, g: torch.Generator):
    if layout == "model":
        return [torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
                for _ in range(4)]
    return [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)]


def reference(q, k, v, do, causal: bool):
    """fp64 O, dQ, dK, dV."""
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    n = q.shape[-2]
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ v64
    o.backward(do.double())
    return o.detach(), q64.grad, k64.grad, v64.grad


def sdpa_call(q, k, v, do, causal: bool, backward: bool):
    def run():
        qq, kk, vv = (t.detach().requires_grad_(backward) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        if backward:
            o.backward(do)
        return o, qq.grad, kk.grad, vv.grad
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["xl_2048", "xl_512"])
    p.add_argument("--layouts", nargs="*", default=["model", "bhtd"])
    p.add_argument("--tiles", action="store_true", help="also time the kernels in TILES")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    rows = []
    for name in args.shapes:
        b, h, n, d, causal = SHAPES[name]
        for layout in args.layouts:
            g = torch.Generator(device="cuda").manual_seed(n + d)
            q, k, v, do = tensors(layout, b, h, n, d, g)
            peer_out = sdpa_call(q, k, v, do, causal, True)()
            # the fp64 reference where it fits; else the first variant's outputs, to within bf16 rounding
            ref = reference(q, k, v, do, causal) if b * h * n * n <= 2**31 else None
            peer = [(x.double() - r).abs().max().item() for x, r in zip(peer_out, ref, strict=True)] if ref else None
            peer_ms = kernel_ms(sdpa_call(q, k, v, do, causal, True), q.device, [])
            peer_fwd_ms = kernel_ms(sdpa_call(q, k, v, do, causal, False), q.device, [])
            print(f"{name:<12} {layout:<6} sdpa_cudnn fwd+bwd kernels {peer_ms:.4f} ms, fwd {peer_fwd_ms:.4f} ms",
                  flush=True)
            base = _tuning.config_for(q.device, n, d, q.dtype)
            o_def, lse_def = ft.flash_forward(q, k, v, causal)
            for kind in ("fwd", "bwd"):
                first = None
                tile0 = getattr(base, f"hopper_{kind}")
                # the warp-specialised backward runs a program per item: no order to choose
                orders = [(tile0, o) for o in (INTERLEAVE[name] if tile0.persistent else (1,))]
                if args.tiles:
                    orders += [(t, 0) for t in TILES[kind] if t != tile0 and t.block_m <= n]
                for t0, order in orders:
                    tile = dataclasses.replace(t0, interleave=order)
                    cfg = dataclasses.replace(base, **{f"hopper_{kind}": tile})
                    fn = (functools.partial(ft.flash_forward, q, k, v, causal, cfg) if kind == "fwd" else
                          functools.partial(ft.flash_backward, q, k, v, o_def, lse_def, do, causal, cfg))
                    got = fn()[:1] if kind == "fwd" else fn()
                    if ref is not None:
                        want, peer_err = (ref[:1], peer[:1]) if kind == "fwd" else (ref[1:], peer[1:])
                        errs = [(x.double() - r).abs().max().item() for x, r in zip(got, want, strict=True)]
                        ok = all(e <= 2 * pe + r.abs().max().item() * 2**-8
                                 for e, pe, r in zip(errs, peer_err, want, strict=True))
                    else:
                        first = first or [x.clone() for x in got]
                        errs = [(x.float() - r.float()).abs().max().item() for x, r in zip(got, first, strict=True)]
                        ok = all(e <= r.abs().max().item() * 2**-7 for e, r in zip(errs, first, strict=True))
                    ms = kernel_ms(fn, q.device, [])
                    rows.append(dict(shape=name, layout=layout, kind=kind, tile=tile.short(), interleave=order,
                                     kernel_ms=ms, errors=errs, sdpa_errors=peer, ok=ok,
                                     sdpa_fwd_bwd_kernel_ms=peer_ms, sdpa_fwd_kernel_ms=peer_fwd_ms))
                    label = tile.short() + ("/auto" if not order else "")
                    print(f"{name:<12} {layout:<6} {kind} {label:<28} kernels {ms:.4f} ms  "
                          f"{'ok' if ok else 'FAIL'} err {' '.join(f'{e:.2e}' for e in errs)}", flush=True)
            del ref
            torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "layout_variant_ab.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
