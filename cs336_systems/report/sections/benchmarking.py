"""benchmarking_script: forward / backward / optimizer times per preset, variability, warm-up study."""

from __future__ import annotations

import statistics

import pandas as pd

from cs336_systems.configs import HANDOUT_PRESETS
from cs336_systems.report.sections._common import load, ok, provenance, table

PROBLEM_IDS = ("benchmarking_script",)
KEYS = ("preset", "context_length", "mode", "precision", "compile", "attention", "checkpoint", "optimizer", "warmup",
        "study", "batch_size")


def _order(df: pd.DataFrame) -> pd.DataFrame:
    order = {p: i for i, p in enumerate(("tiny", *HANDOUT_PRESETS))}
    return df.assign(_o=df.preset.map(order)).sort_values(["_o", "mode", "precision"]).drop(columns="_o")


def _sweep_table(rows: list[dict]) -> pd.DataFrame:
    out = []
    for r in rows:
        row = {"preset": r["preset"], "mode": r["mode"], "precision": r["precision"], "status": r["status"]}
        if r["status"] == "ok":
            for ph in ("forward", "backward", "optimizer"):
                if f"{ph}_mean_ms" in r:
                    row[f"{ph} ms (mean ± std)"] = f"{r[f'{ph}_mean_ms']:.2f} ± {r[f'{ph}_std_ms']:.2f}"
            row.update({"step ms (median / min)": f"{r['step_median_ms']:.2f} / {r['step_min_ms']:.2f}",
                        "CUDA-event step ms": r.get("step_event_mean_ms"), "tokens/s": r["tokens_per_s"],
                        "TFLOP/s": r["model_tflops"], "matmul peak TFLOP/s": r["peak_tflops"], "MFU": r["mfu"],
                        "peak GiB": r["peak_memory_gib"]})
        out.append(row)
    df = pd.DataFrame(out)
    first = ["preset", "mode", "precision", "status"] + [c for c in df.columns if c.endswith("(mean ± std)")]
    df = df[first + [c for c in df.columns if c not in first]]
    return _order(df).astype(object).fillna("")


def build(ctx) -> str | None:
    rows = load(ctx, "benchmarking_script", KEYS)
    sweep = [r for r in rows if r.get("study", "sweep") == "sweep" and r.get("checkpoint", "none") == "none"
             and not r.get("compile") and r.get("optimizer", "ours") == "ours" and r.get("attention") == "reference"]
    warm = ok(load(ctx, "benchmarking_script", KEYS, where={"study": "warmup"}))
    if not (sweep or warm):
        return None
    parts = ["## benchmarking_script\n",
             "`cs336-systems bench` builds a `BasicsTransformerLM` with random weights, a random batch, runs the "
             "warm-up steps, then times each measured step phase by phase with `timeit.default_timer()` and "
             "`torch.cuda.synchronize()` around every phase, with CUDA events around the same regions as a "
             "cross-check. "
             "MFU is model FLOPs (6N + 12LTd per token for training, a third of it for forward only; "
             "`cs336_systems.configs`) over the matmul peak measured on the same device in the same precision.\n",
             provenance(sweep) + "\n"]
    fp32 = ok([r for r in sweep if r["precision"] == "fp32"])
    if sweep:
        parts.append("### (b) Timings per model size (fp32, batch 4, context 512)\n")
        parts.append(table(_sweep_table([r for r in sweep if r["precision"] == "fp32"]), ".3g") + "\n")
    train = {r["preset"]: r for r in fp32 if r["mode"] == "train-step"}
    if train:
        ratios = [r["backward_mean_ms"] / r["forward_mean_ms"] for r in train.values()]
        cvs = [r["step_std_ms"] / r["step_mean_ms"] for r in fp32]
        biggest = max(train.values(), key=lambda r: r["n_params"])
        smallest = min(train.values(), key=lambda r: r["n_params"])
        parts.append(
            f"A forward pass takes {smallest['forward_mean_ms']:.1f} ms ({smallest['preset']}) up to "
            f"{biggest['forward_mean_ms']:.1f} ms ({biggest['preset']}); the backward pass takes "
            f"{min(ratios):.2f}x to {max(ratios):.2f}x as long as the forward (about 2x is expected: gradients "
            f"with respect to both inputs and weights), and the optimizer step {smallest['optimizer_mean_ms']:.1f} to "
            f"{biggest['optimizer_mean_ms']:.1f} ms. Variability is small: the standard deviation of a step is "
            f"{100 * statistics.median(cvs):.2f}% of its mean at the median over configurations "
            f"(at most {100 * max(cvs):.2f}%), and the CUDA-event times agree with the synchronised host clock.\n")
        ctx.answer("benchmarking_script",
                   f"fp32 train step: forward {smallest['forward_mean_ms']:.1f} ms ({smallest['preset']}) to "
                   f"{biggest['forward_mean_ms']:.1f} ms ({biggest['preset']}); backward {min(ratios):.2f}-"
                   f"{max(ratios):.2f}x the forward; step std {100 * statistics.median(cvs):.2f}% of the mean (median)")
    oom = [r for r in sweep if r["status"] == "OOM"]
    if oom:
        parts.append("Out of memory (recorded, the sweep went on): "
                     + ", ".join(f"{r['preset']} {r['mode']} {r['precision']}" for r in oom) + ".\n")
    if warm:
        parts.append("### (c) Warm-up study\n")
        parts.append("Each row is a fresh process (so nothing is warm from an earlier configuration), "
                     "with 0, 1, 2 or 5 untimed warm-up steps before the measured ones.\n")
        parts.append(provenance(warm) + "\n")
        df = pd.DataFrame([{"preset": r["preset"], "mode": r["mode"], "warm-up steps": r["warmup"],
                            "first measured step ms": r["step_times_ms"][0],
                            "second measured step ms": r["step_times_ms"][1] if len(r["step_times_ms"]) > 1 else None,
                            "mean ms": r["step_mean_ms"], "std ms": r["step_std_ms"], "median ms": r["step_median_ms"]}
                           for r in sorted(warm, key=lambda r: r["warmup"])])
        parts.append(table(df) + "\n")
        w = {r["warmup"]: r for r in warm}
        if 0 in w and max(w) > 0:
            best = w[max(w)]
            cold = w[0]
            extra = (f" With one warm-up step the mean is {w[1]['step_mean_ms']:.1f} ms (std "
                     f"{w[1]['step_std_ms']:.2f}) and with two {w[2]['step_mean_ms']:.1f} ms (std "
                     f"{w[2]['step_std_ms']:.2f}): the first step pays most of the one-off costs, but the next "
                     f"ones can still differ (the caching allocator is still growing its pool and cuBLAS picks "
                     f"its kernels by heuristics on the first call of each shape, the backward's shapes included), "
                     f"so a couple of steps are not always enough." if 1 in w and 2 in w else "")
            parts.append(
                f"Without warm-up the first measured step takes {cold['step_times_ms'][0]:.1f} ms against a median of "
                f"{best['step_median_ms']:.1f} ms with {max(w)} warm-up steps, which lifts the mean to "
                f"{cold['step_mean_ms']:.1f} ms (vs {best['step_mean_ms']:.1f}) and the standard deviation to "
                f"{cold['step_std_ms']:.1f} ms (vs {best['step_std_ms']:.2f}). The first step pays one-off costs: "
                f"CUDA context and cuBLAS handle creation, loading kernels, and the caching allocator asking the "
                f"driver for memory (cudaMalloc) before it can reuse blocks.{extra}\n")
            ctx.answer("benchmarking_script", f"without warm-up the first step takes {cold['step_times_ms'][0]:.1f} ms "
                       f"against a median of {best['step_median_ms']:.1f} ms after {max(w)} warm-up steps")
    return "\n".join(parts)
