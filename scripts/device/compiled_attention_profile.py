"""Where our attention's time goes inside a compiled model (issue 18, item 5), on the GPU.

1. Host microseconds per call (no synchronisation in the loop) at one layer's shape: the opaque custom ops that
   compiled models call (``torch.ops.cs336_systems.flash_fwd`` / ``flash_bwd``), the launchers they wrap, and
   SDPA (cuDNN) for reference.
2. The model: our preset with compiled blocks, bf16, the fused optimizer and loss (and ``--residual-dtype``), for
   each ``--attention``:
   per phase, the host time to enqueue (no synchronisation) against the synchronised time (enqueue close to
   the total: the phase is host-bound), then one profiled step (``torch.profiler``; tables of the top ops by
   self CPU time and by device time, and a compressed Chrome trace) under ``--out``.

    python scripts/device/compiled_attention_profile.py --preset xl --context-length 512 --out $OUT/profile
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention import flash_triton as ft
from cs336_systems.bench.e2e import BenchConfig, autocast_context, build_ours
from cs336_systems.configs import get_preset

sys.path.insert(0, str(Path(__file__).parent))
from flash_host import host_us  # this folder's scripts run as files, not as a package


def op_costs(batch: int, heads: int, seq: int, d: int) -> None:
    q, k, v, do = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = d ** -0.5
    o, lse = ft._forward(q, k, v, None, None, 0, None, None, scale)
    rows = {
        "custom op flash_fwd": lambda: torch.ops.cs336_systems.flash_fwd(q, k, v, None, None, -1, 0, scale),
        "launcher _forward": lambda: ft._forward(q, k, v, None, None, 0, None, None, scale),
        "custom op flash_bwd": lambda: torch.ops.cs336_systems.flash_bwd(q, k, v, o, lse, do, None, None, -1, 0,
                                                                          scale, False),
        "launcher _backward": lambda: ft._backward(q, k, v, o, lse, do, None, False, None, 0, None, None, scale),
    }
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        rows["sdpa cudnn forward"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        print(f"host us per call at {batch} x {heads} x {seq} x {d} (bf16, causal):")
        for name, call in rows.items():
            print(f"  {name:24s} {host_us(call):8.1f}")


def phase_times(cfg: BenchConfig, out: Path, steps: int) -> None:
    device = torch.device("cuda")
    model_cfg = get_preset(cfg.preset).replace(context_length=cfg.context_length)
    model, optimizer, loss_fn, _ = build_ours(cfg, model_cfg.model_kwargs(), device)
    x = torch.randint(0, model_cfg.vocab_size, (model_cfg.batch_size, cfg.context_length), device=device)
    y = torch.randint(0, model_cfg.vocab_size, (model_cfg.batch_size, cfg.context_length), device=device)
    times: dict[str, list[float]] = {k: [] for k in ("fwd enqueue", "fwd", "bwd enqueue", "bwd", "opt")}

    def step(record: bool) -> None:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast_context("bf16", device):
            loss = loss_fn(x, y)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        optimizer.step()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t5 = time.perf_counter()
        if record:
            for key, dt in zip(times, (t1 - t0, t2 - t0, t3 - t2, t4 - t2, t5 - t4), strict=True):
                times[key].append(dt * 1e3)

    for i in range(3 + steps):
        step(i >= 3)
    print(f"{cfg.attention}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in times.items()))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(False)
    averages = prof.key_averages()
    text = (averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70) + "\n"
            + averages.table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70))
    (out / f"profile-{cfg.attention}.txt").write_text(text)
    trace = out / f"trace-{cfg.attention}.json"
    prof.export_chrome_trace(str(trace))
    with trace.open("rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="xl")
    parser.add_argument("--context-length", type=int, default=512)
    parser.add_argument("--attention", nargs="+", default=["flash_triton", "sdpa"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--residual-dtype", default="bf16", choices=["fp32", "bf16"],
                        help="the residual stream (bf16: the fast default on CUDA)")
    parser.add_argument("--compile-scope", default="blocks", choices=["blocks", "model"])
    parser.add_argument("--rope", default="torch", choices=["torch", "triton"])
    parser.add_argument("--out", type=Path, default=Path("profile"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    preset = get_preset(args.preset)
    op_costs(preset.batch_size, preset.num_heads, args.context_length, preset.d_model // preset.num_heads)
    for attention in args.attention:
        cfg = BenchConfig(preset=args.preset, context_length=args.context_length, precision="bf16", compile=True,
                          compile_scope=args.compile_scope, attention=attention, optimizer="fused", loss="fused",
                          residual_dtype=args.residual_dtype, rope=args.rope)
        phase_times(cfg, args.out, args.steps)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
