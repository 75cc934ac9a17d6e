"""Does the memory layout of q, k, v and dO change attention's kernel time at the models' shapes? (issue 19)

In the model q, k, v are (B, H, T, d) views of the projections' (B, T, H, d) outputs, and dO arrives in that layout
too; ``flash-bench`` times contiguous (B, H, T, d) tensors. The captured xl/2048 step spends 32.7 ms in cuDNN's
attention kernels (session 25's graph profile), 0.68 ms a layer, against 0.59 ms that ``flash-bench`` measured
per call. This times forward+backward kernel time (``bench.flash.kernel_ms``: profiler sum, L2 flushed) and
``do_bench`` medians of SDPA cuDNN, SDPA flash and ours for each layout:

- ``bhtd``: q, k, v, dO contiguous (B, H, T, d);
- ``model``: each a transposed view of a contiguous (B, T, H, d) tensor (what the model passes);
- ``qk_bhtd``: q and k contiguous (B, H, T, d) (as a RoPE kernel could write them), v and dO as in ``model``, and
  the output copied back to (B, T, H*d) (what the output projection would read).

    python scripts/device/attention_layout_probe.py [--shapes xl_2048 xl_512 small_512]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from cs336_systems.attention.flash_triton import flash_triton_attention
from cs336_systems.bench.flash import kernel_ms

SHAPES = {"xl_2048": (4, 2048, 25, 64), "xl_512": (4, 512, 25, 64), "small_512": (4, 512, 12, 64)}


def sdpa(backend):
    def f(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return f


IMPLS = {"sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
         "ours": lambda q, k, v: flash_triton_attention(q, k, v, True)}


def inputs(layout: str, B: int, T: int, H: int, d: int):
    def bthd():
        return torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    def bhtd():
        return torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)

    if layout == "bhtd":
        q, k, v, do = bhtd(), bhtd(), bhtd(), bhtd()
    elif layout == "model":
        q, k, v, do = bthd(), bthd(), bthd(), bthd()
    else:
        q, k, v, do = bhtd(), bhtd(), bthd(), bthd()
    for t in (q, k, v):
        t.requires_grad_(True)
    return q, k, v, do


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    out = {}
    for shape in a.shapes:
        B, T, H, d = SHAPES[shape]
        for layout in ("bhtd", "model", "qk_bhtd"):
            q, k, v, do = inputs(layout, B, T, H, d)
            for impl, fn in IMPLS.items():
                def call(fn=fn, q=q, k=k, v=v, do=do, layout=layout):
                    o = fn(q, k, v)
                    if layout == "qk_bhtd":  # back to (B, T, H*d) for the output projection, and dO from it
                        o = o.transpose(1, 2).reshape(o.shape[0], o.shape[2], -1)
                        o.backward(do.transpose(1, 2).flatten(2))
                    else:
                        o.backward(do)
                try:
                    gpu = kernel_ms(call, torch.device("cuda"), [q, k, v])
                    ms = do_bench(call, warmup=25, rep=200, grad_to_none=[q, k, v])
                except Exception as e:  # a backend that refuses a layout is a finding, not a failure
                    print(f"{shape:10s} {layout:8s} {impl:10s} failed: {type(e).__name__}: {str(e)[:120]}")
                    continue
                out[f"{shape} {layout} {impl}"] = {"kernel_ms": gpu, "do_bench_ms": ms}
                print(f"{shape:10s} {layout:8s} {impl:10s} kernels {gpu:7.4f} ms  do_bench {ms:7.4f} ms", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "attention_layout_probe.json"), "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
