"""Which SDPA kernel a model's attention call runs, and what it costs, eager and compiled.

At the models' shapes (q, k, v made as the model makes them: a projection's output viewed as heads, RoPE'd q and
k), forward+backward medians (``triton.testing.do_bench``) of PyTorch's default SDPA dispatch, ``flash_auto``
(cs336_systems.attention.auto: the measured backend first) and cuDNN alone, each eager and inside
``torch.compile``; then the GPU kernels of one compiled ``flash_auto`` call under ``torch.profiler``. Usage (device):
``python scripts/device/sdpa_backend_probe.py`` (prints; writes ``$OUT/sdpa_backend_probe.json`` if ``OUT`` is set).
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from cs336_systems.attention.auto import flash_auto_attention

SHAPES = {"xl_2048": (4, 2048, 25, 64), "xl_512": (4, 512, 25, 64), "small_512": (4, 512, 12, 64)}


def default(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def auto(q, k, v):
    return flash_auto_attention(q, k, v, True)


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def model_like(fn):
    """heads from a (B, T, H*d) projection output, a RoPE-like elementwise op on q and k, attention, heads merged."""
    def f(x, w, cos):
        B, T, _ = x.shape
        qkv = (x @ w).view(B, T, 3, -1, cos.shape[-1])
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        q, k = q * cos, k * cos
        return fn(q, k, v).transpose(1, 2).reshape(B, T, -1)
    return f


def main() -> None:
    out = {}
    for name, (B, T, H, d) in SHAPES.items():
        x = torch.randn(B, T, H * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(H * d, 3 * H * d, device="cuda", dtype=torch.bfloat16) / (H * d) ** 0.5
        cos = torch.rand(T, d, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(B, T, H * d, device="cuda", dtype=torch.bfloat16)
        for label, fn in (("default", default), ("flash_auto", auto), ("cudnn", cudnn)):
            for compiled in (False, True):
                f = model_like(fn)
                f = torch.compile(f) if compiled else f

                def step(f=f, x=x, w=w, cos=cos, dy=dy):
                    x.grad = None
                    f(x, w, cos).backward(dy)

                ms = do_bench(step, warmup=50, rep=300)
                key = f"{name} {label} {'compiled' if compiled else 'eager'}"
                out[key] = ms
                print(f"{key:40s} {ms:8.3f} ms (incl. the projection)", flush=True)
        torch._dynamo.reset()
    B, T, H, d = SHAPES["xl_2048"]
    x = torch.randn(B, T, H * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(H * d, 3 * H * d, device="cuda", dtype=torch.bfloat16) / (H * d) ** 0.5
    cos = torch.rand(T, d, device="cuda", dtype=torch.bfloat16)
    for label, fn in (("flash_auto", auto), ("default", default)):
        f = torch.compile(model_like(fn))
        for _ in range(3):
            f(x, w, cos).sum().backward()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            f(x, w, cos).sum().backward()
            torch.cuda.synchronize()
        print(f"--- xl_2048 compiled {label}: GPU kernels")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=90))
        torch._dynamo.reset()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "sdpa_backend_probe.json"), "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
