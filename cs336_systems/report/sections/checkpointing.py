"""gradient_checkpointing: the nested strategy, and the measured best k for one level of checkpointing."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.configs import get_preset
from cs336_systems.report.sections._common import load, ok, provenance, table

PROBLEM_IDS = ("gradient_checkpointing",)

SKETCH = '''```python
def run(blocks, x):                      # memory-optimal: recursive bisection
    if len(blocks) == 1:
        return blocks[0](x)
    mid = len(blocks) // 2
    x = checkpoint(run, blocks[:mid], x, use_reentrant=False)
    return checkpoint(run, blocks[mid:], x, use_reentrant=False)
```'''


def _key(r):
    return (0, 0) if r["checkpoint"] == "none" else (2, 0) if r["checkpoint"] == "nested" else (1, int(r["checkpoint"]))


def build(ctx) -> str | None:
    rows = load(ctx, "gradient_checkpointing", ("preset", "context_length", "precision", "checkpoint", "batch_size"))
    if not rows:
        return None
    rows = sorted(rows, key=_key)
    parts = ["## gradient_checkpointing\n",
             "### (a) Memory-optimal nesting\n",
             "Checkpoint recursively by bisection (`--checkpoint nested`, "
             "`cs336_systems.bench.checkpointing.NestedCheckpointedBlocks`): the whole stack is split into two "
             "checkpointed halves, and when a half is recomputed during backward its own two quarters are "
             "checkpointed again, down to single blocks. At any moment only the inputs of the O(log N) segments on "
             "the current recursion path are stored, plus the residuals of the one block being differentiated, so "
             "peak activation memory is O(log N) block inputs + O(1) blocks of residuals; each block's forward is "
             "recomputed once per recursion level, O(N log N) forward compute (vs O(N) without checkpointing). "
             "(With an arbitrary number of checkpoints one can also trade differently, e.g. Chen et al. 2016's "
             "sqrt(N) scheme with O(N) compute.)\n", SKETCH + "\n"]
    good = ok(rows)
    r0 = rows[0]
    cfg = get_preset(r0["preset"])
    parts.append(f"### (b) One level of checkpointing: {r0['preset']}, batch {r0['batch_size']}, context "
                 f"{r0['context_length']}, {r0['precision']}, train step\n")
    parts.append(provenance(rows) + "\n")
    df = pd.DataFrame([{"checkpoint every k blocks": r["checkpoint"], "status": r["status"],
                        "peak GiB": r.get("peak_memory_gib"), "step ms": r.get("step_mean_ms"),
                        "forward ms": r.get("forward_mean_ms"), "backward ms": r.get("backward_mean_ms")}
                       for r in rows])
    parts.append(table(df.astype(object).fillna("")) + "\n")
    flat = [r for r in good if r["checkpoint"] not in ("none", "nested") and r.get("peak_memory_gib") is not None]
    if flat:
        best = min(flat, key=lambda r: r["peak_memory_gib"])
        k = int(best["checkpoint"])
        x_mib = r0["batch_size"] * r0["context_length"] * cfg.d_model * 4 / 2**20
        ks = sorted(int(r["checkpoint"]) for r in flat)
        neighbours = [r for r in flat if int(r["checkpoint"]) in
                      ([kk for kk in ks if kk < k][-1:] + [kk for kk in ks if kk > k][:1])]
        none = next((r for r in rows if r["checkpoint"] == "none"), None)
        nested = next((r for r in good if r["checkpoint"] == "nested"), None)
        none_text = ("runs out of memory" if none and none["status"] == "OOM"
                     else f"peaks at {none['peak_memory_gib']:.2f} GiB" if none else "")
        # residuals of one block, estimated from two measured k: peak(k) ~ const + (N/k) |x| + k R
        parts.append(
            f"With one level of checkpointing in groups of k blocks, the forward keeps N/k = {cfg.num_layers}/k "
            f"group inputs of {x_mib:.0f} MiB each (one fp32 residual-stream tensor) and the backward "
            f"re-materialises one group, k blocks' worth of residuals. A block's residuals are far larger than "
            f"its input (at context {r0['context_length']} they include several {r0['batch_size']} x "
            f"{cfg.num_heads} x {r0['context_length']}^2 attention score tensors), so the sum N/k |x| + k R is "
            f"smallest at the smallest k: the prediction is k = 1. Measured, the lowest peak is "
            f"{best['peak_memory_gib']:.2f} GiB at k = {k}"
            + (", against " + ", ".join(f"{r['peak_memory_gib']:.2f} GiB at k = {r['checkpoint']}" for r in neighbours)
               if neighbours else "")
            + (f"; without checkpointing the step {none_text}" if none else "")
            + (f"; nested bisection peaks at {nested['peak_memory_gib']:.2f} GiB for a "
               f"{nested['step_mean_ms'] / best['step_mean_ms']:.2f}x longer step than k = {k}" if nested else "")
            + f". The step time of k = {k} is {best['step_mean_ms']:.0f} ms; every k recomputes one forward, so "
              f"times differ little across k.\n")
        ctx.answer("gradient_checkpointing",
                   f"{r0['preset']}, context {r0['context_length']}: lowest peak {best['peak_memory_gib']:.2f} "
                   f"GiB with one checkpoint per k = {k} block(s)"
                   + (f" (no checkpointing: {none_text})" if none else "")
                   + (f"; nested bisection {nested['peak_memory_gib']:.2f} GiB" if nested else ""))
        n_params = best["n_params"]
        per_block = ((neighbours[0]["peak_memory_gib"] - best["peak_memory_gib"])
                     / max(int(neighbours[0]["checkpoint"]) - k, 1)) if neighbours else float("nan")
        state_gib = n_params * 16 / 2**30  # fp32 parameters, gradients and AdamW's two moments
        parts.append(
            f"What sets the peak: {state_gib:.1f} GiB of it are the {n_params / 1e9:.2f} B fp32 "
            f"parameters, their gradients and AdamW's two moments, which every strategy holds; the stored group "
            f"inputs are at most {cfg.num_layers} x {x_mib:.0f} MiB = {cfg.num_layers * x_mib / 1024:.2f} GiB (k = 1); "
            f"what changes with k is the k blocks' worth of residuals re-materialised at once (about "
            f"{per_block:.1f} GiB per extra block here, from the measured peaks). Nested bisection does not beat "
            f"k = 1 on this peak (the parameter gradients alone are {n_params * 4 / 2**30:.1f} GiB; "
            f"docs/report/notes.md discusses why).\n"
            if neighbours else "")
        fig, ax = plt.subplots(figsize=(6.5, 3.5))
        xs = [int(r["checkpoint"]) for r in flat]
        ax.plot(xs, [r["peak_memory_gib"] for r in flat], "o-", label="peak memory (GiB)")
        ax.set_xticks(xs)
        ax.set_xlabel("checkpoint every k blocks")
        ax.set_ylabel("peak memory (GiB)")
        ax2 = ax.twinx()
        ax2.plot(xs, [r["step_mean_ms"] for r in flat], "s--", color="tab:orange", label="step time (ms)")
        ax2.set_ylabel("step time (ms)")
        ax.set_title(f"{r0['preset']}, context {r0['context_length']}, batch {r0['batch_size']}")
        ax.grid(alpha=0.3)
        fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.88))
        fig.tight_layout()
        path = ctx.figure_path("gradient_checkpointing.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        parts.append(f"![peak memory and step time vs k]({ctx.link(path)})\n")
    return "\n".join(parts)
