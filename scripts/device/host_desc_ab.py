"""A/B of the persistent Gluon forwards with TMA descriptors built on the device (per program, as shipped) against
descriptors built on the host (``HOST_DESC``), one process, same inputs, kernel time in interleaved rounds.

    python scripts/device/host_desc_ab.py [--shapes xl_512 small_512 ...] [--rounds 7]

The host form launches through Triton's JIT (its host time is not what is compared: only the kernels' GPU time,
``bench.flash.kernel_ms``). O and L must match the shipped kernel's bit for bit (same arithmetic). Also times, per
shape, cuDNN's forward in the same rounds. Writes ``host_desc_ab.json`` under ``$OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.experimental import gluon  # noqa: F401  (the descriptors' layout types)
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from cs336_systems.attention import flash_hopper
from cs336_systems.attention import flash_triton as ft
from cs336_systems.bench.flash import MODEL_SHAPES, kernel_ms


def host_launch(q, k, v, causal: bool):
    """The shipped plan's persistent launch with descriptors from the host: a function returning (O, L)."""
    plan = ft._plan_for(q, k, v, ("launch", None, 0 if causal else None), None, None)
    launch, grid, copy, scalars, folds = plan.fwd
    assert launch.cfg.persistent and not copy and folds == (0, 0), (launch.cfg, copy, folds)
    ws = launch.kernel is flash_hopper._hopper_fwd_ws_persistent_kernel
    c = launch.constexprs
    rows = c["BLOCK_M"] // 2 if ws else c["BLOCK_M"]
    d, bn = c["HEAD_DIM"], c["BLOCK_N"]
    layout = gl.NVMMASharedLayout.get_default_for([1, bn, d], gl.bfloat16)
    n_q = q.shape[-2]
    n_k = k.shape[-2]

    def desc(t, n, tile):
        return TensorDescriptor(t, [t.shape[0] * t.shape[1], n, d], [t.stride(1), t.stride(2), 1], [1, tile, d],
                                layout)

    kd, vd = desc(k, n_k, bn), desc(v, n_k, bn)
    programs = launch.programs or min(grid[0], 10**9)

    def run():
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
        launch.kernel[(min(grid[0], programs), 1, 1)](
            desc(q, n_q, rows), kd, vd, desc(o, n_q, rows), lse, ft._work_counter(q.device), None, *scalars,
            plan.scale * ft.LOG2E, **c, HOST_DESC=True, num_warps=launch.cfg.num_warps,
            num_stages=launch.cfg.num_stages)
        return o, lse

    return run


def host_cost(t, n: int = 2000) -> dict:
    """Host microseconds to encode one descriptor: Triton's C encoder alone, and through its launcher's Python."""
    import time

    import triton
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST, make_tensordesc_arg

    fill = triton.runtime.driver.active.utils.fill_tma_descriptor
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [1, 64, 64], "fp4_padded": False}
    shape, strides = [t.shape[0] * t.shape[1], t.shape[2], t.shape[3]], [t.stride(1), t.stride(2), 1]
    desc = TensorDescriptor(t, shape, strides, [1, 64, 64], gl.NVMMASharedLayout.get_default_for([1, 64, 64],
                                                                                                 gl.bfloat16))
    res, bf16 = {}, TMA_DTYPE_DEVICE_TO_HOST[10]
    for name, fn in {"fill_tma_descriptor": lambda: fill(t.data_ptr(), 3, 2, bf16, [1, 64, 64], shape, strides, 0),
                     "make_tensordesc_arg": lambda: make_tensordesc_arg(desc, meta),
                     "TensorDescriptor+make_tensordesc_arg": lambda: make_tensordesc_arg(
                         TensorDescriptor(t, shape, strides, [1, 64, 64], desc.layout), meta)}.items():
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        res[name] = (time.perf_counter() - t0) / n * 1e6
    return res


def ab_shape(name: str, n_rounds: int, dev: torch.device) -> dict:
    s = MODEL_SHAPES[name]
    torch.manual_seed(0)
    q, k, v = (torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, device=dev, dtype=torch.bfloat16)
               for _ in range(3))

    def shipped():
        return ft.flash_forward(q, k, v, s.causal)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=s.causal)

    o_ref, l_ref = (t.clone() for t in shipped())
    host = host_launch(q, k, v, s.causal)
    o, lse = host()
    fns = {"device_desc": shipped, "host_desc": host, "cudnn": cudnn}
    rounds = {key: [] for key in fns}
    for r in range(n_rounds):
        for key in list(fns)[r % 3:] + list(fns)[:r % 3]:
            rounds[key].append(kernel_ms(fns[key], dev, [], calls=20))
    row = {"shape": name, "bitwise_equal": bool(torch.equal(o, o_ref) and torch.equal(lse, l_ref)),
           **{f"{key}_ms": statistics.median(v) for key, v in rounds.items()}}
    row.update(host_over_device=row["host_desc_ms"] / row["device_desc_ms"],
               device_over_cudnn=row["device_desc_ms"] / row["cudnn_ms"],
               host_over_cudnn=row["host_desc_ms"] / row["cudnn_ms"])
    print(json.dumps({k_: (round(v_, 4) if isinstance(v_, float) else v_) for k_, v_ in row.items()}), flush=True)
    return {**row, "rounds": rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["xl_512", "small_512", "xl_2048", "lb2025", "noncausal_2k",
                                                   "d128_4k"])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    dev = torch.device("cuda")
    out = [ab_shape(name, args.rounds, dev) for name in args.shapes]
    q = torch.empty(4, 25, 512, 64, device=dev, dtype=torch.bfloat16)
    out.append({"host_us_per_descriptor": host_cost(q)})
    print(json.dumps(out[-1]), flush=True)
    path = os.path.join(os.environ.get("OUT", "."), "host_desc_ab.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
