"""training_step (a project target, issue 19): a full training step with our fastest settings against
a ~60-line compiled PyTorch script timed in the same run, and the checks recorded beside them (the fused
loss's memory, the loss curve with and without it)."""

from __future__ import annotations

import pandas as pd

from cs336_systems.records.schema import TRAINING_STEP
from cs336_systems.report.sections._common import load, ok, provenance, table

PROBLEM_IDS = ("training_step",)
SETTINGS = ("preset", "context_length", "batch_size", "precision", "compile_scope", "attention", "optimizer", "loss",
            "checkpoint")
# What a peer must share with a row of ours to be its peer (besides the run): the peer has none of our other
# settings, and bench times one peer per (preset, context, precision, mode) of a run.
PEER_KEY = ("preset", "context_length", "batch_size", "precision", "mode")


def _run(r: dict) -> str:
    return r["provenance"]["date"]


def _steps(ctx, rows: list[dict]) -> list[str]:
    bench = ok([r for r in rows if "impl" in r and r.get("step_mean_ms") is not None])
    if not bench:
        return []
    runs: dict[str, list[dict]] = {}
    for r in bench:
        runs.setdefault(_run(r), []).append(r)
    table_rows, best_pair = [], None
    for run in runs.values():
        peers = {tuple(p.get(k) for k in PEER_KEY): p for p in run if p["impl"] == "peer"}
        for r in run:
            if r["impl"] == "peer":
                continue
            peer = peers.get(tuple(r.get(k) for k in PEER_KEY))
            row = {k: r.get(k) for k in SETTINGS}
            row.update({"step ms (mean ± std)": f"{r['step_mean_ms']:.2f} ± {r['step_std_ms']:.2f}",
                        "tokens/s": r["tokens_per_s"], "MFU": r["mfu"], "peak GiB": r["peak_memory_gib"],
                        "peer step ms (same run)": peer["step_mean_ms"] if peer else None,
                        "vs peer": r["step_mean_ms"] / peer["step_mean_ms"] if peer else None,
                        "run": _run(r)})
            table_rows.append(row)
            if peer and (best_pair is None or r["step_mean_ms"] < best_pair[0]["step_mean_ms"]):
                best_pair = (r, peer)
    parts = ["Each row is one setting of ours (`cs336-systems bench --problem training_step`); *vs peer* is its "
             "step time over that of the compiled PyTorch peer (`--impl peer`) timed in the same run at the same "
             "preset, context length, batch size and precision, empty where the run timed no such peer.\n",
             provenance(bench) + "\n",
             table(pd.DataFrame(table_rows).astype(object).fillna(""), ".4g") + "\n"]
    if best_pair:
        r, peer = best_pair
        ratio = r["step_mean_ms"] / peer["step_mean_ms"]
        what = (f"{r['preset']}, context {r['context_length']}, batch {r['batch_size']}, {r['precision']}, "
                f"{r['provenance']['device']}")
        parts.append(f"Fastest of ours against a peer of its run ({what}): {r['step_mean_ms']:.2f} ms per step "
                     f"(optimizer {r['optimizer']}, loss {r['loss']}, compiled {r['compile_scope']}), the peer "
                     f"{peer['step_mean_ms']:.2f} ms: {ratio:.2f}x its time.\n")
        ctx.answer("training_step", f"{what}: ours {r['step_mean_ms']:.2f} ms per step vs the compiled PyTorch peer "
                   f"{peer['step_mean_ms']:.2f} ms ({ratio:.2f}x)")
        ctx.versus("training_step", f"full training step, {what}", f"{r['step_mean_ms']:.2f} ms",
                   f"compiled PyTorch step {peer['step_mean_ms']:.2f} ms", ratio, "fastest training step")
    return parts


def _checks(rows: list[dict]) -> list[str]:
    parts = []
    for r in (r for r in rows if r.get("check") == "fused_ce_memory"):
        parts.append(f"Fused linear + cross-entropy, {r['tokens']:,} tokens x d {r['d_model']} x vocabulary "
                     f"{r['vocab']:,}: peak {r['peak_above_inputs_gib']:.2f} GiB above its inputs, "
                     f"{r['fraction_of_bf16_logits']:.1%} of the {r['bf16_logits_gib']:.2f} GiB that bf16 logits "
                     f"alone would take; {r['ms']:.1f} ms ({r['tflops']:.0f} TFLOP/s). "
                     + provenance([r]) + "\n")
    loss = [r for r in rows if r.get("check") == "loss"]
    if loss:
        df = pd.DataFrame([{k: r.get(k) for k in ("path", "preset", "context_length", "batch_size", "precision",
                                                  "steps", "first_loss", "final_loss_last10", "relative_difference",
                                                  "within_1_percent")} for r in loss])
        parts += ["Loss after training with and without the fused loss (final: mean of the last 10 steps):\n",
                  table(df, ".5g") + "\n", provenance(loss) + "\n"]
    return parts


def build(ctx) -> str | None:
    rows = load(ctx, TRAINING_STEP)
    if not rows:
        return None
    parts = ["## training_step\n", *_steps(ctx, rows), *_checks(rows)]
    return "\n".join(parts) if len(parts) > 1 else None
