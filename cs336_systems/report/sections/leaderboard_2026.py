"""leaderboard_2026 (the 2026 handout's leaderboard): one full training step of the 8B model at batch
2 x 32,768 (`cs336-systems leaderboard`), its memory plan, the handout's naive step at the same size, the
logits check on a reduced model and the bf16 quality guard."""

from __future__ import annotations

import pandas as pd

from cs336_systems.records.schema import LEADERBOARD_2026, LEADERBOARD_2026_QUALITY
from cs336_systems.report.sections._common import load, provenance, table

PROBLEM_IDS = ("leaderboard_2026",)
TARGET_MS, TARGET_MFU, TARGET_MARGIN = 16_000.0, 0.37, 0.05  # issue 20's targets on one H200
TARGET_MS_2GPU, TARGET_MFU_2GPU = 8_000.0, 0.37  # issue 22's targets on two H200s
GUARD_TOLERANCE = 0.02  # the quality guard: the all-bf16 run ends within 2% of the fp32-master run
PRECISIONS = [  # what our step keeps in which precision (leaderboard.build_step, FusedAdamW, the fused loss)
    ("parameters", "bf16, updated with stochastic rounding (`FusedAdamW(stochastic_rounding=True)`)"),
    ("gradients", "bf16"),
    ("AdamW moments m, v", "bf16, stochastic rounding; the update arithmetic is fp32 in registers"),
    ("activations saved for backward", "bf16 (checkpointed blocks keep only their bf16 input)"),
    ("attention softmax statistics (row max, logsumexp, D)", "fp32"),
    ("matmul accumulators (attention tiles, Linear layers)", "fp32"),
    ("logits", "fp32, one vocabulary chunk at a time inside the fused LM head + loss; never whole"),
    ("loss and its reductions", "fp32"),
]
RUN_COLUMNS = ["impl", "nproc", "parallel", "layers", "context_length", "batch_size", "status", "step_ms",
               "tokens_per_s", "mfu", "peak_memory_gib", "plan_total_gib", "plan_uncheckpointed_blocks", "forward_ms",
               "loss_ms", "backward_ms", "optimizer_ms", "wall_s"]
PLAN_TERMS = ["parameters", "gradients", "optimizer_state", "checkpointed_activations", "full_activations",
              "layer_recompute_peak", "loss_chunks", "workspace", "total"]


def _full_size(r: dict) -> bool:
    return r["layers"] == 34 and r["context_length"] == 32_768 and r["batch_size"] == 2


def _nproc(r: dict) -> int:
    return r.get("nproc", 1)  # records before --nproc ran in one process


def _one_share(rows: list[dict]) -> list[str]:
    """Before a two-GPU run: one GPU's share of it (the full model at batch 1 x 32,768, the data-parallel code
    in a group of one and the one-process step), the time each GPU of a two-GPU step computes."""
    share = [r for r in rows if r["layers"] == 34 and r["context_length"] == 32_768 and r["batch_size"] == 1
             and r["status"] == "ok" and r["impl"] == "ours"]
    if not share:
        return []
    dp = [r for r in share if r.get("parallel")]
    one = [r for r in share if not r.get("parallel")]
    if dp:  # the one-process step beside it only from the same commit (the same memory plan)
        one = [r for r in one if r["provenance"]["git_commit"] == dp[-1]["provenance"]["git_commit"]]
    line = (f"Two GPUs (issue 22) not yet run. One GPU's share of that step, the full model at batch 1 x 32,768 on "
            f"one {share[-1]['provenance']['device']}: ")
    if dp:
        line += (f"{dp[-1]['step_ms'] / 1e3:.2f} s through the data-parallel code in a group of one (`torchrun "
                 f"--nproc-per-node 1`, {dp[-1]['parallel']}, peak {dp[-1]['peak_memory_gib']:.1f} GiB)")
    if one:
        line += ("; " if dp else "") + f"{one[-1]['step_ms'] / 1e3:.2f} s as one process"
    line += (". Each GPU of the two-GPU step computes this much; the step adds what of the gradient all-reduce "
             "and the parameter broadcast is not hidden. " + provenance(dp[-1:] + one[-1:]) + "\n")
    return [line]


def _two_gpu(ctx, rows: list[dict]) -> list[str]:
    """The data-parallel full-size runs (issue 22): the best step, against the two-GPU targets."""
    runs = [r for r in rows if _full_size(r) and _nproc(r) > 1 and r["status"] == "ok"]
    if not runs:
        return _one_share(rows)
    best = min(runs, key=lambda r: r["step_ms"])
    met = best["step_ms"] <= TARGET_MS_2GPU and best["mfu"] >= TARGET_MFU_2GPU
    where = f"{best['nproc']} x {best['provenance']['device']}"
    ctx.versus("leaderboard_2026", f"8B training step, batch 2 x 32,768, bf16, {where} ({best['parallel']})",
               f"{best['step_ms'] / 1e3:.2f} s, MFU {best['mfu']:.1%}", "–", None,
               f"<= 8 s, MFU >= 37% ({'met' if met else 'NOT met'})")
    return [f"Data parallel on {where} (`--nproc {best['nproc']} --parallel {best['parallel']}`, one slice of the "
            f"batch per GPU): **{best['step_ms'] / 1e3:.2f} s per step**, MFU {best['mfu']:.1%} of the GPUs' summed "
            f"matmul peak ({best['matmul_peak_tflops']:.0f} TFLOP/s), peak memory {best['peak_memory_gib']:.1f} GiB "
            f"on the fullest GPU. " + provenance([best]) + "\n"]


def _runs_table(rows: list[dict]) -> str:
    df = pd.DataFrame([{k: r.get(k) for k in RUN_COLUMNS} | {"nproc": _nproc(r), "date": r["provenance"]["date"]}
                       for r in rows])
    return table(df.astype(object).where(df.notna(), None), ".4g")


def _plan(r: dict) -> str:
    df = pd.DataFrame([{"tensors": t.replace("_", " "), "GiB": r.get(f"plan_{t}_gib")} for t in PLAN_TERMS])
    how = "measured on the device" if r.get("plan_block_saved_measured") else "estimated"
    terms = sum(r.get(f"plan_{t}_gib") or 0.0 for t in PLAN_TERMS[:-1])
    # Plans since 474bbdb take the larger of two moments (leaderboard.MemoryPlan); earlier ones summed every term.
    total = (" The total is the step's planned peak: parameters, AdamW state and workspace plus the larger of the "
             "start of backward and the recomputation of the checkpointed blocks, not the sum of the rows."
             if r.get("plan_total_gib") is not None and r["plan_total_gib"] < terms - 1e-6 else "")
    return (table(df, ".2f") + f"\n\nOne block saves {r['plan_block_saved_gib']:.2f} GiB for backward ({how}); "
            f"{r['plan_uncheckpointed_blocks']} of {r['layers']} blocks run without activation checkpointing."
            f"{total}\n" if r.get("plan_block_saved_gib") is not None else table(df, ".2f") + "\n")


def _rounding(g: dict) -> str:
    # Records without the field ran before stochastic rounding existed: bf16 state rounded to nearest.
    return "stochastic" if g.get("stochastic_rounding") else "nearest"


def _guard(ctx, guards: list[dict]) -> list[str]:
    """The quality guard's table, and its verdict on the setting the leaderboard runs (stochastic rounding)."""
    # Records without a seed ran before --seed existed, with quality_guard's default seed 0.
    df = pd.DataFrame([{k: g.get(k) for k in ("preset", "steps", "context_length", "batch_size", "lr")}
                       | {"seed": g.get("seed", 0), "rounding": _rounding(g)}
                       | {k: g.get(k) for k in ("final_loss_bf16", "final_loss_fp32_master", "relative_difference")}
                       for g in guards])
    lines = ["Quality guard: the same model trained on the same Markov-chain batches with everything in bf16 "
             "(fused loss and fused AdamW, as the leaderboard runs) and with fp32 masters and state (bf16 "
             "autocast, full logits, our AdamW); final loss is the mean of the last 10 steps, the difference is "
             "bf16 over fp32 masters minus 1. Rounded to nearest, bf16 AdamW state loses every change below half "
             "an ulp (v * 0.999 rounds back to v, so v stops decaying while its bias correction grows and the "
             "steps grow with it); stochastic rounding keeps those changes in expectation."]
    for rounding in ("nearest", "stochastic"):
        diffs = [g["relative_difference"] for g in guards if _rounding(g) == rounding]
        if diffs:
            ok = max(abs(d) for d in diffs) <= GUARD_TOLERANCE
            lines.append(f"- {rounding}: {len(diffs)} run(s), {min(diffs):+.2%} to {max(diffs):+.2%} "
                         f"({'within' if ok else 'NOT within'} {GUARD_TOLERANCE:.0%}).")
    current = [g["relative_difference"] for g in guards if _rounding(g) == "stochastic"]
    if current:
        worst = max(current, key=abs)
        ctx.versus("leaderboard_2026", "quality guard: all-bf16 step's settings vs fp32 masters (small, 300 steps)",
                   f"{worst:+.2%} (worst of {len(current)} runs)", "fp32 masters", None,
                   f"within {GUARD_TOLERANCE:.0%} ({'met' if abs(worst) <= GUARD_TOLERANCE else 'NOT met'})")
    return ["\n".join(lines) + "\n", table(df, ".4g") + "\n", provenance(guards) + "\n"]


def build(ctx) -> str | None:
    rows = load(ctx, LEADERBOARD_2026)
    guards = load(ctx, LEADERBOARD_2026_QUALITY)
    if not rows:
        return None
    full = [r for r in rows if _full_size(r) and _nproc(r) == 1]
    ours = [r for r in full if r["impl"] == "ours" and r["status"] == "ok"]
    # The step as it runs now stores bf16 state with stochastic rounding (the quality guard's verdict); runs
    # before that (no "rounding" field) rounded to nearest and are listed below, not headlined.
    ours = [r for r in ours if r.get("rounding") == "stochastic"] or ours
    naive = [r for r in full if r["impl"] == "naive"]
    parts = ["## leaderboard_2026\n",
             "`cs336-systems leaderboard` times the handout's step (forward, mean cross-entropy, backward, AdamW; "
             "bf16 parameters, gradients and AdamW state; causal) with `triton.testing.do_bench`. Ours: "
             "`flash_triton` attention, the fused LM head + cross-entropy, the fused AdamW kernel and activation "
             "checkpointing placed by the memory plan; naive: the handout's code as written. MFU counts model "
             "FLOPs (causal attention halved: 4.74 PFLOP per full step) over the bf16 matmul peak measured in the "
             "same run.\n"]
    if ours:
        best = min(ours, key=lambda r: r["step_ms"])
        margin = 1 - best["peak_memory_gib"] / best["device_memory_gib"]
        naive_txt = (f"the handout's naive step at the same size: {naive[-1]['status']}" if naive else
                     "the naive step was not run at this size")
        parts.append(f"Full size ({best['provenance']['device']}): **{best['step_ms'] / 1e3:.2f} s per step**, "
                     f"{best['tokens_per_s']:,.0f} tokens/s, MFU {best['mfu']:.1%} (of {best['matmul_peak_tflops']:.0f}"
                     f" TFLOP/s), peak memory {best['peak_memory_gib']:.1f} GiB of {best['device_memory_gib']:.1f} "
                     f"({margin:.0%} free); {naive_txt}. Over {len(ours)} full-size run(s) the step took "
                     f"{min(r['step_ms'] for r in ours) / 1e3:.2f}-{max(r['step_ms'] for r in ours) / 1e3:.2f} s. "
                     f"Phases (one step, synchronised between them): forward {best['forward_ms'] / 1e3:.2f} s, "
                     f"loss {best['loss_ms'] / 1e3:.2f} s, backward (with recomputation) "
                     f"{best['backward_ms'] / 1e3:.2f} s, optimizer {best['optimizer_ms'] / 1e3:.3f} s.\n")
        cold = [r for r in rows if r.get("compile_cache_files_at_start") == 0 and _full_size(r)]
        if cold:  # the handout's rule: from empty caches, the whole run within 10 minutes
            last = max(cold, key=lambda r: r["provenance"]["date"])
            same_run = [r for r in rows if r["provenance"]["output"] == last["provenance"]["output"]]
            parts.append(f"From empty Triton and Inductor caches (commit {last['provenance']['git_commit'][:7]}), "
                         f"`{last['provenance']['command']}` ran its "
                         f"{len(same_run)} configuration(s) in {sum(r['wall_s'] for r in same_run):.0f} s "
                         "(the handout allows 10 minutes).\n")
        met = best["step_ms"] <= TARGET_MS and best["mfu"] >= TARGET_MFU and margin >= TARGET_MARGIN
        ctx.answer("leaderboard_2026", f"8B step, batch 2 x 32,768 on one {best['provenance']['device']}: "
                   f"{best['step_ms'] / 1e3:.2f} s, MFU {best['mfu']:.1%}, peak {best['peak_memory_gib']:.1f} GiB; "
                   f"{naive_txt}")
        ctx.versus("leaderboard_2026", f"8B training step, batch 2 x 32,768, bf16, {best['provenance']['device']}",
                   f"{best['step_ms'] / 1e3:.2f} s, MFU {best['mfu']:.1%}",
                   f"– (the handout's naive step: {naive[-1]['status'] if naive else 'not run'})", None,
                   f"<= 16 s, MFU >= 37%, >= 5% memory free ({'met' if met else 'NOT met'})")
        parts += ["Memory plan of that run (printed before the step is built):\n", _plan(best),
                  provenance([best]) + "\n"]
    parts += _two_gpu(ctx, rows)
    checks = [r for r in rows if r.get("logits_rel_error") is not None]
    if checks:
        c = checks[-1]
        parts.append(f"Logits check ({c['layers']} layers, context {c['context_length']:,}, same weights and batch): "
                     f"our step's logits differ from the handout model's by {c['logits_rel_error']:.2e} in relative "
                     f"norm (bf16 rounding); loss {c['loss_ours']:.4f} vs {c['loss_reference']:.4f}. "
                     + provenance([c]) + "\n")
    parts += ["Precision of each tensor in our step:\n",
              table(pd.DataFrame(PRECISIONS, columns=["tensor", "kept in"])) + "\n"]
    if guards:
        parts += _guard(ctx, guards)
    parts += ["<details><summary>Every leaderboard run (full size and reduced)</summary>\n",
              _runs_table(rows) + "\n", provenance(rows) + "\n", "</details>\n"]
    return "\n".join(parts)
