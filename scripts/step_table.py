"""Print the same-run tables of issue 19 from results/training_step/ (ours vs the peer, fused-CE memory, loss
check), for docs/training_step.md. Reads records only.

    python scripts/step_table.py results/training_step --summary   # ours vs the peer of the same run only
    python scripts/step_table.py results/training_step --checks    # fused-CE memory and the loss check
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def main(root: str = "results/training_step", *flags: str) -> None:
    rows = []
    for f in sorted(Path(root).glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            r["file"], r["commit"] = f.name, r["provenance"].get("git_commit", r["provenance"].get("commit"))
            rows.append(r)
    df = pd.DataFrame(rows)
    step = df[df.get("step_mean_ms").notna()] if "step_mean_ms" in df else df.iloc[:0]
    cols = ["file", "impl", "preset", "context_length", "compile_scope", "optimizer", "loss", "checkpoint",
            "residual_dtype", "step_mean_ms", "step_median_ms", "step_std_ms", "forward_mean_ms", "backward_mean_ms",
            "optimizer_mean_ms", "mfu", "peak_memory_gib", "step_ratio_vs_peer", "memory_ratio_vs_peer"]
    pairs = []
    for _, ours in step[step["impl"] == "ours"].iterrows():
        peer = step[(step["impl"] == "peer") & (step["file"] == ours["file"]) & (step["preset"] == ours["preset"])
                    & (step["context_length"] == ours["context_length"])]
        if len(peer):
            peer = peer.iloc[0]
            pairs.append({"run": ours["file"][:15], "preset": ours["preset"], "context": int(ours["context_length"]),
                          "ours": f"{ours['compile_scope']}/{ours['optimizer']}/{ours['loss']}"
                                  + ("/bf16-residual" if ours.get("residual_dtype") == "bf16" else ""),
                          "peer ms (mean)": peer["step_mean_ms"], "ours ms (mean)": ours["step_mean_ms"],
                          "ratio (mean)": ours["step_ratio_vs_peer"],
                          "ratio (median)": ours["step_median_ms"] / peer["step_median_ms"],
                          "MFU peer": peer["mfu"], "MFU ours": ours["mfu"], "peak GiB peer": peer["peak_memory_gib"],
                          "peak GiB ours": ours["peak_memory_gib"], "memory ratio": ours["memory_ratio_vs_peer"]})
    if "--summary" in flags:
        print(pd.DataFrame(pairs).to_markdown(index=False, floatfmt=".3g"))
        return
    if "--checks" not in flags:
        print(step[[c for c in cols if c in step]].to_markdown(index=False, floatfmt=".3g"))
    for check in ("fused_ce_memory", "loss"):
        sub = df[df.get("check") == check] if "check" in df else df.iloc[:0]
        if len(sub):
            keep = [c for c in sub.columns if c not in ("provenance", "losses") and sub[c].notna().any()]
            print(sub[keep].to_markdown(index=False, floatfmt=".4g"))
            print()


if __name__ == "__main__":
    main(*sys.argv[1:])
