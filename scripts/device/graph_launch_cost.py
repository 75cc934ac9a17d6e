"""What a CUDA graph's launch costs the host, by node count, and whether launching it as several graphs starts the
GPU sooner (issue 19: the captured xl/2048 step, about 2,200 nodes, is timed between synchronisations, so the time
before its first kernel runs counts in every step).

Captures ``N`` small kernels (in-place adds on a 1 MiB tensor) as one graph and as ``S`` graphs of N/S each, then
times, from a synchronised start: the host's ``replay()`` calls, the wall time to the end of the work (events), and
the time to the graph's first node (an event recorded inside the graph).

    python scripts/device/graph_launch_cost.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def capture(nodes: int, x: torch.Tensor, pool=None, first: torch.cuda.Event | None = None) -> torch.cuda.CUDAGraph:
    """``nodes`` in-place adds as one graph; ``first``: an external event recorded as the graph's first node."""
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x.add_(1.0)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(g, pool=pool, stream=stream):
        if first is not None:
            first.record()
        for _ in range(nodes):
            x.add_(1.0)
    return g


def time_to_first_node(g: torch.cuda.CUDAGraph, first: torch.cuda.Event, reps: int = 20) -> float:
    """Median ms from an event recorded right before ``replay()`` (synchronised start) to the graph's first node."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(first))
    return statistics.median(out)


def time_launches(graphs: list[torch.cuda.CUDAGraph], reps: int = 20) -> tuple[float, float]:
    """(host ms of the replay() calls, wall ms from a synchronised start to the work's end), medians."""
    host, wall = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for g in graphs:
            g.replay()
        host.append((time.perf_counter() - t0) * 1e3)
        stop.record()
        stop.synchronize()
        wall.append(start.elapsed_time(stop))
    return statistics.median(host), statistics.median(wall)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    x = torch.zeros(1 << 18, device="cuda")
    rows = []
    for nodes in (250, 1000, 2000, 4000):
        one = [capture(nodes, x)]
        host1, wall1 = time_launches(one)
        first = torch.cuda.Event(enable_timing=True, external=True)
        latency = time_to_first_node(capture(nodes, x, first=first), first)
        print(f"{nodes:5d} nodes: {latency:.3f} ms from before replay() to the graph's first node", flush=True)
        for splits in (1, 2, 4, 8):
            graphs = one if splits == 1 else [capture(nodes // splits, x) for _ in range(splits)]
            host, wall = time_launches(graphs)
            rows.append(dict(nodes=nodes, graphs=splits, host_ms=host, wall_ms=wall, first_node_ms=latency))
            print(f"{nodes:5d} nodes as {splits} graph(s): host {host:.3f} ms, wall {wall:.3f} ms "
                  f"(one graph: host {host1:.3f}, wall {wall1:.3f})", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "driver": torch.version.cuda, "commit": os.environ.get("CS336_GIT_COMMIT", "")}
    with open(os.path.join(args.out, "graph_launch_cost.json"), "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
