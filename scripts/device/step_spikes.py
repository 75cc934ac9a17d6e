"""Probe: why some replays of our captured step take 10-15 ms longer than the rest (issue 19).

In every xl/2048 record since session 12 the 4th and 8th measured steps of ``bench``'s captured step run 12-17 ms
over the others (and the 3rd and 9th about 5 ms), while the peer's uncaptured steps do not. Two suspects: the
host (Python's garbage collector pausing before a replay while the GPU idles) and the GPU (its clock dropping at
the power cap). This times replays as ``bench`` does (a synchronize, CUDA events and the host clock around one
call), in rounds with the collector as Python runs it and with it frozen and disabled, alternating, and records
for every step: host ms, event ms, the collections that ran in it (generation, ms), and the SM clock and power
sampled every 20 ms by ``nvidia-smi``.

    python scripts/device/step_spikes.py [--preset xl --context-length 2048 --steps 16 --rounds 4]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import threading
import time

import torch
from tqdm import tqdm

from cs336_systems.bench.e2e import BenchConfig, _captured_step, build_ours
from cs336_systems.configs import get_preset
from cs336_systems.fast import fast_settings


class Sampler:
    """SM clock (MHz) and board power (W) with wall-clock stamps, from ``nvidia-smi -lms``."""

    def __init__(self, period_ms: int = 20):
        self.samples: list[tuple[float, float, float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", str(period_ms)],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                clock, power = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.time(), clock, power))

    def between(self, t0: float, t1: float) -> tuple[float, float]:
        inside = [(c, p) for t, c, p in self.samples if t0 <= t <= t1]
        if not inside:
            return float("nan"), float("nan")
        return statistics.mean(c for c, _ in inside), statistics.mean(p for _, p in inside)

    def stop(self) -> None:
        self.proc.terminate()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="xl")
    p.add_argument("--context-length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=16, help="timed steps a round")
    p.add_argument("--rounds", type=int, default=4, help="rounds, alternating gc as is / frozen and disabled")
    a = p.parse_args()
    device = torch.device("cuda")
    model_cfg = get_preset(a.preset).replace(context_length=a.context_length)
    fast = fast_settings(device, model_cfg.vocab_size)
    print(torch.cuda.get_device_name(), torch.__version__, a.preset, a.context_length, fast.describe(), flush=True)
    cfg = BenchConfig(preset=a.preset, context_length=a.context_length, precision="bf16", compile=fast.compile,
                      compile_scope=fast.compile_scope, attention=fast.attention, optimizer=fast.optimizer,
                      loss=fast.loss, cuda_graph=True, residual_dtype=fast.residual_dtype, rope=fast.rope, warmup=3)
    model, optimizer, loss_fn, _ = build_ours(cfg, model_cfg.model_kwargs(), device)
    batch = model_cfg.batch_size
    x = torch.randint(0, model_cfg.vocab_size, (batch, a.context_length), device=device)
    y = torch.randint(0, model_cfg.vocab_size, (batch, a.context_length), device=device)
    captured = _captured_step(cfg, model, optimizer, loss_fn, device)
    for _ in range(3):  # two eager steps, then the capture and its first replay (bench's warm-up)
        captured(x, y)
    torch.cuda.synchronize()
    print(f"tracked objects after the capture: {len(gc.get_objects())}", flush=True)

    collections: list[tuple[float, float, int]] = []
    started: dict[int, float] = {}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[info["generation"]] = time.perf_counter()
        else:
            collections.append((started.pop(info["generation"], time.perf_counter()), time.perf_counter(),
                                info["generation"]))

    gc.callbacks.append(on_gc)
    sampler = Sampler()
    time.sleep(0.5)
    summary = []
    for r in range(a.rounds):
        frozen = r % 2 == 1
        if frozen:
            gc.collect()
            gc.freeze()
            gc.disable()
        rows = []
        for _ in tqdm(range(a.steps), delay=2, leave=False):  # as bench's loop runs (tqdm allocates too)
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            wall0, t0 = time.time(), time.perf_counter()
            captured(x, y)
            stop.record()
            torch.cuda.synchronize()
            t1, wall1 = time.perf_counter(), time.time()
            gcs = [(g, (e - s) * 1e3) for s, e, g in collections if t0 <= s <= t1]
            clock, power = sampler.between(wall0, wall1)
            rows.append({"host_ms": (t1 - t0) * 1e3, "event_ms": start.elapsed_time(stop), "gc": gcs,
                         "sm_mhz": clock, "power_w": power})
        if frozen:
            gc.enable()
            gc.unfreeze()
        label = "gc frozen+disabled" if frozen else "gc as is"
        print(f"--- round {r} ({label})")
        for i, row in enumerate(rows):
            gcs = " ".join(f"g{g}:{ms:.1f}ms" for g, ms in row["gc"])
            print(f"{i:3d} host {row['host_ms']:7.2f} event {row['event_ms']:7.2f}  sm {row['sm_mhz']:6.0f} MHz  "
                  f"{row['power_w']:5.0f} W  {gcs}")
        host = [row["host_ms"] for row in rows]
        summary.append({"round": r, "gc": label, "mean_ms": statistics.mean(host), "median_ms": statistics.median(host),
                        "max_ms": max(host), "gc_ms": sum(ms for row in rows for _, ms in row["gc"]),
                        "mean_sm_mhz": statistics.mean(row["sm_mhz"] for row in rows)})
    sampler.stop()
    for s in summary:
        print(json.dumps(s))


if __name__ == "__main__":
    main()
