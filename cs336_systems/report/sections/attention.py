"""pytorch_attention and torch_compile: attention alone (eager vs compiled) and the whole model compiled."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.records.schema import ATTENTION_HEAD_DIMS as HEAD_DIMS
from cs336_systems.records.schema import ATTENTION_SEQ_LENS as SEQ_LENS
from cs336_systems.report.sections._common import load, ok, provenance, table

PROBLEM_IDS = ("pytorch_attention", "torch_compile")
KEYS = ("kind", "backend", "compile", "head_dim", "seq_len", "batch_size", "dtype", "causal")


def memory_accounting(batch_size: int, seq_len: int, head_dim: int, dtype: str, model: dict) -> dict[str, float]:
    """Predicted memory (GiB) of one attention call from the saved-bytes model that attention-bench
    recorded (``bytes_per_score * T^2 + bytes_per_token * T`` saved per sequence): inputs, output,
    what autograd saves for backward, and one score matrix."""
    b, t, d = batch_size, seq_len, head_dim
    elt = 4 if dtype == "fp32" else 2
    qkv_out = 4 * b * t * d * elt
    saved = b * (model["bytes_per_score"] * t * t + model["bytes_per_token"] * t)
    return {"qkv_and_output_gib": qkv_out / 2**30, "saved_for_backward_gib": saved / 2**30,
            "one_score_matrix_gib": b * t * t * elt / 2**30,
            "saved_score_matrices": model["bytes_per_score"] / elt,
            "predicted_before_backward_gib": (qkv_out + saved) / 2**30}


def _predicted_gib(r: dict, acc: dict | None) -> str:
    if not acc:
        return ""
    model = {"bytes_per_score": acc["bytes_per_score"], "bytes_per_token": acc["bytes_per_token"]}
    acc_gib = memory_accounting(r["batch_size"], r["seq_len"], r["head_dim"], r["dtype"], model)
    return f"{acc_gib['predicted_before_backward_gib']:.2f}"


def _grid(rows: list[dict], compiled: bool, acc: dict | None, backend: str = "reference") -> pd.DataFrame:
    out = []
    for r in sorted((r for r in rows if r.get("compile") == compiled and r.get("backend") == backend),
                    key=lambda r: (r["head_dim"], r["seq_len"])):
        ok_ = r["status"] == "ok"
        out.append({"d": r["head_dim"], "seq": r["seq_len"],
                    "forward ms": f"{r['forward_mean_ms']:.3f}" if ok_ else "OOM",
                    "backward ms": f"{r['backward_mean_ms']:.3f}" if ok_ else "OOM",
                    "memory before backward GiB": (f"{r['memory_before_backward_gib']:.2f}"
                                                   if ok_ and r.get("memory_before_backward_gib") is not None else ""),
                    "predicted GiB": _predicted_gib(r, acc)})
    return pd.DataFrame(out)


def _eager_accounting(runs: list[dict], acc_record: dict | None) -> dict | None:
    """The accounting of the smallest eager OOM configuration (else the largest eager one that ran), computed
    here with ``memory_accounting`` from the saved-bytes model in the run's records (None without one)."""
    eager = sorted((r for r in runs if not r.get("compile") and r.get("backend") == "reference"),
                   key=lambda r: (r["seq_len"], r["head_dim"]))
    if not eager:
        return None
    ooms = [r for r in eager if r["status"] == "OOM"]
    target = ooms[0] if ooms else [r for r in eager if r["status"] == "ok"][-1]
    if not acc_record:
        return None
    model = {"bytes_per_score": acc_record["bytes_per_score"], "bytes_per_token": acc_record["bytes_per_token"]}
    return {**memory_accounting(target["batch_size"], target["seq_len"], target["head_dim"], target["dtype"], model),
            **model, "status": target["status"], "head_dim": target["head_dim"],
            "seq_len": target["seq_len"], "batch_size": target["batch_size"],
            "measured_before_backward_gib": target.get("memory_before_backward_gib"),
            "device_memory_gib": (acc_record or {}).get("device_memory_gib")}


def _attention(ctx) -> str | None:
    rows = load(ctx, "pytorch_attention", KEYS)
    runs = [r for r in rows if r.get("kind") != "memory_accounting"]
    if not runs:
        return None
    acc_record = next((r for r in reversed(rows) if r.get("kind") == "memory_accounting"), None)
    acc = _eager_accounting(runs, acc_record)
    first = runs[0]
    parts = ["## pytorch_attention\n",
             f"Batch {first['batch_size']}, no head dimension, causal, {first['dtype']}; {first['reps']} timed forward "
             f"passes, then the memory in use before a backward, then {first['reps']} timed backward passes, with a "
             "synchronize after each pass (`cs336-systems attention-bench`). \"predicted\" is the memory accounting "
             "done in code: Q, K, V, O plus the bytes autograd saves per score element, measured with saved-tensor "
             "hooks on a small problem.\n", provenance(runs) + "\n"]
    eager = _grid(runs, False, acc)
    parts.append("### Eager\n")
    parts.append(table(eager) + "\n")
    ooms = [r for r in runs if r["status"] == "OOM" and not r.get("compile")]
    if acc:
        gib_per_score = acc["bytes_per_score"]
        which = ("the smallest configuration that runs out of memory" if acc["status"] == "OOM"
                 else "no configuration ran out of memory; the largest one")
        parts.append(
            f"Memory accounting ({which}: "
            f"d = {acc['head_dim']}, T = {acc['seq_len']}): Q, K, V and O take {acc['qkv_and_output_gib']:.3f} GiB; "
            f"the reference implementation saves {acc['saved_score_matrices']:.2f} score-sized fp32 tensors for "
            f"backward ({gib_per_score:.0f} bytes per score: the masked scores, their exponentials, the "
            f"probabilities, and the boolean mask), and one {acc['batch_size']} x {acc['seq_len']} x "
            f"{acc['seq_len']} fp32 score matrix is {acc['one_score_matrix_gib']:.2f} GiB, so "
            f"{acc['saved_for_backward_gib']:.2f} GiB are saved and {acc['predicted_before_backward_gib']:.2f} GiB "
            f"should be in use before the backward"
            + (f" (measured: {acc['measured_before_backward_gib']:.2f} GiB)" if acc.get("measured_before_backward_gib")
               else "")
            + (f", on a device of {acc['device_memory_gib']:.1f} GiB; the forward also needs a few score-sized "
               f"temporaries at once, and the backward several more." if acc.get("device_memory_gib") else ".")
            + " The memory saved for backward grows as T^2 (and does not depend on d), so doubling the sequence "
              "length quadruples it. To remove it, do not materialise the score matrix: compute attention in tiles "
              "with an online softmax and keep only the output and the T logsumexp values for backward, recomputing "
              "the scores tile by tile (FlashAttention-2).\n")
    if acc:
        ctx.answer("pytorch_attention", f"the reference saves {acc['saved_score_matrices']:.2f} score-sized tensors "
                   f"for backward (grows as T^2); at d = {acc['head_dim']}, T = {acc['seq_len']}: "
                   f"{acc['predicted_before_backward_gib']:.2f} GiB predicted before backward"
                   + (f", {acc['measured_before_backward_gib']:.2f} GiB measured"
                      if acc.get("measured_before_backward_gib") else ""))
    ctx.answer("pytorch_attention", "out of memory: " + ", ".join(f"d={r['head_dim']} T={r['seq_len']}" for r in ooms)
               if ooms else "no configuration ran out of memory")
    if ooms:
        parts.append("Out of memory: " + ", ".join(f"d={r['head_dim']} T={r['seq_len']}" for r in ooms) + ".\n")
    else:
        parts.append(f"No configuration ran out of memory on this {first['provenance']['device']}.\n")
    measured = {(r["head_dim"], r["seq_len"]) for r in runs if not r.get("compile") and r.get("backend") == "reference"}
    missing = [(d, t) for d in HEAD_DIMS for t in SEQ_LENS if (d, t) not in measured]
    if missing:
        parts.append("Not measured (the run was stopped at its time limit before reaching them): "
                     + ", ".join(f"d={d} T={t}" for d, t in missing) + ".\n")
    return "\n".join(parts)


def _range(values: pd.Series) -> str:
    lo, hi = values.min(), values.max()
    return f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}x to {hi:.2f}x"


def _regional(ctx) -> str:
    """xl train step, eager vs per-block compiled, from the MFU-target records."""
    rows = ok(load(ctx, "mfu_target", ("preset", "context_length", "mode", "precision", "compile", "compile_scope",
                                       "attention", "optimizer")))
    pick = {r["compile"]: r for r in rows if r["attention"] == "sdpa" and r.get("optimizer") == "torch-fused"}
    if not (True in pick and False in pick):
        return ""
    e, c = pick[False], pick[True]
    return (f"For the {c['preset']} train step ({c['precision']}, sdpa attention, fused AdamW; records of "
            f"`mfu_target`), "
            f"compiling each Transformer block (`--compile-scope blocks`; compiling the whole 48-block model did not "
            f"finish within the run's time budget) takes the forward from {e['forward_mean_ms']:.1f} to "
            f"{c['forward_mean_ms']:.1f} ms, the backward from {e['backward_mean_ms']:.1f} to "
            f"{c['backward_mean_ms']:.1f} ms and the whole step from {e['step_mean_ms']:.1f} to "
            f"{c['step_mean_ms']:.1f} ms ({e['step_mean_ms'] / c['step_mean_ms']:.2f}x); the optimizer step is not "
            f"compiled and stays at {c['optimizer_mean_ms']:.1f} ms.\n")


def _compile(ctx) -> str | None:
    rows = ok(load(ctx, "pytorch_attention", KEYS))
    att = [r for r in rows if r.get("kind") != "memory_accounting" and r.get("backend") == "reference"]
    e2e = load(ctx, "torch_compile", ("preset", "context_length", "mode", "precision", "compile", "attention",
                                      "optimizer", "checkpoint"))
    if not (any(r.get("compile") for r in att) or e2e):
        return None
    parts = ["## torch_compile\n"]
    pairs = []
    for r in att:
        if r["compile"]:
            e = next((x for x in att if not x["compile"] and x["head_dim"] == r["head_dim"]
                      and x["seq_len"] == r["seq_len"]), None)
            if e:
                pairs.append({"d": r["head_dim"], "seq": r["seq_len"], "eager fwd ms": e["forward_mean_ms"],
                              "compiled fwd ms": r["forward_mean_ms"], "eager bwd ms": e["backward_mean_ms"],
                              "compiled bwd ms": r["backward_mean_ms"],
                              "fwd speedup": e["forward_mean_ms"] / r["forward_mean_ms"],
                              "bwd speedup": e["backward_mean_ms"] / r["backward_mean_ms"],
                              "eager GiB before bwd": e.get("memory_before_backward_gib"),
                              "compiled GiB before bwd": r.get("memory_before_backward_gib")})
    if pairs:
        df = pd.DataFrame(pairs).sort_values(["d", "seq"])
        shown = df.astype({"d": str, "seq": str})  # keep sizes as integers in the markdown
        parts += ["### (a) Attention alone, eager vs `torch.compile`\n", provenance(att) + "\n", table(shown) + "\n"]
        reps = sorted({(r["compile"], r["reps"]) for r in att})
        parts.append("Passes timed per configuration: " + ", ".join(
            f"{'compiled' if c else 'eager'} {n}" for c, n in reps) + " (the compiled grid ran with fewer "
            "passes to fit the device time).\n" if len({n for _, n in reps}) > 1 else "")
        big = df[df["seq"] == df["seq"].max()]
        parts.append(
            f"At T = {int(df['seq'].max())} the compiled attention's forward is {big['fwd speedup'].min():.2f}x to "
            f"{big['fwd speedup'].max():.2f}x faster and its backward {big['bwd speedup'].min():.2f}x to "
            f"{big['bwd speedup'].max():.2f}x: Inductor fuses the scale, mask and softmax's elementwise passes into "
            f"fewer kernels, so the T x T matrix is read and written fewer times; it still materialises that matrix, "
            f"so time and memory keep growing as T^2.\n")
        ctx.answer("torch_compile", f"compiled attention at T = {int(df['seq'].max())}: forward "
                   f"{big['fwd speedup'].min():.2f}-{big['fwd speedup'].max():.2f}x, backward "
                   f"{big['bwd speedup'].min():.2f}-{big['bwd speedup'].max():.2f}x faster")
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for i, d in enumerate(sorted(df["d"].unique())):
            sub = df[df["d"] == d]
            color = f"C{i}"
            ax.loglog(sub["seq"], sub["eager fwd ms"] + sub["eager bwd ms"], "o-", color=color, label=f"eager d={d}")
            ax.loglog(sub["seq"], sub["compiled fwd ms"] + sub["compiled bwd ms"], "x--", color=color,
                      label=f"compiled d={d}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("forward + backward (ms)")
        ax.set_title("Attention alone, batch 8")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = ctx.figure_path("attention_eager_vs_compiled.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        parts.append(f"![attention eager vs compiled]({ctx.link(path)})\n")
    good = ok(e2e)
    if good:
        out = []
        for r in good:
            if r["compile"]:
                e = next((x for x in good if not x["compile"] and x["preset"] == r["preset"] and x["mode"] == r["mode"]
                          and x["precision"] == r["precision"]), None)
                if e:
                    out.append({"preset": r["preset"], "mode": r["mode"], "precision": r["precision"],
                                "eager fwd ms": e["forward_mean_ms"], "compiled fwd ms": r["forward_mean_ms"],
                                "eager step ms": e["step_mean_ms"], "compiled step ms": r["step_mean_ms"],
                                "step speedup": e["step_mean_ms"] / r["step_mean_ms"], "eager MFU": e["mfu"],
                                "compiled MFU": r["mfu"]})
        if out:
            df = pd.DataFrame(out)
            fwd = df[df["mode"] == "forward"]
            tr = df[df["mode"] != "forward"]
            parts += ["### (b) The whole Transformer compiled\n", provenance(good) + "\n", table(df) + "\n"]
            txt = []
            if len(fwd):
                txt.append("Compiling the whole model speeds the forward pass up by "
                           + _range(fwd["eager step ms"] / fwd["compiled step ms"]))
            if len(tr):
                txt.append("the full training step (forward, backward, optimizer) by " + _range(tr["step speedup"]))
                ctx.answer("torch_compile", "whole model compiled: train step " + _range(tr["step speedup"])
                           + " faster")
            unpaired = [r for r in good if not r["compile"] and not any(
                o["preset"] == r["preset"] and o["mode"] == r["mode"] for o in out)]
            if unpaired:
                txt.append(" (" + ", ".join(f"{r['preset']} {r['mode']}" for r in unpaired)
                           + ": measured eager only, the compiled run was stopped at its time limit)")
            parts.append(", and ".join(t for t in txt if not t.startswith(" (")) + "".join(
                t for t in txt if t.startswith(" (")) + ". The gain comes from fusing the memory-bound elementwise "
                         "work "
                         "(RMSNorm, SwiGLU's gate, RoPE, softmax, casts) and from fewer launches; the matmuls are "
                         "cuBLAS either way, and the optimizer step (not compiled) is unchanged.\n")
            parts.append(_regional(ctx))
    return "\n".join(parts) if len(parts) > 1 else None


def build(ctx) -> str | None:
    parts = [p for p in (_attention(ctx), _compile(ctx)) if p]
    return "\n".join(parts) or None
