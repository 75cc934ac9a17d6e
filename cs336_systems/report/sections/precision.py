"""mixed_precision_accumulation and benchmarking_mixed_precision (observed dtypes, LayerNorm, bf16 timing)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.configs import HANDOUT_PRESETS
from cs336_systems.report.sections._common import load, ok, provenance, table

PROBLEM_IDS = ("mixed_precision_accumulation", "benchmarking_mixed_precision")


def _accumulation(ctx) -> str | None:
    rows = load(ctx, "mixed_precision_accumulation", ("loop",))
    if not rows:
        return None
    by = {r["loop"]: r for r in rows}
    df = pd.DataFrame([{k: r[k] for k in ("loop", "result", "exact", "abs_error", "summand_as_stored")} for r in rows])
    f32, f16 = by.get("fp32 += fp32"), by.get("fp16 += fp16")
    mixed = by.get("fp32 += fp16.to(fp32)")
    text = ""
    if f32 and f16 and mixed:
        text = (f"Adding 0.01 a thousand times gives {f32['result']:.6f} in fp32 (error {f32['abs_error']:.1e}: 0.01 "
                f"is not exact in binary and each add rounds to 24 bits), but {f16['result']:.4f} with an fp16 "
                f"accumulator (error {f16['abs_error']:.3f}): once the sum is near 10, fp16's spacing is 2^-7 = "
                f"0.0078, so every +0.01 is rounded to a multiple of it. With an fp32 accumulator and fp16 summands "
                f"the result is {mixed['result']:.5f}: the only error left is fp16's representation of 0.01 "
                f"({mixed['summand_as_stored']:.8f}) times 1000, whether the upcast is implicit or explicit. "
                f"Hence low-precision inputs are fine, but accumulations must be kept in fp32.")
        ctx.answer("mixed_precision_accumulation",
                   f"1000 x 0.01: fp32 {f32['result']:.6f}, fp16 accumulator {f16['result']:.4f}, fp32 accumulator "
                   f"with fp16 summands {mixed['result']:.5f}: accumulate in fp32")
    return "\n".join(["## mixed_precision_accumulation\n", provenance(rows) + "\n", table(df, ".8g") + "\n",
                      text + "\n"])


def _mixed(ctx) -> str | None:
    toy = load(ctx, "benchmarking_mixed_precision", ("kind", "autocast"), where={"kind": "toy_dtypes"})
    ln = load(ctx, "benchmarking_mixed_precision", ("kind", "dtype"), where={"kind": "layernorm_range"})
    bench = load(ctx, "benchmarking_script", ("preset", "context_length", "mode", "precision", "compile", "attention",
                                              "checkpoint", "optimizer", "warmup", "study"),
                 where={"study": "sweep", "compile": False, "checkpoint": "none", "attention": "reference"})
    if not (toy or bench):
        return None
    parts = ["## benchmarking_mixed_precision\n"]
    if toy:
        parts += ["### (a) Observed dtypes of the toy model under autocast\n", provenance(toy) + "\n"]
        df = pd.DataFrame(toy).set_index("autocast")
        cols = ["parameters (inside autocast)", "fc1 output", "relu output", "layernorm output", "logits", "loss",
                "gradients"]
        parts.append(df[cols].T.to_markdown() + "\n")
        fp16 = next((t for t in toy if t["autocast"] == "fp16"), None)
        if fp16:
            parts.append(f"Read off the tensors on {fp16['device']}: parameters stay "
                         f"{fp16['parameters (inside autocast)']} "
                         f"inside autocast (it casts copies for each matmul, not the parameters), the fc1 output is "
                         f"{fp16['fc1 output']}, LayerNorm's output is {fp16['layernorm output']} (autocast runs "
                         f"layer_norm in fp32), the logits are {fp16['logits']}, the loss {fp16['loss']} and the "
                         f"gradients {fp16['gradients']} (gradients take the dtype of the fp32 parameters).\n")
            ctx.answer("benchmarking_mixed_precision",
                       f"under fp16 autocast: parameters {fp16['parameters (inside autocast)']}, fc1 output "
                       f"{fp16['fc1 output']}, LayerNorm output {fp16['layernorm output']}, logits {fp16['logits']}, "
                       f"loss {fp16['loss']}, gradients {fp16['gradients']}")
    if ln:
        by = {r["dtype"]: r for r in ln}
        parts += ["### (b) LayerNorm in low precision\n", provenance(ln) + "\n",
                  table(pd.DataFrame(ln)[["dtype", "input_scale", "variance", "reference_fp64", "finite",
                                          "rel_error"]], ".4g") + "\n"]
        if {"fp16", "bf16"} <= set(by):
            parts.append(
                f"LayerNorm's sensitive parts are the mean and especially the variance (a sum of squares) and the "
                f"division by its square root: for activations of size {by['fp16']['input_scale']:.0f} the squares "
                f"exceed fp16's largest value ({by['fp16']['max_finite']:.0f}), and the variance computed in fp16 is "
                f"{'inf' if not by['fp16']['finite'] else by['fp16']['variance']}; the summation also loses low bits. "
                f"bf16 has fp32's exponent range, so the variance stays finite (relative error "
                f"{by['bf16']['rel_error']:.1e} from its 8-bit mantissa): with bf16 overflow is no longer the "
                f"problem, but the reduction should still accumulate in fp32 for accuracy, which is why autocast "
                f"and our RMSNorm keep normalisation in fp32 either way.\n")
    both = ok(bench)
    if both:
        parts.append("### (c) fp32 vs bf16 autocast, end to end (batch 4, context 512)\n")
        parts.append(provenance(both) + "\n")
        rows = []
        for preset in [p for p in ("tiny", *HANDOUT_PRESETS) if any(r["preset"] == p for r in both)]:
            for mode in ("forward", "forward-backward", "train-step"):
                same = [r for r in both if r["preset"] == preset and r["mode"] == mode]
                f = next((r for r in same if r["precision"] == "fp32"), None)
                b = next((r for r in same if r["precision"] == "bf16"), None)
                if f and b:
                    rows.append({"preset": preset, "mode": mode, "fp32 fwd ms": f["forward_mean_ms"],
                                 "bf16 fwd ms": b["forward_mean_ms"],
                                 "fp32 bwd ms": f.get("backward_mean_ms"), "bf16 bwd ms": b.get("backward_mean_ms"),
                                 "fp32 step ms": f["step_mean_ms"], "bf16 step ms": b["step_mean_ms"],
                                 "speedup": f["step_mean_ms"] / b["step_mean_ms"],
                                 "fp32 peak GiB": f["peak_memory_gib"], "bf16 peak GiB": b["peak_memory_gib"]})
        if rows:
            df = pd.DataFrame(rows)
            parts.append(table(df) + "\n")
            tr = df[df["mode"] == "train-step"]
            if len(tr):
                fig, ax = plt.subplots(figsize=(7, 3.5))
                x = range(len(tr))
                ax.bar([i - 0.2 for i in x], tr["fp32 step ms"], 0.4, label="fp32")
                ax.bar([i + 0.2 for i in x], tr["bf16 step ms"], 0.4, label="bf16 autocast")
                ax.set_xticks(list(x), tr["preset"])
                ax.set_ylabel("train step (ms)")
                ax.set_title("Full training step, batch 4, context 512")
                ax.legend()
                ax.grid(axis="y", alpha=0.3)
                fig.tight_layout()
                path = ctx.figure_path("mixed_precision_step_time.png")
                fig.savefig(path, dpi=110)
                plt.close(fig)
                parts.append(f"![train step time fp32 vs bf16]({ctx.link(path)})\n")
                s = tr.set_index("preset")["speedup"]
                parts.append(
                    f"bf16 autocast speeds a training step up by {s.min():.2f}x ({s.idxmin()}) to {s.max():.2f}x "
                    f"({s.idxmax()}). The gain grows with model size because larger models spend a larger share "
                    f"of the step in matmuls, which run on bf16 tensor cores, while small models are dominated by "
                    f"elementwise kernels, casts (autocast re-casts the fp32 weights every forward) and launch "
                    f"overhead that bf16 does not shorten; the optimizer step stays fp32 either way.\n")
                ctx.answer("benchmarking_mixed_precision", f"bf16 autocast speeds a train step up {s.min():.2f}x "
                           f"({s.idxmin()}) to {s.max():.2f}x ({s.idxmax()})")
    return "\n".join(parts)


def build(ctx) -> str | None:
    parts = [p for p in (_accumulation(ctx), _mixed(ctx)) if p]
    return "\n".join(parts) or None
