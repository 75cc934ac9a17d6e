"""What is live at a `bench` configuration's peak? (issue 19: ours vs the peer's peak memory at small/512)

Runs one configuration of ``bench --problem training_step`` with the CUDA caching allocator's history on
(``torch.cuda.memory._record_memory_history``), then replays the history: the peak of allocated bytes, the
allocation that reached it, and the blocks live at that moment grouped by where they were allocated (the innermost
frames outside torch's own plumbing). Optionally saves the snapshot (pickle, for pytorch.org/memory_viz).
    python scripts/device/memory_peak.py ours|peer-graphs [--preset small] [--context-length 512] [--save PATH]
"""

import argparse
import pickle
from collections import defaultdict
from dataclasses import replace

import torch

import cs336_systems.bench.e2e as e2e
from cs336_systems.bench.e2e import BenchConfig, run_benchmark

SKIP = ("torch/utils/", "torch/nn/modules/module.py", "contextlib.py", "torch/_dynamo/eval_frame.py",
        "torch/autograd/", "torch/_tensor.py", "threading.py", "torch/cuda/memory.py")


def where(frames: list[dict], depth: int = 3) -> str:
    kept = [f for f in frames if not any(s in f["filename"] for s in SKIP)]
    return " < ".join(f"{f['filename'].split('/')[-1]}:{f['line']}({f['name']})" for f in kept[:depth]) or "?"


SOURCES = ("model.py", "peer.py", "nn_utils.py", "linear_cross_entropy.py", "adamw.py", "adam.py", "e2e.py",
           "step_graph.py", "cudagraph_trees.py")


def source(frames: list[dict]) -> str:
    """The innermost frame in the model's, the loss's, the optimizer's or the harness's own code (the line of the
    model an Inductor kernel's buffer belongs to), else the innermost kept frame."""
    for f in frames:
        if f["filename"].endswith(SOURCES):
            return f"{f['filename'].split('/')[-1]}:{f['line']}({f['name']})"
    return where(frames, 1)


def analyse(snapshot: dict, top: int) -> None:
    live: dict[int, tuple[int, list, int]] = {}
    cur = peak = 0
    at_peak: dict[int, tuple[int, list, int]] = {}
    peak_frames: list = []
    peak_index = 0
    trace = snapshot["device_traces"][0]
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []), i)
            cur += e["size"]
            if cur > peak:
                peak, at_peak, peak_frames, peak_index = cur, dict(live), e.get("frames", []), i
        elif e["action"] == "free_completed" and e["addr"] in live:
            cur -= live.pop(e["addr"])[0]
    print(f"history: {len(trace)} events; peak {peak / 2**30:.3f} GiB of traced allocations at event {peak_index} "
          f"({len(at_peak)} blocks live)")
    print(f"reached by: {where(peak_frames, 6)}")
    allocs = [(i, e) for i, e in enumerate(trace[:peak_index + 1]) if e["action"] == "alloc"][-12:]
    for i, e in allocs:  # what ran just before the peak: the phase it falls in
        print(f"  event {i}: {e['size'] / 2**20:8.1f} MiB  {where(e.get('frames', []), 4)}")
    step = max(len(trace) // 20, 1)
    curve, cur, sizes = [], 0, {}
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            sizes[e["addr"]] = e["size"]
            cur += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in sizes:
            cur -= sizes.pop(e["addr"])
        if i % step == 0:
            curve.append(f"{cur / 2**30:.2f}")
    print("allocated (GiB) every 5% of the history: " + " ".join(curve))
    groups: dict[str, list[int]] = defaultdict(list)
    for size, frames, _ in at_peak.values():
        groups[where(frames)].append(size)
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    for key, sizes in rows[:top]:
        print(f"{sum(sizes) / 2**20:10.1f} MiB {len(sizes):5d} blocks  {key}")
    by_source: dict[str, list[int]] = defaultdict(list)
    for size, frames, _ in at_peak.values():
        by_source[source(frames)].append(size)
    print("by source line:")
    for key, sizes in sorted(by_source.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"{sum(sizes) / 2**20:10.1f} MiB {len(sizes):5d} blocks  {key}")
    unknown = sorted((b for b in at_peak.values() if where(b[1]) == "?"), key=lambda b: -b[0])[:8]
    for size, _, index in unknown:  # allocated without Python frames (autograd's thread, C++): the nearest caller
        near = next((trace[j] for j in range(index, -1, -1) if where(trace[j].get("frames", [])) != "?"), {})
        print(f"  ? {size / 2**20:8.1f} MiB at event {index} (stream {trace[index].get('stream')}), after "
              f"{where(near.get('frames', []), 4)}")
    rest = sum(sum(s) for _, s in rows[top:])
    print(f"{rest / 2**20:10.1f} MiB in {max(len(rows) - top, 0)} other groups")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("impl", choices=["ours", "peer", "peer-graphs"])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--context-length", type=int, default=512)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="BenchConfig fields to override (ints and yes/no parsed), e.g. cuda_graph=no")
    ap.add_argument("--save")
    args = ap.parse_args()
    common = dict(preset=args.preset, context_length=args.context_length, precision="bf16", warmup=3, steps=5)
    if args.impl == "ours":  # the fast settings bench picks on CUDA at vocabulary 10,000
        cfg = BenchConfig(**common, compile=True, compile_scope="model", attention="flash_auto", optimizer="fused",
                          loss="unfused", cuda_graph=True)
    else:
        cfg = BenchConfig(**common, impl=args.impl, attention="sdpa")
    for item in args.set:
        key, value = item.split("=", 1)
        parsed = {"yes": True, "no": False}.get(value, int(value) if value.isdigit() else value)
        cfg = replace(cfg, **{key: parsed})
    e2e.matmul_peak_tflops = lambda *a: 1.0  # its operands would be the peak of a small configuration
    torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
    record = run_benchmark(cfg)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"{args.impl} {args.preset}/{args.context_length} {' '.join(args.set)}")
    print(f"{args.impl} {args.preset}/{args.context_length}: step {record.get('step_mean_ms', 0):.2f} ms, "
          f"peak {record.get('peak_memory_gib', 0):.3f} GiB (max_memory_allocated), "
          f"before {record.get('memory_before_gib', 0):.3f} GiB")
    analyse(snapshot, args.top)
    if args.save:
        with open(args.save, "wb") as f:
            pickle.dump(snapshot, f)


if __name__ == "__main__":
    main()
