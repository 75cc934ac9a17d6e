"""Where a host-bound FlashAttention call's forward+backward time goes (issue 18, the 512-token model shapes).

For ours (the adapters' Triton class), SDPA flash and SDPA cuDNN at each shape: ``do_bench`` medians of
forward+backward in interleaved rounds (the spread between rounds is the host's), then one ``torch.profiler``
trace of a few iterations, from which it prints the GPU time of each kernel per call and the busy fraction of
the GPU over the iterations' wall time: kernel time against host time, per implementation.

    python scripts/device/flash_small_profile.py [--shapes small_512 xl_512 floor] [--layout bhtd model] [--out DIR]

``--layout model``: q, k, v and dO as the model passes them, (B, H, T, d) views of (B, T, H, d) tensors (the
default ``bhtd``: contiguous (B, H, T, d), what ``flash-bench`` times).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from cs336_systems.bench.flash import MODEL_SHAPES, attention_fn


def sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _wall_ms(run, n: int, inputs) -> float:
    """Host milliseconds per call of ``n`` calls (gradients reset before each), to the end of their GPU work."""
    t0 = time.perf_counter()
    for _ in range(n):
        for t in inputs:
            t.grad = None
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["small_512", "xl_512", "floor"])
    p.add_argument("--layout", nargs="*", choices=["bhtd", "model"], default=["bhtd"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    for name, layout in ((n, lay) for n in args.shapes for lay in args.layout):
        s = MODEL_SHAPES[name]
        shape = (s.batch, s.heads, s.seq_len, s.head_dim)
        if layout == "model":
            q, k, v, do = (torch.randn(s.batch, s.seq_len, s.heads, s.head_dim, device=dev, dtype=torch.bfloat16)
                           .transpose(1, 2) for _ in range(4))
        else:
            q, k, v, do = (torch.randn(*shape, device=dev, dtype=torch.bfloat16) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        impls = {"triton": attention_fn("triton", s, dev, False), "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
                 "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}

        def step(fn, q=q, k=k, v=v, do=do, causal=s.causal):
            def call():
                fn(q, k, v, causal).backward(do)
            return call

        times = collections.defaultdict(list)
        for fn in impls.values():
            triton.testing.do_bench(step(fn), warmup=25, rep=50, grad_to_none=[q, k, v])
        for _ in range(args.rounds):
            for impl, fn in impls.items():
                times[impl].append(triton.testing.do_bench(step(fn), warmup=10, rep=50, grad_to_none=[q, k, v]))
        for impl, fn in impls.items():
            run = step(fn)
            n = 20
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                wall = _wall_ms(run, n, (q, k, v))
            kernels = collections.defaultdict(float)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[e.name] += e.device_time / n / 1e3
            wall_plain = _wall_ms(run, n, (q, k, v))
            gpu = sum(kernels.values())
            row = dict(shape=name, layout=layout, impl=impl, do_bench_rounds_ms=times[impl],
                       do_bench_median_ms=sorted(times[impl])[len(times[impl]) // 2], wall_ms_per_call=wall_plain,
                       wall_ms_profiled=wall, gpu_kernel_ms_per_call=gpu,
                       kernels_ms={k2: round(v2, 5) for k2, v2 in sorted(kernels.items(), key=lambda kv: -kv[1])})
            rows.append(row)
            print(f"{name:<10} {layout:<6} {impl:<11} do_bench {' '.join(f'{t:.4f}' for t in times[impl])}  wall/call "
                  f"{wall_plain:.4f} ms  kernels/call {gpu:.4f} ms", flush=True)
            for kname, ms in list(row["kernels_ms"].items())[:8]:
                print(f"      {ms:.5f}  {kname[:110]}", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "flash_small_profile.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
