"""Data-parallel scaling (issue #7; not a handout problem, hence the id ``data_parallel_scaling``):
how our wrappers and their PyTorch peers scale with the number of GPUs, from ``ddp-bench`` and
``shard-bench`` records only.

Every benchmark run (one command, one world size N) measures its methods beside ``none``, the plain
model on one GPU at the same per-GPU batch, in the same processes. So per run:

* tokens/s at N GPUs = N x batch x context / step time (the step time is the slowest rank's median);
  one GPU: batch x context / step time of ``none``;
* scaling efficiency = tokens/s at N / (N x one-GPU tokens/s of the same run) = step(none) / step(N);
* overhead vs one GPU = step(N) - step(none): everything data parallelism adds per step;
* exposed communication where the benchmark measures it: ddp-bench's step minus the same step under
  ``no_sync()``. shard-bench has no communication-free twin of its sharded steps; its profiled-step
  kernel numbers (NCCL kernels include time spent waiting for peers, and the profiler slows the step)
  are no measure of it, so for the sharded methods the overhead column is the closest measure;
* peak memory per GPU: the largest rank's allocator peak in the step (ddp-bench: ``peak_memory_gib``;
  shard-bench: the larger of the peaks before and in the optimizer step, net of what was allocated when
  the variant started; where scripts/migrate_records.py derived that, the text says so).

Runs are chosen per (benchmark, configuration, world size): the newest run holding ``none`` and at least
one method of the pair, on the newest GPU device that has records (CPU records only when there is no
GPU record, e.g. a dry run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from cs336_systems.records import read_records
from cs336_systems.records.schema import DDP_PROBLEM, SHARD_PROBLEM, net_key
from cs336_systems.report.sections._common import provenance

PROBLEM_IDS = ("data_parallel_scaling",)
TARGET_WORLD_SIZES = (2, 4, 8)  # what issue #7 asks for (4 and 8 need nvidia-h200-x4 / -x8)
BUCKET_MB = 100.0  # the bucketed DDP configuration compared with PyTorch DDP


@dataclass(frozen=True)
class Pair:
    title: str
    bench: str  # command
    problem: str
    ours: str  # record label (ddp-bench ``label``, shard-bench ``variant``)
    ours_name: str
    peer: str
    peer_name: str


PAIRS = (
    Pair("Bucketed DDP vs DistributedDataParallel", "ddp-bench", DDP_PROBLEM, f"bucketed-{BUCKET_MB:g}MB",
         f"bucketed DDP ({BUCKET_MB:g} MB buckets)", "torch-ddp", "PyTorch DDP"),
    Pair("Sharded optimizer vs ZeroRedundancyOptimizer", "shard-bench", SHARD_PROBLEM, "zero1",
         "ShardedOptimizer (zero1)", "torch-zero", "ZeroRedundancyOptimizer"),
    Pair("FSDP vs fully_shard", "shard-bench", SHARD_PROBLEM, "fsdp", "our FSDP", "torch-fsdp2",
         "PyTorch FSDP2 (fully_shard)"),
)
CONFIG_KEYS = ("preset", "context_length", "batch_size", "precision")


def _label(r: dict) -> str:
    return r.get("label") or r["variant"]


def _run_id(r: dict) -> tuple[str, str]:
    p = r.get("provenance", {})
    return (p.get("date", ""), p.get("command", ""))


def _device(r: dict) -> str:
    return r.get("provenance", {}).get("device", "CPU")


def _on_one_device(rows: list[dict]) -> list[dict]:
    """GPU records if any (else all), and of those only the device of the newest record."""
    gpu = [r for r in rows if not _device(r).startswith("CPU")]
    rows = gpu or rows
    if not rows:
        return []
    newest = max(rows, key=_run_id)
    return [r for r in rows if _device(r) == _device(newest)] if gpu else rows


def _runs(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows grouped by run (date, command), oldest first."""
    out: dict[tuple, list[dict]] = {}
    for r in sorted(rows, key=_run_id):
        out.setdefault(_run_id(r), []).append(r)
    return out


def _find(run: list[dict], label: str) -> dict | None:
    return next((r for r in run if _label(r) == label), None)


def _ok(r: dict | None) -> bool:
    return r is not None and r.get("status") == "ok" and r.get("step_ms") is not None


def select_runs(rows: list[dict], pair: Pair) -> dict[tuple, dict[int, list[dict]]]:
    """configuration -> world size -> rows of the newest run that holds ``none`` and a method of ``pair``."""
    out: dict[tuple, dict[int, list[dict]]] = {}
    for run in _runs(rows).values():  # oldest first: later runs replace earlier ones
        r0 = run[0]
        if not _ok(_find(run, "none")) or not (_find(run, pair.ours) or _find(run, pair.peer)):
            continue
        config = tuple(r0.get(k) for k in CONFIG_KEYS)
        out.setdefault(config, {})[int(r0["world_size"])] = run
    return out


def _peak_gib(r: dict, run: list[dict]) -> tuple[float | None, str | None]:
    """(peak memory per GPU, caveat) of one record; None where the record gives no clean value."""
    if "peak_memory_gib" in r:  # ddp-bench
        v = r.get("peak_memory_gib")
        running_max = r.get("peak_memory_scope") == "process" and _label(r) != _label(run[0])
        return (v or None), ("running maximum over the variants measured before it in the same processes, an "
                             "upper bound" if running_max and v else None)
    # shard-bench: the larger of the peaks before and in the step, net of what was allocated at the variant's start
    vals = [r[net_key(k)] for k in ("pre_step_peak_gib", "post_step_peak_gib") if r.get(net_key(k)) is not None]
    if not vals:
        return None, ("recorded before shard-bench measured what earlier variants left allocated"
                      if r is not run[0] else None)
    derived = "start_alloc_gib" in (r["provenance"].get("migrated") or {})
    note = (f"{r['start_alloc_gib']:.1f} GiB left allocated by an earlier variant subtracted (derived from the "
            "run's records by scripts/migrate_records.py)") if derived and r.get("start_alloc_gib") else None
    return (max(vals) or None), note


@dataclass
class Point:
    method: str
    world_size: int
    status: str
    step_ms: float | None = None
    tokens_per_s: float | None = None
    one_gpu_tokens_per_s: float | None = None
    efficiency: float | None = None
    overhead_ms: float | None = None
    exposed_ms: float | None = None
    peak_gib: float | None = None
    peak_note: str | None = None


def measure(run: list[dict], label: str) -> Point | None:
    """The scaling numbers of ``label`` in one run (None if the run does not hold it)."""
    r, none = _find(run, label), _find(run, "none")
    if r is None:
        return None
    n = int(r["world_size"])
    if not _ok(r):
        return Point(label, n, r.get("status", "?"))
    tokens = r["batch_size"] * r["context_length"]
    one = tokens / (none["step_ms"] * 1e-3)
    exposed = r.get("exposed_comm_ms")  # ddp-bench only: step minus the no_sync() step
    peak, note = _peak_gib(r, run)
    return Point(label, n, "ok", step_ms=r["step_ms"], tokens_per_s=n * tokens / (r["step_ms"] * 1e-3),
                 one_gpu_tokens_per_s=one, efficiency=none["step_ms"] / r["step_ms"],
                 overhead_ms=r["step_ms"] - none["step_ms"], exposed_ms=exposed, peak_gib=peak, peak_note=note)


def _fmt(v: float | None, spec: str) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _pair_table(pair: Pair, by_ws: dict[int, list[dict]]) -> tuple[pd.DataFrame, list[Point]]:
    rows, points = [], []
    for n in sorted(by_ws):
        run = by_ws[n]
        none = measure(run, "none")
        row = {"GPUs": n, "1 GPU tokens/s (same run)": _fmt(none.one_gpu_tokens_per_s, ",.0f"),
               "1 GPU peak GiB": _fmt(_peak_gib(_find(run, "none"), run)[0], ".1f")}
        for label, name in ((pair.ours, "ours"), (pair.peer, "peer")):
            p = measure(run, label)
            if p is None:
                row.update({f"{name} tokens/s": "not run"})
                continue
            points.append(p)
            if p.status != "ok":
                row.update({f"{name} tokens/s": p.status})
                continue
            row.update({f"{name} tokens/s": _fmt(p.tokens_per_s, ",.0f"), f"{name} efficiency": f"{p.efficiency:.1%}",
                        f"{name} overhead ms": _fmt(p.overhead_ms, ".1f")})
            if pair.bench == "ddp-bench":
                row[f"{name} exposed comm ms"] = _fmt(p.exposed_ms, ".1f")
            row[f"{name} peak GiB"] = _fmt(p.peak_gib, ".1f") + ("†" if p.peak_note and p.peak_gib is not None else "")
        rows.append(row)
    df = pd.DataFrame(rows).fillna("—")
    return df, points


def _plot(ctx, config: tuple, curves: dict[str, list[Point]], baselines: dict[tuple, float], name: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.3))
    sizes = sorted({1, *(p.world_size for ps in curves.values() for p in ps)})
    one = sum(baselines.values()) / len(baselines)
    a1.plot(sizes, [n * one for n in sizes], "k--", lw=1, label="ideal: N x one GPU (mean of the runs' `none`)")
    a1.scatter([1] * len(baselines), list(baselines.values()), color="gray", marker="x", zorder=3,
               label="one GPU (`none` of each run)")
    for (method, pts), style in zip(curves.items(), ("o-", "o--", "s-", "s--", "^-", "^--")):
        pts = sorted((p for p in pts if p.status == "ok"), key=lambda p: p.world_size)
        if not pts:
            continue
        xs = [p.world_size for p in pts]
        (line,) = a1.plot(xs, [p.tokens_per_s for p in pts], style, label=method)
        # efficiency is 1 at one GPU by definition: the curves start there
        a2.plot([1, *xs], [1.0, *(p.efficiency for p in pts)], style, color=line.get_color(), label=method)
    a1.set(xscale="log", xlabel="GPUs", ylabel="tokens/s (all GPUs)")
    a1.set_ylim(bottom=0)
    a2.set(xscale="log", xlabel="GPUs", ylabel="scaling efficiency (tokens/s / (N x one GPU))")
    a2.axhline(1.0, color="k", lw=0.8, ls="--")
    for ax in (a1, a2):
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
    effs = [p.efficiency for ps in curves.values() for p in ps if p.efficiency is not None]
    a2.set_ylim(0, max([1.1, *(1.05 * e for e in effs)]))
    a1.legend(fontsize=7)
    a2.legend(fontsize=7, loc="lower left")
    preset, ctx_len, batch, precision = config
    fig.suptitle(f"{preset}, {precision}, batch {batch}/GPU, context {ctx_len}: data-parallel scaling", fontsize=10)
    fig.tight_layout()
    path = ctx.figure_path(name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _config_section(ctx, config: tuple, selected: dict[Pair, dict[int, list[dict]]]) -> str:
    preset, ctx_len, batch, precision = config
    out = [f"### `{preset}`, {precision}, batch {batch} per GPU, context {ctx_len}\n"]
    curves: dict[str, list[Point]] = {}
    baselines: dict[tuple, float] = {}  # (benchmark, world size of the run) -> one-GPU tokens/s
    measured: dict[str, list[int]] = {}
    notes: list[str] = []
    used: list[dict] = []
    for pair in PAIRS:
        by_ws = selected.get(pair, {})
        if not by_ws:
            continue
        df, points = _pair_table(pair, by_ws)
        for n, run in by_ws.items():
            used += run
            baselines[(pair.bench, n)] = measure(run, "none").one_gpu_tokens_per_s
        measured.setdefault(pair.bench, [])
        measured[pair.bench] = sorted({*measured[pair.bench], *by_ws})
        for label, name in ((pair.ours, pair.ours_name), (pair.peer, pair.peer_name)):
            curves[name] = [p for p in points if p.method == label]
        out += [f"**{pair.title}** (`{pair.bench}`; ours = {pair.ours_name}, peer = {pair.peer_name})\n",
                df.to_markdown(index=False, disable_numparse=True), ""]
        for note in sorted({p.peak_note for p in points if p.peak_note}):
            hit = [p for p in points if p.peak_note == note]
            where = ", ".join(f"{p.method} at {p.world_size} GPUs" for p in hit)
            mark = "†" if hit[0].peak_gib is not None else "—"
            out.append(f"{mark} peak memory of {where}: {note}.\n")
        ok = [p for p in points if p.status == "ok"]
        if ok:
            top = max(p.world_size for p in ok)
            at_top = {p.method: p for p in ok if p.world_size == top}
            o, q = at_top.get(pair.ours), at_top.get(pair.peer)
            if o and q:
                ctx.answer("data_parallel_scaling", f"{precision}, {top} GPUs: {pair.ours_name} "
                           f"{o.efficiency:.1%} efficiency vs {pair.peer_name} {q.efficiency:.1%}")
                ctx.versus("data_parallel_scaling", f"{preset}, {precision}, {top} GPUs: {pair.title}",
                           f"{o.tokens_per_s:,.0f} tokens/s ({o.efficiency:.1%} efficiency)",
                           f"{pair.peer_name} {q.tokens_per_s:,.0f} tokens/s ({q.efficiency:.1%})",
                           q.tokens_per_s / o.tokens_per_s, "– (issue #7 measures, sets no target)")
                notes.append(f"{pair.ours_name} at {top} GPUs: {o.tokens_per_s:,.0f} tokens/s, "
                             f"{o.efficiency:.1%} efficiency, against {q.tokens_per_s:,.0f} tokens/s "
                             f"({q.efficiency:.1%}) for {pair.peer_name} in the same run "
                             f"({o.tokens_per_s / q.tokens_per_s - 1:+.1%})")
            elif o or q:
                p = o or q
                notes.append(f"{pair.ours_name if o else pair.peer_name} at {top} GPUs: {p.tokens_per_s:,.0f} "
                             f"tokens/s, {p.efficiency:.1%} efficiency (its peer has no record in that run)")
    if not curves:
        return ""
    fname = f"scaling_{preset}_{precision}_b{batch}_c{ctx_len}.png".replace("/", "-")
    path = _plot(ctx, config, curves, baselines, fname)
    lines = []
    for bench in ("ddp-bench", "shard-bench"):
        have = measured.get(bench, [])
        missing = [n for n in TARGET_WORLD_SIZES if n not in have]
        lines.append(f"`{bench}`: " + (f"measured at {', '.join(map(str, have))} GPUs" if have else "no run")
                     + (f"; not yet measured at {', '.join(map(str, missing))} GPUs" if missing else ""))
    out.insert(1, "World sizes: " + "; ".join(lines) + ". Runs at 4 and 8 GPUs come from "
               "`scripts/device/scaling.sh` on `nvidia-h200-x4` / `nvidia-h200-x8` (docs/parallelism.md).\n")
    out.insert(2, f"![scaling]({ctx.link(path)})\n")
    if notes:
        out.append("At the largest world size measured: " + "; ".join(notes) + ".\n")
    if len(baselines) > 1:
        lo, hi = min(baselines.values()), max(baselines.values())
        out.append(f"One-GPU tokens/s across the runs' `none` steps: {lo:,.0f} to {hi:,.0f} "
                   f"({hi / lo - 1:.1%} apart); each efficiency uses the baseline of its own run.\n")
    out.append(provenance(used) + "\n")
    return "\n".join(out)


def build(ctx) -> str | None:
    records = {problem: _on_one_device(read_records(problem, ctx.results_dir))
               for problem in (DDP_PROBLEM, SHARD_PROBLEM)}
    per_config: dict[tuple, dict[Pair, dict[int, list[dict]]]] = {}
    for pair in PAIRS:
        for config, by_ws in select_runs(records[pair.problem], pair).items():
            per_config.setdefault(config, {})[pair] = by_ws
    if not per_config:
        return None
    order = sorted(per_config, key=lambda c: (c[3] != "bf16", str(c[0]), c[1] or 0, c[2] or 0))
    parts = ["## data_parallel_scaling\n",
             "How the data-parallel methods scale with the number of GPUs (issue #7): each of ours beside its "
             "PyTorch peer in the same run, at the same per-GPU batch (weak scaling). Per run, tokens/s = GPUs x "
             "batch x context / step time (slowest rank, median); scaling efficiency = tokens/s / (GPUs x the "
             "one-GPU tokens/s of the same run's `none` step), i.e. step(`none`) / step(N); overhead = step(N) - "
             "step(`none`). Exposed communication (ddp-bench only): the step minus the same step under `no_sync()`. "
             "shard-bench runs no communication-free twin of a sharded step, so for the sharded optimizers and FSDP "
             "the overhead column is the closest measure (it also holds the wrappers' own work, less the optimizer "
             "work that sharding saves). Peak memory is per GPU, the largest rank's allocator peak.\n"]
    for config in order:
        text = _config_section(ctx, config, per_config[config])
        if text:
            parts.append(text)
    return "\n".join(parts)
