"""RoPE on q and k at a model's shape: the compiled module (Inductor's kernel) against the Triton kernel of
``cs336_systems.fused.rope``, forward and forward+backward, same process (``triton.testing.do_bench`` medians),
with each one's error against an fp64 rotation, and the kernels one forward+backward launches (``torch.profiler``:
the kernel times to compare; the do_bench times include each call's host work).

    python scripts/device/rope_bench.py [--batch 4 --context 2048 --heads 25 --head-dim 64]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from cs336_basics.model import RotaryEmbedding
from cs336_systems.fused import rope as fused_rope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=25)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = (args.batch, args.context, args.heads, args.head_dim)
    q, k = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    pos = torch.arange(args.context, device="cuda").unsqueeze(-1)
    gbytes = 4 * q.numel() * q.element_size() / 1e9  # q and k read and written
    rows, runs = {}, {}
    for name in ("inductor", "triton"):
        rope = RotaryEmbedding(args.context, args.head_dim, device="cuda")
        if name == "triton":
            rope.kernel = fused_rope.rotate
        fn = torch.compile(lambda q, k, rope=rope: (rope(q, pos), rope(k, pos)))

        def fwd(fn=fn):
            return fn(q, k)

        def fwd_bwd(fn=fn):
            a, b = fn(q, k)
            torch.autograd.backward((a, b), (dq, dk))

        fwd_bwd()
        a, _ = fn(q, k)
        cos, sin = rope.cos[pos].double(), rope.sin[pos].double()
        even, odd = q.detach().double()[..., 0::2], q.detach().double()[..., 1::2]
        exact = torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)
        f_ms = do_bench(fwd, warmup=50, rep=300, return_mode="median")
        fb_ms = do_bench(fwd_bwd, warmup=50, rep=300, grad_to_none=[q, k], return_mode="median")
        rows[name] = dict(forward_ms=f_ms, forward_backward_ms=fb_ms, forward_tb_s=gbytes / f_ms,
                          max_err_vs_fp64=(a.double() - exact).abs().max().item())
        runs[name] = fwd_bwd
    # last (the profiler slows what runs after it): the kernels of one forward+backward, device time in us
    for name, fwd_bwd in runs.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            q.grad = k.grad = None
            fwd_bwd()
            torch.cuda.synchronize()
        rows[name]["kernels_us"] = [(e.key[:90], e.count, round(e.self_device_time_total, 1))
                                    for e in prof.key_averages() if e.self_device_time_total > 0]
    print(json.dumps(dict(shape=shape, device=torch.cuda.get_device_name(), torch=torch.__version__, **rows)))


if __name__ == "__main__":
    main()
