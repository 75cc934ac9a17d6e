"""Plot helpers the report's sections share (matplotlib, Agg backend): figures drawn from records."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def render_timeline(rows: list[dict], path: Path, title: str = "") -> Path | None:
    """Kernel timeline (one profiled step, rank 0) of each row that carries one: compute vs communication.
    Rows need ``timeline`` ({start_us, dur_us, comm}), ``label``, ``precision``, ``step_ms``."""
    rows = [r for r in rows if r.get("timeline")]
    if not rows:
        return None
    fig, axes = plt.subplots(len(rows), 1, figsize=(13, 1.9 * len(rows) + 0.6), squeeze=False)
    for ax, r in zip(axes[:, 0], rows, strict=True):
        tl = r["timeline"]
        for is_comm, y, color in ((False, 1, "tab:blue"), (True, 0, "tab:red")):
            bars = [(s / 1e3, d / 1e3) for s, d, c in zip(tl["start_us"], tl["dur_us"], tl["comm"], strict=True)
                    if c == is_comm]
            ax.broken_barh(bars, (y - 0.4, 0.8), color=color, linewidth=0)
        ax.set_yticks([0, 1], ["communication", "compute"])
        hidden = r.get("comm_hidden_ms", 0.0)
        total = r.get("comm_kernel_ms", 0.0)
        ax.set_title(f"{r['label']} ({r['precision']}): step {r['step_ms']:.0f} ms; communication "
                     f"{total:.0f} ms, of which {hidden:.0f} ms overlapped with compute", fontsize=9, loc="left")
        ax.set_xlabel("ms since the step's first kernel")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
