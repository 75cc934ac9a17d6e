"""GPU time of a torch.profiler Chrome trace by kernel category: matmuls, attention, the optimizer, Inductor's
Triton kernels (pointwise, reduction, persistent reduction), the rest by name; and the GPU's busy time.

    python scripts/trace_categories.py results/logs/h100-s12/profile/trace-flash_auto.json.gz
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json


def category(name: str) -> str:
    if "nvjet" in name or "gemm" in name.lower() or "cutlass" in name:
        return "matmul (cuBLAS)"
    if "sdpa" in name or "cudnn" in name or "flash" in name:
        return "attention"
    if "_adamw" in name:
        return "optimizer (FusedAdamW)"
    if name.startswith("triton_"):
        return "Inductor triton_" + name.split("_")[1]
    if "emset" in name or "emcpy" in name:
        return "memset / memcpy"
    return "other: " + name[:60]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    opener = gzip.open if args.trace.endswith(".gz") else open
    with opener(args.trace, "rt") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not events:
        raise SystemExit(f"{args.trace}: no GPU kernels in the trace")
    total, calls = collections.Counter(), collections.Counter()
    for e in events:
        total[category(e["name"])] += e["dur"]
        calls[category(e["name"])] += 1
    for name, us in total.most_common(args.top):
        print(f"{name:70s} {us / 1e3:9.2f} ms {calls[name]:6d} launches")
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events)
    busy, (first, end) = 0.0, spans[0]
    for start, stop in spans[1:]:  # the union of the kernels' intervals
        if start > end:
            busy, first = busy + end - first, start
        end = max(end, stop)
    busy += end - first
    print(f"kernels {sum(total.values()) / 1e3:.2f} ms; GPU busy {busy / 1e3:.2f} ms")


if __name__ == "__main__":
    main()
