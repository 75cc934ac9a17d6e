"""How much the MFU denominator depends on the GPU's state when it is measured (issue 19).

``bench`` measures the bf16 matmul peak (``profiling.timing.matmul_peak_tflops``: 8192^3 products, ``do_bench``
median of 500 ms) once per run, before any configuration runs. Runs in one lease read 693 and 747 TFLOP/s
(session 25), 694 and 751 (session 24). This measures it cold, then the throughput of the same product sustained
for ``--seconds`` (per-second windows), then the peak again hot and after ``--rest`` seconds idle, with the SM
clock, temperature and power that ``nvidia-smi`` reports at each point.

    python scripts/device/matmul_peak_states.py [--seconds 30 --rest 20]
"""

from __future__ import annotations

import argparse
import subprocess
import time

import torch

from cs336_systems.profiling.timing import matmul_peak_tflops

N = 8192


def smi() -> str:
    q = "clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"


def peak(label: str) -> float:
    tf = matmul_peak_tflops.__wrapped__("cuda", torch.bfloat16)  # uncached: measured now
    print(f"{label:28s} {tf:6.1f} TFLOP/s   [{smi()}]", flush=True)
    return tf


def sustained(seconds: float) -> list[float]:
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    windows = []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        n = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:
            for _ in range(50):
                a @ b
            n += 50
            torch.cuda.synchronize()
        stop.record()
        stop.synchronize()
        tf = 2 * N**3 * n / (start.elapsed_time(stop) * 1e-3) / 1e12
        windows.append(tf)
        if len(windows) % 5 == 1:
            print(f"  sustained window {len(windows):3d}: {tf:6.1f} TFLOP/s   [{smi()}]", flush=True)
    return windows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rest", type=float, default=20.0)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    cold = peak("cold (bench's measurement)")
    w = sustained(a.seconds)
    hot = peak("right after the sustained run")
    time.sleep(a.rest)
    rested = peak(f"after {a.rest:.0f} s idle")
    last = sorted(w[-10:])[len(w[-10:]) // 2]
    print(f"summary: cold {cold:.1f}, sustained first window {w[0]:.1f}, median of the last 10 windows {last:.1f}, "
          f"hot {hot:.1f}, rested {rested:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
