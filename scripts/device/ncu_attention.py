"""The attention kernels of one model shape under Nsight Compute: ours and SDPA cuDNN, forward (and with
``--backward`` forward+backward), a few calls each, for ``ncu`` to profile.

    ncu --kernel-name regex:'hopper|cudnn' --launch-skip 4 --launch-count 4 --section SpeedOfLight \\
        --section WarpStateStats python3 scripts/device/ncu_attention.py --shape xl_2048

Where nsys does not run (the lent GPUs), ncu does: its warp-stall and pipe-utilisation sections are what tell a
latency-bound kernel from a throughput-bound one.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.bench.flash import MODEL_SHAPES, attention_fn, shape_inputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="xl_2048", choices=list(MODEL_SHAPES))
    p.add_argument("--impl", nargs="*", default=["triton", "sdpa_cudnn"])
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--backward", action="store_true")
    args = p.parse_args()
    s = MODEL_SHAPES[args.shape]
    dev = torch.device("cuda")
    q, k, v, do = shape_inputs(s, dev)
    for impl in args.impl:
        fn = attention_fn(impl, s, dev)
        for _ in range(args.calls):
            o = fn(q, k, v, s.causal)
            if args.backward:
                o.backward(do)
        torch.cuda.synchronize()
        print(impl, "done", flush=True)


if __name__ == "__main__":
    main()
