"""A/B of the Gluon kernels' tiles with q, k, v and dO in the model's layout (issue 18, item 5).

Session 27's per-kernel profile (``flash_small_profile.py --layout model``) put the model layout's cost at xl_2048 in
the backward's middle kernel (0.381 -> 0.405 ms against (B, H, T, d) inputs; cuDNN's 0.376 -> 0.382). This times, per
shape and layout, ``flash_forward`` and ``flash_backward`` with each ``hopper_fwd`` / ``hopper_bwd`` variant (kernel
time under ``torch.profiler``, L2 flushed: ``bench.flash.kernel_ms``) beside SDPA cuDNN's forward+backward, and
checks each variant's outputs against an fp64 reference with the 2x-SDPA rule.

    python scripts/device/layout_variant_ab.py [--shapes xl_2048 xl_512] [--layouts model bhtd] [--out DIR]
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

K = _tuning.KernelConfig
SHAPES = {"xl_2048": (4, 25, 2048, 64), "xl_512": (4, 25, 512, 64), "small_512": (8, 12, 512, 64)}
# (tiles, constexprs the launch adds); session 27's first run (39d980e) timed more tiles, none faster with either layout
FWD = [(K(64, 64, 4, 3, True, persistent=True), {})]
_BWD = K(64, 64, 4, 2, True, persistent=True)
BWD = [(_BWD, {}), (_BWD, {"INTERLEAVE": 2}), (_BWD, {"INTERLEAVE": 5}), (_BWD, {"INTERLEAVE": 25}),
       (K(64, 64, 4, 3, True, persistent=True), {"INTERLEAVE": 5})]


def tensors(layout: str, b: int, h: int, n: int, d: int, g: torch.Generator):
    if layout == "model":
        return [torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
                for _ in range(4)]
    return [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)]


def reference(q, k, v, do):
    """fp64 O, dQ, dK, dV (causal)."""
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    n = q.shape[-2]
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ v64
    o.backward(do.double())
    return o.detach(), q64.grad, k64.grad, v64.grad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["xl_2048", "xl_512"])
    p.add_argument("--layouts", nargs="*", default=["model", "bhtd"])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    rows = []
    for name in args.shapes:
        b, h, n, d = SHAPES[name]
        for layout in args.layouts:
            g = torch.Generator(device="cuda").manual_seed(n + d)
            q, k, v, do = tensors(layout, b, h, n, d, g)
            ref = reference(q, k, v, do)
            qs, ks, vs = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o_sdpa = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            o_sdpa.backward(do)
            peer = [(x.double() - r).abs().max().item() for x, r in zip((o_sdpa, qs.grad, ks.grad, vs.grad), ref,
                                                                        strict=True)]

            def cudnn(q=q, k=k, v=v, do=do):
                qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(do)

            def cudnn_fwd(q=q, k=k, v=v):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            peer_ms = kernel_ms(cudnn, q.device, [])
            peer_fwd_ms = kernel_ms(cudnn_fwd, q.device, [])
            print(f"{name:<10} {layout:<6} sdpa_cudnn fwd+bwd kernels {peer_ms:.4f} ms, fwd {peer_fwd_ms:.4f} ms",
                  flush=True)
            base = _tuning.config_for(q.device, n, d, q.dtype)
            o_def, lse_def = ft.flash_forward(q, k, v, True)
            for kind, variants in (("fwd", FWD), ("bwd", BWD)):
                for tile, extra in variants:
                    cfg = dataclasses.replace(base, **{f"hopper_{kind}": tile})
                    try:
                        fn = (functools.partial(ft.flash_forward, q, k, v, True, cfg) if kind == "fwd" else
                              functools.partial(ft.flash_backward, q, k, v, o_def, lse_def, do, True, cfg))
                        if extra:  # constexprs the launch adds (before its first call compiles it)
                            fn()
                            key = next(k2 for k2 in reversed(ft._PLANS) if k2[0] == "bwd")
                            ft._PLANS[key][2][1][0].constexprs.update(extra)
                            ft._PLANS[key][2][1][0].run = None
                        out = fn()
                        got = out[:1] if kind == "fwd" else out
                        want, peer_err = (ref[:1], peer[:1]) if kind == "fwd" else (ref[1:], peer[1:])
                        errs = [(x.double() - r).abs().max().item() for x, r in zip(got, want, strict=True)]
                        ok = all(e <= 2 * pe + r.abs().max().item() * 2**-8
                                 for e, pe, r in zip(errs, peer_err, want, strict=True))
                        ms = kernel_ms(fn, q.device, [])
                    except Exception as err:  # a variant that does not compile or fit: recorded, the sweep goes on
                        print(f"{name:<10} {layout:<6} {kind} {tile.short():<24} error {type(err).__name__}: "
                              f"{str(err).splitlines()[0][:160] if str(err) else ''}", flush=True)
                        continue
                    label = tile.short() + "".join(f"/{k2.lower()}{v2}" for k2, v2 in extra.items())
                    rows.append(dict(shape=name, layout=layout, kind=kind, tile=label, kernel_ms=ms,
                                     errors=errs, sdpa_errors=peer_err, ok=ok, sdpa_fwd_bwd_kernel_ms=peer_ms,
                                     sdpa_fwd_kernel_ms=peer_fwd_ms))
                    print(f"{name:<10} {layout:<6} {kind} {label:<24} kernels {ms:.4f} ms  "
                          f"{'ok' if ok else 'FAIL'} err {' '.join(f'{e:.2e}' for e in errs)}", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "layout_variant_ab.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
