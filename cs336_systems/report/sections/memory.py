"""memory_profiling: peak memory per context length, fp32 vs bf16, timelines, largest allocations."""

from __future__ import annotations

import shutil

import pandas as pd

from cs336_systems.configs import get_preset
from cs336_systems.report.sections._common import load, ok, provenance, table

PROBLEM_IDS = ("memory_profiling",)


_NOT_RESIDENT = ("params_and_optimizer_state_gib", "start_alloc_gib")  # counted from tensors, not the allocator


def _net(row: dict, leftover: float) -> dict:
    """A copy of ``row`` with ``leftover`` taken off every allocator reading (``*_gib``)."""
    return {**{k: (v - leftover if k.endswith("_gib") and k not in _NOT_RESIDENT and isinstance(v, float) else v)
               for k, v in row.items()}, "leftover_gib": leftover}


def build(ctx) -> str | None:
    rows = load(ctx, "memory_profiling", ("preset", "context_length", "mode", "precision", "batch_size"))
    if not rows:
        return None
    parts = ["## memory_profiling\n",
             "`cs336-systems memory` runs warm-up steps (so AdamW's moments exist), then one measured step under "
             "`torch.cuda.memory._record_memory_history`; the snapshot pickle loads in pytorch.org/memory_viz, and "
             "the same snapshot is drawn offline below (live allocated bytes at every allocator event of the step, "
             "on top of what was allocated before it).\n", provenance(rows) + "\n"]
    leftover = {id(r): r.get("start_alloc_gib") or 0.0 for r in rows if r.get("status") == "ok"}
    if any(v > 0.05 for v in leftover.values()):
        worst = max(leftover.values())
        derived = any("start_alloc_gib" in (r["provenance"].get("migrated") or {}) for r in rows)
        parts.append(
            f"**Leftover memory.** Some configurations started with memory still allocated by an earlier one in "
            f"the same process (up to {worst:.2f} GiB, the records' `start_alloc_gib`"
            + ("; derived for the earliest run by scripts/migrate_records.py" if derived else "")
            + "): the *net* columns subtract it, and the text below uses net values "
            "(docs/report/history.md says where it came from).\n")
    rows = [_net(r, leftover.get(id(r), 0.0)) for r in rows]
    good = ok(rows)
    df = pd.DataFrame([{"preset": r["preset"], "context": r["context_length"], "mode": r["mode"],
                        "precision": r["precision"], "status": r["status"],
                        "peak GiB (net)": r.get("peak_memory_gib"),
                        "leftover subtracted GiB": r["leftover_gib"],
                        "allocated before step GiB (net)": r.get("baseline_gib"),
                        "after forward GiB (net)": r.get("after_forward_gib"),
                        "params + optimizer state GiB": r.get("params_and_optimizer_state_gib")}
                       for r in sorted(rows, key=lambda r: (r["mode"], r["precision"], r["context_length"]))])
    parts += ["### (b, c) Peak memory\n", table(df.astype(object).fillna("")) + "\n"]
    piv = {(r["mode"], r["precision"], r["context_length"]): r["peak_memory_gib"] for r in good}
    ctxs = sorted({r["context_length"] for r in good})
    if ctxs:
        lines = []
        for mode in ("forward", "train-step"):
            if all((mode, "fp32", c) in piv for c in ctxs):
                lines.append(f"{mode} fp32 peaks: "
                             + ", ".join(f"{piv[(mode, 'fp32', c)]:.2f} GiB at {c}" for c in ctxs))
        diffs = [(piv[(m, "bf16", c)] - piv[(m, "fp32", c)]) for m in ("forward", "train-step") for c in ctxs
                 if (m, "bf16", c) in piv and (m, "fp32", c) in piv]
        text = "; ".join(lines) + "."
        if lines:
            ctx.answer("memory_profiling", f"{good[0]['preset']}: " + "; ".join(lines)
                       + (f"; bf16 autocast changes the peak by {min(diffs):+.2f} to {max(diffs):+.2f} GiB"
                          if diffs else ""))
        if diffs:
            text += (f" bf16 autocast changes the peak by {min(diffs):+.2f} to {max(diffs):+.2f} GiB. It does not "
                     f"shrink the big terms: parameters, gradients and AdamW's two moments stay fp32 (16 bytes per "
                     f"parameter), and autocast keeps bf16 copies of the weights it casts on top of them. It does "
                     f"halve the matmul activations saved for backward, which is why its effect grows with context; "
                     f"where the peak is the optimizer step (short context), autocast cannot lower it at all.")
        parts.append(text + "\n")
    r0 = good[0] if good else rows[0]
    cfg = get_preset(r0["preset"])
    parts.append("### (d) Residual-stream activation size\n")
    parts.append(
        "\n".join(f"- {r0['preset']} (d_model {cfg.d_model}), batch {r0['batch_size']}, context {c}: "
                  f"{r0['batch_size']} x {c} x {cfg.d_model} x 4 bytes = "
                  f"{next(x['residual_stream_mib_fp32'] for x in rows if x['context_length'] == c):.2f} MiB"
                  for c in sorted({x["context_length"] for x in rows})) + "\n")
    pngs = [r for r in good if r.get("timeline_png") and r["precision"] == "fp32"]
    if pngs:
        parts.append("### (a) Memory timelines\n")
        src_dir = ctx.results_dir / "memory_profiling" / "figures"
        for r in sorted(pngs, key=lambda r: (r["mode"], r["context_length"])):
            src = src_dir / r["timeline_png"]
            if src.exists():
                dst = ctx.figure_path(r["timeline_png"])
                shutil.copyfile(src, dst)
                parts.append(f"![{r['timeline_png']}]({ctx.link(dst)})\n")
        fwd = max((r for r in good if r["mode"] == "forward" and r["precision"] == "fp32"),
                  key=lambda r: r["context_length"], default=None)
        trains = sorted((r for r in good if r["mode"] == "train-step" and r["precision"] == "fp32"),
                        key=lambda r: r["context_length"])
        if fwd and trains:
            tr = trains[-1]
            text = (f"The forward-only timeline is a saw-tooth on a flat floor of weights: each block allocates its "
                    f"temporaries and frees them (nothing is kept for backward under `no_grad`), so the peak is one "
                    f"block's working set plus the logits. The training step climbs through the forward (each "
                    f"block's saved activations stay; at context {tr['context_length']} "
                    f"{tr['after_forward_gib']:.2f} GiB are allocated when the forward ends, against "
                    f"{tr['baseline_gib']:.2f} GiB before it); through the backward, block by block, saved "
                    f"tensors are freed while parameter gradients appear, so the curve falls where activations "
                    f"outweigh gradients and rises where they do not ("
                    + "; ".join(f"context {r['context_length']}: {r['after_forward_gib']:.1f} GiB after forward, "
                                f"{r['after_backward_gib']:.1f} GiB after backward" for r in (trains[0], trains[-1])
                                if r.get("after_backward_gib") is not None)
                    + "); the optimizer step then adds a spike and zeroing the gradients returns to the floor. "
                      "The stages can be told apart from the shape of the curve.")
            phased = [r for r in trains if "peak_in_forward_gib" in r]
            if phased:
                where = []
                for r in phased:
                    ph = max(("forward", "backward", "optimizer"), key=lambda p: r[f"peak_in_{p}_gib"])
                    where.append(f"{ph} at context {r['context_length']} ("
                                 + ", ".join(f"{p} {r[f'peak_in_{p}_gib']:.1f}" for p in ("forward", "backward",
                                                                                          "optimizer")) + " GiB)")
                text += (" The step's peak falls in the " + "; in the ".join(where) + ". The optimizer's peak is "
                         "params + gradients + both moments plus the temporary `torch._foreach_sqrt` makes of the "
                         "second moment (one more parameter-sized fp32 buffer), so at short context it exceeds the "
                         "activation peak at the end of the forward.")
            parts.append(text + "\n")
    big = next((r for r in sorted(good, key=lambda r: -r["context_length"]) if r["mode"] == "forward"
                and r.get("largest_allocations")), None)
    if big:
        parts.append(f"### (e) Largest allocations ({big['preset']}, context {big['context_length']}, forward, "
                     f"{big['precision']})\n")
        parts.append(table(pd.DataFrame(big["largest_allocations"])) + "\n")
        a = big["largest_allocations"][0]
        parts.append(f"The largest allocations are {a['size_mib']:.1f} MiB, made at `{a['where']}`; per batch "
                     f"element and head, a {big['context_length']} x {big['context_length']} fp32 score matrix over "
                     f"{cfg.num_heads} heads and batch {big['batch_size']} is "
                     f"{big['batch_size'] * cfg.num_heads * big['context_length'] ** 2 * 4 / 2**20:.1f} MiB, and the "
                     f"logits are {big['batch_size'] * big['context_length'] * cfg.vocab_size * 4 / 2**20:.1f} MiB.\n")
    saved = max((r for r in good if r["mode"] == "train-step" and r["precision"] == "fp32"
                 and r.get("block_saved_for_backward_mib")), key=lambda r: r["context_length"], default=None)
    if saved:
        parts.append("### (f) Saved for backward by one block\n")
        parts.append(
            f"Counted with autograd's saved-tensor hooks (distinct storages) for one {saved['preset']} block at "
            f"context "
            f"{saved['context_length']}: {saved['block_saved_for_backward_mib']:.1f} MiB, of which "
            f"{saved['block_saved_excluding_params_mib']:.1f} MiB are activations (the rest are the block's weights, "
            f"which matmuls save by reference), i.e. "
            f"{saved['block_saved_excluding_params_mib'] / saved['residual_stream_mib_fp32']:.1f} residual-stream "
            f"tensors' worth. (Nsight's per-operation breakdown is not available here: nsys does not run on these "
            f"machines.)\n")
    return "\n".join(parts)
