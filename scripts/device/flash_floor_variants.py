"""Kernel time of tile and form variants at the short shapes (issue 18: the per-call floor), on the GPU.

For each shape: GPU time per call (``bench.flash.kernel_ms``: L2 flushed, host time not counted) of our forward and
backward (``flash_forward`` / ``flash_backward`` with the config under test) and of the peers' forward and
forward+backward, in one process. Variants: the single backward kernel by TMA or block pointers at several tiles
(``FlashConfig.single``), the Triton forward at several tiles (``small_fwd``) against the Gluon one.

    python scripts/device/flash_floor_variants.py [--shapes floor ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch
import triton

from cs336_systems.attention import _tuning
from cs336_systems.attention.flash_triton import flash_backward, flash_forward
from cs336_systems.bench.flash import MODEL_SHAPES, AttnShape, _calls, kernel_ms, shape_inputs

K = _tuning.KernelConfig
EXTRA = {"floor256": AttnShape(1, 1, 256, 64), "floor_d128": AttnShape(1, 1, 128, 128),
         "mid_400": AttnShape(4, 25, 256, 64)}

BWD_TILES = [K(64, 64, 4, 3, True), K(64, 64, 4, 3, False), K(64, 64, 4, 2, False), K(32, 32, 4, 2, True),
             K(32, 32, 4, 2, False), K(32, 32, 2, 2, False), K(32, 64, 4, 2, False), K(64, 32, 4, 2, False),
             K(128, 128, 8, 2, False), K(64, 128, 8, 2, False), K(128, 64, 8, 2, False)]
FWD_TILES = [K(64, 64, 4, 3, True), K(64, 64, 4, 2, False), K(32, 32, 4, 2, False), K(32, 32, 2, 2, False),
             K(64, 32, 4, 2, False), K(32, 64, 4, 2, False), K(128, 64, 8, 2, False), K(128, 128, 8, 2, False),
             K(64, 128, 4, 2, False), K(128, 64, 4, 2, True)]


def _shape(name: str, dev: torch.device, record) -> None:
    """Every variant and peer at one shape."""
    s = MODEL_SHAPES.get(name) or EXTRA[name]
    q, k, v, do = shape_inputs(s, dev)
    base = _tuning.config_for(dev, s.seq_len, max(64, s.head_dim), q.dtype)
    for impl in ("sdpa_cudnn", "sdpa_flash", "flex"):
        calls, grads = _calls(impl, s, dev, False, "do", (q, k, v, do))
        record(name, "fwd", impl, kernel_ms(calls["forward"], dev, grads))
        record(name, "fwd+bwd", impl, kernel_ms(calls["forward_backward"], dev, grads))
    qd, kd, vd = q.detach(), k.detach(), v.detach()

    def fwd_ms(cfg):
        return kernel_ms(lambda: flash_forward(qd, kd, vd, s.causal, config=cfg), dev, [])

    small = base.small_forward(s.seq_len, s.batch * s.heads)
    record(name, "fwd", f"default {small.short() if small else 'gluon'}", fwd_ms(base))
    record(name, "fwd", "without small_fwd", fwd_ms(dataclasses.replace(base, small_fwd=())))
    for t in FWD_TILES:
        try:
            record(name, "fwd", f"triton {t.short()}", fwd_ms(dataclasses.replace(base, small_fwd=((1 << 30, t),))))
        except Exception as err:  # a tile that does not fit (shared memory): say so and go on
            print(f"{name} fwd triton {t.short()}: {type(err).__name__}: {str(err)[:120]}", flush=True)
    if base.hopper_fwd is not None:
        for t in (K(64, 64, 4, 2, True), K(64, 128, 4, 2, True), K(128, 128, 4, 2, True, True)):
            try:
                record(name, "fwd", f"gluon {t.short()}", fwd_ms(dataclasses.replace(base, hopper_fwd=t, small_fwd=())))
            except Exception as err:
                print(f"{name} fwd gluon {t.short()}: {type(err).__name__}: {str(err)[:120]}", flush=True)
    o, lse = flash_forward(qd, kd, vd, s.causal, config=base)

    def bwd_ms(cfg):
        return kernel_ms(lambda: flash_backward(qd, kd, vd, o, lse, do, s.causal, config=cfg), dev, [])

    record(name, "bwd", "default", bwd_ms(base))
    record(name, "bwd", "three kernels", bwd_ms(dataclasses.replace(base, single_max_programs=0)))
    for t in BWD_TILES:
        try:
            record(name, "bwd", f"single {t.short()}",
                   bwd_ms(dataclasses.replace(base, single=t, single_max_programs=1 << 30)))
        except Exception as err:
            print(f"{name} bwd {t.short()}: {type(err).__name__}: {str(err)[:120]}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["floor", "floor256", "floor_d128", "small_512", "mid_400"])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    dev = torch.device("cuda")
    rows = []

    def record(shape, what, variant, ms):
        rows.append(dict(shape=shape, what=what, variant=variant, kernel_ms=ms))
        print(f"{shape:<11} {what:<8} {variant:<40} {ms * 1e3:8.2f} us", flush=True)

    for name in args.shapes:
        _shape(name, dev, record)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "flash_floor_variants.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
