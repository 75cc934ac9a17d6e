"""flash_features (a project target, issue 21): grouped-query heads, a sliding window and packed documents,
ours against FlexAttention and SDPA timed in the same run (``cs336-systems flash-bench --only features``)."""

from __future__ import annotations

import pandas as pd

from cs336_systems.records.schema import FLASH_FEATURES
from cs336_systems.report.sections._common import load, provenance

PROBLEM_IDS = ("flash_features",)
GOAL = "no slower than the fastest peer (issue 21)"
MODES = (("forward", "fwd"), ("forward_backward", "fwd+bwd"))


def shape_text(r: dict) -> str:
    """``2 x 32/8 heads x 8,192 x 128, causal, window (4096, 0), 8 documents``."""
    heads = f"{r['q_heads']}/{r['kv_heads']} heads" if r["q_heads"] != r["kv_heads"] else f"{r['q_heads']} heads"
    parts = [f"{r['batch']} x {heads} x {r['seq_len']:,} x {r['head_dim']}", "causal" if r["causal"] else "not causal"]
    if r.get("window_left") is not None:
        parts.append(f"window ({r['window_left']}, {r['window_right']})")
    if r.get("n_docs"):
        parts.append(f"{r['n_docs']} documents")
    return ", ".join(parts)


def _run_of(r: dict) -> str:
    return r["provenance"].get("output") or r["provenance"]["date"]


def _latest_run(group: list[dict]) -> list[dict]:
    """The rows of the newest run of one configuration that timed ours (or the newest run, if none did)."""
    runs: dict[str, list[dict]] = {}
    for r in sorted(group, key=lambda r: r["provenance"]["date"]):
        runs.setdefault(_run_of(r), []).append(r)
    with_ours = [rs for rs in runs.values() if any(r["role"] == "ours" for r in rs)]
    return (with_ours or list(runs.values()))[-1]


def _ms(r: dict, mode: str) -> float | None:
    return r.get(f"{mode}_ms") if r["status"] == "ok" else None


def _fastest(rows: list[dict], role: str, mode: str) -> dict | None:
    timed = [r for r in rows if r["role"] == role and _ms(r, mode) is not None]
    return min(timed, key=lambda r: r[f"{mode}_ms"]) if timed else None


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _config(ctx, config: str, run: list[dict]) -> str:
    ours = next((r for r in run if r["role"] == "ours"), None)
    first = ours or run[0]
    device = first["provenance"]["device"]
    lines = []
    for r in sorted(run, key=lambda r: ("ours", "peer", "reference").index(r["role"])):
        ratio = (_ms(ours, "forward_backward") / _ms(r, "forward_backward")
                 if ours is not None and r is not ours and _ms(ours, "forward_backward") and _ms(r, "forward_backward")
                 else None)
        lines.append({"impl": r["impl"], "role": r["role"], "told what is visible by": r.get("mask", "–"),
                      "status": r["status"] if len(r["status"]) < 80 else r["status"][:77] + "...",
                      "fwd ms": _fmt(_ms(r, "forward")), "fwd+bwd ms": _fmt(_ms(r, "forward_backward")),
                      "fwd+bwd TFLOP/s (visible pairs)": _fmt(r.get("forward_backward_tflops") if r["status"] == "ok"
                                                              else None, ".0f"),
                      "ours / this (fwd+bwd)": _fmt(ratio, ".2f"),
                      "max abs diff vs " + (ours["impl"] if ours else "first"): _fmt(r.get("max_abs_diff"), ".2g")})
    parts = [f"### {config}: {shape_text(first)}\n",
             f"Visible pairs: {first['visible_fraction']:.1%} of all (query, key) pairs; {first['dtype']}, {device}."
             + (" Document lengths per sequence (drawn with seed "
                f"{first['doc_seed']}): " + "; ".join(", ".join(map(str, ls)) for ls in first["doc_lengths"]) + "."
                if first.get("doc_lengths") else "") + "\n",
             pd.DataFrame(lines).to_markdown(index=False, disable_numparse=True) + "\n"]  # cells formatted above
    verdict = []
    for mode, label in MODES:
        peer = _fastest(run, "peer", mode)
        if ours is not None and _ms(ours, mode) is not None and peer is not None:
            verdict.append(f"{label} {_ms(ours, mode) / peer[f'{mode}_ms']:.2f}x ({peer['impl']} "
                           f"{peer[f'{mode}_ms']:.3f} ms)")
    peer = _fastest(run, "peer", "forward_backward")
    ours_ms = _ms(ours, "forward_backward") if ours is not None else None
    if verdict:
        parts.append("Ours / the fastest peer: " + "; ".join(verdict) + ".\n")
    else:
        parts.append("No ratio: " + ("ours did not run (" + ours["status"] + ")" if ours is not None and ours_ms is None
                                     else "ours was not timed" if ours is None else "no peer ran") + ".\n")
    ref = _fastest(run, "reference", "forward_backward")
    if ref is not None and ours_ms is not None:
        parts.append(f"Plain causal attention without the mask (reference: {ref['impl']}, "
                     f"{ref['visible_fraction']:.1%} of the pairs) takes {ref['forward_backward_ms']:.3f} ms "
                     f"forward+backward; ours with the mask {ours_ms:.3f} ms "
                     f"({ours_ms / ref['forward_backward_ms']:.2f}x).\n")
    what = f"attention fwd+bwd, {config} ({shape_text(first)}), {first['dtype']}, {device}"
    if ours_ms is not None and peer is not None:
        ratio = ours_ms / peer["forward_backward_ms"]
        ctx.versus("flash_features", what, f"{ours_ms:.3f} ms", f"{peer['impl']} {peer['forward_backward_ms']:.3f} ms",
                   ratio, GOAL)
        ctx.answer("flash_features", f"{config}: ours {ratio:.2f}x the fastest peer's fwd+bwd time ({peer['impl']})")
    else:
        ctx.versus("flash_features", what, ours["status"] if ours is not None else "not timed",
                   f"{peer['impl']} {peer['forward_backward_ms']:.3f} ms" if peer else "–", None, GOAL)
        ctx.answer("flash_features", f"{config}: no same-run comparison yet")
    parts.append(provenance(run) + "\n")
    return "\n".join(parts)


def build(ctx) -> str | None:
    rows = load(ctx, FLASH_FEATURES)
    if not rows:
        return None
    parts = ["## flash_features\n",
             "`cs336_systems.attention.flash_attention` with grouped-query heads, a sliding window and packed "
             "documents (issue 21) against PyTorch: `flash-bench --only features` times every implementation of a "
             "shape in one process on the same bf16 inputs, forward and forward+backward (`o.backward(do)`, median "
             "of `triton.testing.do_bench`). FlexAttention is compiled afresh per shape with a block mask, SDPA "
             "pinned to one backend (`enable_gqa` for grouped heads) or given a dense boolean mask; building a "
             "block mask or a dense mask is not timed. Every mask comes from one predicate, and each row's "
             "largest difference from our output shows that it computes the same attention. A window (left, "
             "right) lets query i see keys i - left..i + right: the issue's causal window of 4,096 is (4096, 0). "
             "*reference* rows compute plain causal attention (no window, no documents): what the mask saves, "
             "not a peer. TFLOP/s count the visible pairs only (4 d FLOPs per pair and head forward, x3.5 "
             "forward+backward); ratios are ours / the other's time (below 1: ours is faster).\n"]
    for config in dict.fromkeys(r["config"] for r in rows):
        parts.append(_config(ctx, config, _latest_run([r for r in rows if r["config"] == config])))
    ctx.code("flash_features", "cs336_systems/attention/flash_triton.py", "flash_attention",
             "grouped-query heads, windows, packed documents")
    return "\n".join(parts)
