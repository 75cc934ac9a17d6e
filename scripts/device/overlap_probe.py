"""Does memory-bound work beside matmuls on a few SMs cost less than after them, on a power-capped GPU? (issue 19)

The xl/2048 step runs at the H100's 700 W cap (docs/training_step.md, session 28), so its time follows its energy;
the optimizer (18 ms a step, memory-bound) and the norms run below the cap, which leaves part of the power budget
unused while they run. If matmuls gave up a few SMs (cuBLAS's SM count target, ``torch._C._set_sm_carveout_
experimental``) to a streaming kernel on a side stream, the two together could finish sooner than one after the
other. This times, in one process and in alternating rounds each long enough to reach the cap:

- ``gemm``: ``n_gemm`` matmuls of the step's w2 shape (8192 x 1600 x 6400) on all SMs;
- ``stream``: a persistent Triton kernel moving ``gib`` GiB (fp32 read, scaled, written back) on ``k`` SMs' worth
  of programs, and on all of them;
- ``serial``: both, one after the other, each on all SMs; ``overlap``: the matmuls with ``k`` SMs carved out, the
  streaming kernel on ``k`` SMs beside them (its own stream);

and prints each round's wall time with the board's power and SM clock read just after it.

    python scripts/device/overlap_probe.py [--k 8 16 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _stream_kernel(x_ptr, n, n_progs, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for start in range(pid * BLOCK, n, n_progs * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        v = tl.load(x_ptr + offs, mask=mask)
        tl.store(x_ptr + offs, v * 1.0000001, mask=mask)


def _stream(x: torch.Tensor, programs: int) -> None:
    _stream_kernel[(programs,)](x, x.numel(), programs, BLOCK=4096, num_warps=8)


def _gpu_state() -> tuple[float | None, float | None]:
    try:
        return torch.cuda.power_draw() / 1e3, torch.cuda.clock_rate()
    except Exception:  # no NVML
        return None, None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, nargs="+", default=[8, 16, 24])
    p.add_argument("--n-gemm", type=int, default=200)
    p.add_argument("--gib", type=float, default=8.0, help="bytes the streaming kernel reads (and writes) a pass")
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    a = torch.randn(8192, 6400, device=dev, dtype=torch.bfloat16)
    w = torch.randn(1600, 6400, device=dev, dtype=torch.bfloat16)
    out = torch.empty(8192, 1600, device=dev, dtype=torch.bfloat16)
    x = torch.ones(int(args.gib * 2**30 / 4), device=dev)
    side = torch.cuda.Stream()

    def gemms(carveout: int) -> None:
        torch._C._set_sm_carveout_experimental(carveout or None)
        for _ in range(args.n_gemm):
            torch.mm(a, w.T, out=out)
        torch._C._set_sm_carveout_experimental(None)

    def streams(programs: int) -> None:
        for _ in range(args.passes):
            _stream(x, programs)

    def run(kind: str, k: int) -> None:
        if kind == "gemm":
            gemms(0)
        elif kind == "gemm-carved":
            gemms(k)
        elif kind == "stream-all":
            streams(sms * 2)
        elif kind == "stream-k":
            streams(k * 2)
        elif kind == "serial":
            gemms(0)
            streams(sms * 2)
        elif kind == "overlap":
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                streams(k * 2)
            gemms(k)
            torch.cuda.current_stream().wait_stream(side)

    kinds = ["gemm", "gemm-carved", "stream-all", "stream-k", "serial", "overlap"]
    for kind in kinds:  # compile and warm
        run(kind, args.k[0])
    torch.cuda.synchronize()
    rows = []
    t_warm = time.perf_counter()
    while time.perf_counter() - t_warm < 5:  # to the power cap
        run("serial", 0)
        torch.cuda.synchronize()
    for rnd in range(args.rounds):
        for k in args.k:
            order = kinds if rnd % 2 == 0 else kinds[::-1]
            for kind in order:
                if kind in ("gemm", "stream-all", "serial") and k != args.k[0]:
                    continue  # no k in them: once a round
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                run(kind, k)
                torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3
                watts, mhz = _gpu_state()
                rows.append(dict(round=rnd, k=k, kind=kind, ms=ms, watts=watts, mhz=mhz))
                print(f"round {rnd} k={k:>3} {kind:<12} {ms:8.2f} ms  {watts} W  {mhz} MHz", flush=True)
    summary = {}
    for r in rows:
        summary.setdefault((r["kind"], r["k"] if r["kind"] not in ("gemm", "stream-all", "serial") else 0),
                           []).append(r["ms"])
    print("\nmedians:")
    for (kind, k), v in sorted(summary.items()):
        v = sorted(v)
        print(f"  {kind:<12} k={k:>3}  {v[len(v) // 2]:8.2f} ms")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("CS336_GIT_COMMIT", ""), "args": vars(args)}
    with open(os.path.join(args.out, "overlap_probe.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
