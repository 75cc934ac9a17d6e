"""pytorch_attention and torch_compile: attention alone (eager vs compiled) and the whole model compiled."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.bench.attention import AttentionBenchConfig, memory_accounting
from cs336_systems.report.sections._common import load, ok, provenance, table

PROBLEM_IDS = ("pytorch_attention", "torch_compile")
KEYS = ("kind", "backend", "compile", "head_dim", "seq_len", "batch_size", "dtype", "causal")


def _predicted_gib(r: dict, acc: dict | None) -> str:
    if not acc:
        return ""
    cfg = AttentionBenchConfig(backend=r["backend"], head_dim=r["head_dim"], seq_len=r["seq_len"],
                               batch_size=r["batch_size"], dtype=r["dtype"], device="cpu")
    model = {"bytes_per_score": acc["bytes_per_score"], "bytes_per_token": acc["bytes_per_token"]}
    return f"{memory_accounting(cfg, model)['predicted_before_backward_gib']:.2f}"


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


def _attention(ctx) -> str | None:
    rows = load(ctx, "pytorch_attention", KEYS)
    runs = [r for r in rows if r.get("kind") != "memory_accounting"]
    if not runs:
        return None
    acc = next((r for r in reversed(rows) if r.get("kind") == "memory_accounting"), None)
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
    if ooms:
        parts.append("Out of memory: " + ", ".join(f"d={r['head_dim']} T={r['seq_len']}" for r in ooms) + ".\n")
    return "\n".join(parts)


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
        parts += ["### (a) Attention alone, eager vs `torch.compile`\n", provenance(att) + "\n", table(df) + "\n"]
        big = df[df["seq"] == df["seq"].max()]
        parts.append(
            f"At T = {int(df['seq'].max())} the compiled attention's forward is {big['fwd speedup'].min():.2f}x to "
            f"{big['fwd speedup'].max():.2f}x faster and its backward {big['bwd speedup'].min():.2f}x to "
            f"{big['bwd speedup'].max():.2f}x: Inductor fuses the scale, mask and softmax's elementwise passes into "
            f"fewer kernels, so the T x T matrix is read and written fewer times; it still materialises that matrix, "
            f"so time and memory keep growing as T^2.\n")
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for d in sorted(df["d"].unique()):
            sub = df[df["d"] == d]
            ax.loglog(sub["seq"], sub["eager fwd ms"] + sub["eager bwd ms"], "o-", label=f"eager d={d}")
            ax.loglog(sub["seq"], sub["compiled fwd ms"] + sub["compiled bwd ms"], "x--", label=f"compiled d={d}")
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
                txt.append(f"Compiling the whole model speeds the forward pass up by "
                           f"{(fwd['eager step ms'] / fwd['compiled step ms']).min():.2f}x to "
                           f"{(fwd['eager step ms'] / fwd['compiled step ms']).max():.2f}x")
            if len(tr):
                txt.append(f"the full training step (forward, backward, optimizer) by {tr['step speedup'].min():.2f}x "
                           f"to {tr['step speedup'].max():.2f}x")
            parts.append(", and ".join(txt) + ". The gain comes from fusing the memory-bound elementwise work "
                         "(RMSNorm, SwiGLU's gate, RoPE, softmax, casts) and from fewer launches; the matmuls are "
                         "cuBLAS either way, and the optimizer step (not compiled) is unchanged.\n")
    return "\n".join(parts) if len(parts) > 1 else None


def build(ctx) -> str | None:
    parts = [p for p in (_attention(ctx), _compile(ctx)) if p]
    return "\n".join(parts) or None
