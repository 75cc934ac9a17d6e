"""mfu_target: the issue's performance target, xl / context 512 / batch 4 / bf16 train step at 50% MFU."""

from __future__ import annotations

import pandas as pd

from cs336_systems.report.sections._common import load, ok, provenance, table

PROBLEM_IDS = ("mfu_target",)
TARGET = 0.5


def build(ctx) -> str | None:
    rows = load(ctx, "mfu_target", ("preset", "context_length", "mode", "precision", "compile", "attention",
                                    "optimizer", "checkpoint", "batch_size"))
    if not rows:
        return None
    # the eager reference baseline from the end-to-end sweep, for comparison
    base = ok(load(ctx, "benchmarking_script", ("preset", "context_length", "mode", "precision", "compile",
                                                 "attention", "optimizer", "checkpoint", "study"),
                   where={"preset": "xl", "context_length": 512, "mode": "train-step", "precision": "bf16",
                          "compile": False, "attention": "reference", "study": "sweep"}))
    allrows = base + rows
    df = pd.DataFrame([{"attention": r["attention"], "compile": r["compile"], "optimizer": r.get("optimizer", "ours"),
                        "status": r["status"], "forward ms": r.get("forward_mean_ms"),
                        "backward ms": r.get("backward_mean_ms"), "optimizer ms": r.get("optimizer_mean_ms"),
                        "step ms": r.get("step_mean_ms"), "TFLOP/s": r.get("model_tflops"), "MFU": r.get("mfu"),
                        "fwd+bwd MFU": (r["model_flops_per_step"] / ((r["forward_mean_ms"] + r["backward_mean_ms"])
                                                                      * 1e-3) / 1e12 / r["peak_tflops"]
                                        if r.get("status") == "ok" else None),
                        "peak GiB": r.get("peak_memory_gib")} for r in allrows])
    parts = ["## mfu_target\n",
             "Target: for `xl`, context 512, batch 4, bf16 autocast, full train step, reach 50% of the measured bf16 "
             "matmul peak. The first row (if present) is the eager reference-attention baseline of the sweep.\n",
             provenance(allrows) + "\n", table(df.astype(object).fillna("")) + "\n"]
    good = ok(rows)
    if good:
        best = max(good, key=lambda r: r["mfu"])
        fb = best["forward_mean_ms"] + best["backward_mean_ms"]
        opt = best.get("optimizer_mean_ms", 0.0)
        ideal_ms = best["model_flops_per_step"] / (best["peak_tflops"] * 1e12) * 1e3
        verdict = "reaches" if best["mfu"] >= TARGET else "does not reach"
        parts.append(
            f"The best combination ({best['attention']} attention, "
            f"{'compiled' if best['compile'] else 'eager'}, {best.get('optimizer', 'ours')} AdamW) runs a step in "
            f"{best['step_mean_ms']:.1f} ms, {best['model_tflops']:.0f} TFLOP/s against a measured peak of "
            f"{best['peak_tflops']:.0f} TFLOP/s: MFU {100 * best['mfu']:.1f}%, which {verdict} the 50% target. "
            f"At the peak, the step's {best['model_flops_per_step'] / 1e12:.1f} TFLOP would take {ideal_ms:.1f} ms. "
            f"Where the rest goes: the optimizer takes {opt:.1f} ms ({100 * opt / best['step_mean_ms']:.0f}% of the "
            f"step) doing no model FLOPs (it streams the fp32 parameters, gradients and two moments, 16 bytes per "
            f"parameter read and 12 written, through memory); forward + backward alone run at "
            f"{100 * best['model_flops_per_step'] / (fb * 1e-3) / 1e12 / best['peak_tflops']:.1f}% MFU, held back by "
            f"the batch of only {best['batch_size']} x {best['context_length']} = "
            f"{best['batch_size'] * best['context_length']} tokens (matmuls of "
            f"{best['batch_size'] * best['context_length']} rows fill the GPU less well than the 8192^3 product "
            f"that sets the peak), autocast's per-step casts of the fp32 weights to bf16, and the remaining "
            f"memory-bound elementwise kernels.\n")
        ctx.answer("mfu_target", f"best {100 * best['mfu']:.1f}% MFU ({best['attention']}, "
                   f"{'compiled' if best['compile'] else 'eager'}, {best.get('optimizer', 'ours')} AdamW, "
                   f"{best['step_mean_ms']:.1f} ms/step): target 50% {'met' if best['mfu'] >= TARGET else 'NOT met'}")
        ctx.versus("mfu_target", f"{best['preset']} train step, bf16, context {best['context_length']}",
                   f"MFU {100 * best['mfu']:.1f}% ({best['step_mean_ms']:.1f} ms)", "– (no PyTorch peer)", None,
                   "MFU >= 50%")
    return "\n".join(parts)
