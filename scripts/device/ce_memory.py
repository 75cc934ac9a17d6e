"""Peak memory and time of the fused LM head + loss at the 8b preset's vocabulary (151,936), batch 2 x 32,768,
d_model 4096, bf16 (what the issue asks to be a small fraction of the 20 GB that bf16 logits take).
Writes one record to results/training_step/."""

from __future__ import annotations

import sys

import torch
from triton.testing import do_bench

from cs336_systems.configs import get_preset
from cs336_systems.fused.linear_cross_entropy import linear_cross_entropy
from cs336_systems.records import write_records


def main() -> None:
    cfg = get_preset("8b")
    n, d, v = cfg.batch_size * cfg.context_length, cfg.d_model, cfg.vocab_size
    dev = torch.device("cuda")
    h = (torch.randn(n, d, device=dev) / 4).bfloat16().requires_grad_()
    w = (torch.randn(v, d, device=dev) / 64).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device=dev)

    def step():
        h.grad = w.grad = None
        linear_cross_entropy(h, w, t).backward()

    step()  # warm-up
    h.grad = w.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    ms = do_bench(step, warmup=1, rep=5, return_mode="median")
    logits_bf16 = n * v * 2
    flops = 3 * 2 * n * d * v
    row = {"check": "fused_ce_memory", "tokens": n, "d_model": d, "vocab": v, "inputs_gib": base / 2**30,
           "peak_gib": peak / 2**30, "peak_above_inputs_gib": (peak - base) / 2**30,
           "bf16_logits_gib": logits_bf16 / 2**30, "fraction_of_bf16_logits": (peak - base) / logits_bf16,
           "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
    path = write_records("training_step", [row], sys.argv[1] if len(sys.argv) > 1 else "results", device=dev)
    print(f"fused CE at 8b vocab: peak {row['peak_gib']:.2f} GiB ({row['peak_above_inputs_gib']:.2f} above inputs "
          f"= {row['fraction_of_bf16_logits']:.1%} of the {row['bf16_logits_gib']:.1f} GiB bf16 logits), "
          f"{ms:.1f} ms, {row['tflops']:.0f} TFLOP/s -> {path}")


if __name__ == "__main__":
    main()
