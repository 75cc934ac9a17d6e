"""Where the captured training step's wall time goes: kernels, and the GPU's idle time between them (issue 19).

Builds our step with ``bench``'s CUDA defaults (``fast_settings``; xl/2048 unless told), captures it as one CUDA
graph, times replays with events, then profiles replays with ``torch.profiler`` and reads the GPU timeline from
its trace: busy time (the union of kernel and memset intervals), idle time between them, the largest gaps with the
kernels on either side, and kernel time by family. ``--variant`` applies ``step_variants.py``'s patches first (one
process per variant); ``--uncaptured`` also profiles the step launched from the host, before the capture.

    python scripts/device/graph_step_profile.py [--preset xl --context-length 2048] [--variant V] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time

import torch
from step_variants import PATCHES
from torch.profiler import ProfilerActivity, profile

from cs336_systems.bench.e2e import BenchConfig, _captured_step, build_ours
from cs336_systems.configs import get_preset
from cs336_systems.fast import apply_cublas_workspace, fast_settings

FAMILIES = (("nvjet", "cuBLAS"), ("gemm", "cuBLAS"), ("cudnn", "cuDNN attention"), ("sdpa", "cuDNN attention"),
            ("_hopper_", "our attention"), ("_flash_", "our attention"), ("_adamw", "optimizer"), ("rope", "RoPE"),
            ("swiglu", "SwiGLU (fused GEMMs)"), ("sigmoid", "SwiGLU"), ("rsqrt", "norm fwd"), ("pow_sum", "norm bwd"),
            ("reduce_kernel", "aten reduce"), ("Memset", "memset"), ("triton", "other Triton"))


def family(name: str) -> str:
    for key, fam in FAMILIES:
        if key.lower() in name.lower():
            return fam
    return "other"


def gpu_timeline(prof, keep: str | None = None) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of the GPU's kernels, memsets and copies; ``keep``: also write the trace there."""
    with tempfile.TemporaryDirectory() as tmp:
        path = keep or os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    spans = [(e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
             if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    return sorted(spans)


def analyse(spans, steps: int, label: str) -> None:
    if not spans:
        print(f"{label}: the trace holds no GPU events")
        return
    busy = idle = 0.0
    gaps = []
    end = spans[0][0]
    prev = ""
    for s, e, name in spans:
        if s > end:
            idle += s - end
            gaps.append((s - end, prev, name))
        busy += max(0.0, e - max(s, end))
        if e > end:
            end, prev = e, name
    wall = spans[-1][1] - spans[0][0]
    by_family = collections.Counter()
    count = collections.Counter()
    for s, e, name in spans:
        by_family[family(name)] += e - s
        count[family(name)] += 1
    print(f"{label}: {len(spans) / steps:.0f} GPU events a step; per step: span {wall / steps / 1e3:.2f} ms, busy "
          f"{busy / steps / 1e3:.2f} ms, idle {idle / steps / 1e3:.2f} ms in {len(gaps) / steps:.0f} gaps")
    sizes = [g[0] for g in gaps]
    for lo, hi in ((0, 1), (1, 2), (2, 5), (5, 20), (20, 1e9)):
        sel = [g for g in sizes if lo <= g < hi]
        print(f"  gaps {lo:>3}-{hi if hi < 1e9 else 'inf'} us: {len(sel) / steps:7.1f} a step, "
              f"{sum(sel) / steps / 1e3:6.2f} ms")
    for fam, t in by_family.most_common():
        print(f"  {fam:16s} {t / steps / 1e3:8.2f} ms  {count[fam] / steps:6.0f} events")
    by_name, name_count = collections.Counter(), collections.Counter()
    for s, e, name in spans:
        by_name[name] += e - s
        name_count[name] += 1
    print("  kernels by name (ms a step, calls a step, us a call):")
    for name, t in by_name.most_common(25):
        print(f"    {t / steps / 1e3:8.2f} ms {name_count[name] / steps:6.0f} x {t / name_count[name]:8.1f} us  "
              f"{name[:90]}")
    print("  largest gaps (us, before -> after):")
    for g, a, b in sorted(gaps, reverse=True)[:12]:
        print(f"    {g:8.1f}  {a[:60]} -> {b[:60]}")
    after = collections.Counter()
    for g, _before, b in gaps:
        after[family(b)] += g
    print("  idle time by the family of the kernel after the gap (ms a step): "
          + ", ".join(f"{k} {v / steps / 1e3:.2f}" for k, v in after.most_common()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="xl")
    p.add_argument("--context-length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3, help="replays profiled")
    p.add_argument("--out", default=None, help="folder for the captured replays' trace (gzip)")
    p.add_argument("--variant", default="base", help="step_variants.py's PATCHES, joined with +")
    p.add_argument("--uncaptured", action="store_true", help="also profile the step launched from the host")
    p.add_argument("--around", default=None, help="print the kernels on either side of the first calls of kernels "
                   "whose name contains this (where a kernel sits in the step)")
    a = p.parse_args()
    for name in a.variant.split("+"):
        if name not in PATCHES:
            raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(PATCHES)} (joined with +)")
        PATCHES[name]()
    device = torch.device("cuda")
    model_cfg = get_preset(a.preset).replace(context_length=a.context_length)
    fast = fast_settings(device, model_cfg.vocab_size, model_cfg.d_model, model_cfg.batch_size * a.context_length)
    # bench's setting, applied before the process's first matmul as run_benchmark does (until session 30 this script
    # left cuBLAS its default workspace: at xl/2048 531 memset nodes more a step, and graph.replay() took 6.1 ms of
    # host time against 0.05)
    workspace = apply_cublas_workspace(fast.cublas_workspace)
    print(torch.cuda.get_device_name(), torch.__version__, a.preset, a.context_length, a.variant, fast.describe(),
          f"CUBLAS_WORKSPACE_CONFIG={workspace!r}")
    cfg = BenchConfig(preset=a.preset, context_length=a.context_length, precision="bf16", compile=fast.compile,
                      compile_scope=fast.compile_scope, attention=fast.attention, optimizer=fast.optimizer,
                      loss=fast.loss, cuda_graph=True, residual_dtype=fast.residual_dtype, rope=fast.rope, ffn=fast.ffn,
                      cublas_workspace=fast.cublas_workspace,
                      warmup=3 + a.steps)  # eager calls: two that compile, the profiled ones, then the capture
    model, optimizer, loss_fn, _ = build_ours(cfg, model_cfg.model_kwargs(), device)
    batch = model_cfg.batch_size
    x = torch.randint(0, model_cfg.vocab_size, (batch, a.context_length), device=device)
    y = torch.randint(0, model_cfg.vocab_size, (batch, a.context_length), device=device)
    captured = _captured_step(cfg, model, optimizer, loss_fn, device)
    # an event recorded first inside the step (a node of the graph once captured): how long a replay launched from
    # a synchronised start takes to reach its first node
    first = torch.cuda.Event(enable_timing=True, external=True)
    step_fn = captured.step_fn

    def marked(*inputs):
        first.record()
        return step_fn(*inputs)

    captured.step_fn = marked
    for _ in range(2):
        captured(x, y)
    torch.cuda.synchronize()
    # the same step uncaptured (the compiled model, autograd and the optimizer launched from the host), profiled
    # before the capture: after it the graph's pool holds a step's activations
    uncaptured = None
    if a.uncaptured:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(a.steps):
                captured(x, y)
            torch.cuda.synchronize()
        uncaptured = gpu_timeline(prof)
    for _ in range(3):
        captured(x, y)
    times = []
    for _ in range(20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        captured(x, y)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    assert captured.captured
    print(f"captured step: median {statistics.median(times):.2f} ms, mean {statistics.mean(times):.2f}, "
          f"min {min(times):.2f} (20 replays)")
    # the host's share of a step that bench times between synchronisations: the call up to the replay's launch
    # (input copies, the optimizer's table upload, cudaGraphLaunch), the GPU idle meanwhile; by events, a call's
    # wall time from a synchronised start, against graph.replay()'s alone below
    host, bookkeeping, called = [], [], []
    for _ in range(10):
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        captured(x, y)
        host.append((time.perf_counter() - t0) * 1e3)
        stop.record()
        stop.synchronize()
        called.append(start.elapsed_time(stop))
    after = []
    for _ in range(10):  # the optimizer's bookkeeping alone (counts steps the replays above do not take: a probe)
        t0 = time.perf_counter()
        optimizer.before_graph_replay()
        bookkeeping.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        optimizer.after_graph_replay()  # under the replay in a real call
        after.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    launch, waited, to_first = [], [], []
    for _ in range(10):  # the graph's launch alone, and the wall time of a replay from a synchronised start
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        captured.graph.replay()
        launch.append((time.perf_counter() - t0) * 1e3)
        stop.record()
        stop.synchronize()
        waited.append(start.elapsed_time(stop))
        to_first.append(start.elapsed_time(first))
    print(f"host time a call, synchronised before: median {statistics.median(host):.3f} ms (captured(x, y)); the "
          f"optimizer's before_graph_replay {statistics.median(bookkeeping):.3f} ms, after_graph_replay (under the "
          f"replay) {statistics.median(after):.3f} ms; graph.replay() alone {statistics.median(launch):.3f} ms; wall "
          f"time from a synchronised start: a call {statistics.median(called):.2f} ms, a replay alone "
          f"{statistics.median(waited):.2f} ms, of which {statistics.median(to_first):.3f} ms before its first node")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            captured(x, y)
        torch.cuda.synchronize()
    spans = gpu_timeline(prof, a.out and os.path.join(a.out, f"trace-{a.variant}.json"))
    analyse(spans, a.steps, "captured replays")
    if a.around:
        hits = [i for i, (_, _, name) in enumerate(spans) if a.around in name][:4]
        for i in hits:
            print(f"  around call {i}:")
            for s, e, name in spans[max(0, i - 4):i + 4]:
                print(f"    {'>' if a.around in name else ' '} {e - s:8.1f} us  {name[:110]}")
    if uncaptured is not None:
        analyse(uncaptured, a.steps, "uncaptured steps")


if __name__ == "__main__":
    main()
