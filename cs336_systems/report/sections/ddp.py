"""Data-parallel training: all-reduce sweep, the four DDP wrappers vs PyTorch DDP, the overhead model,
and the communication accounting (computed in ``cs336_systems.parallel.accounting``)."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.parallel import accounting as acc
from cs336_systems.records import read_records
from cs336_systems.records.schema import COMM_PROBLEM, DDP_PROBLEM
from cs336_systems.report.plots import render_timeline
from cs336_systems.report.sections._common import cpus_bound

PROBLEM_IDS = (
    "distributed_communication_single_node", "naive_ddp", "naive_ddp_benchmarking", "minimal_ddp_flat_benchmarking",
    "ddp_overlap_individual_parameters", "ddp_overlap_individual_parameters_benchmarking", "ddp_overlap_bucketed",
    "ddp_bucketed_benchmarking", "communication_accounting",
)
COMM, DDP = COMM_PROBLEM, DDP_PROBLEM
# ddp-bench timings with no_sync() pairs, best first: "paired-aligned" starts every step with the ranks aligned;
# "paired" (earlier) did not, which charged the comm step for the other rank's lateness after a no_sync() step.
PAIRED = ("paired-aligned", "paired")


def _latest(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    out: dict[tuple, dict] = {}
    for r in rows:  # oldest file first: later runs replace earlier ones
        out[tuple(str(r.get(k)) for k in keys)] = r
    return list(out.values())


def _device(r: dict) -> str:
    return r.get("provenance", {}).get("device", "?")


def _provenance(rows: list[dict]) -> str:
    seen, lines = set(), []
    for r in rows:
        p = r.get("provenance", {})
        key = (p.get("device"), p.get("date"), p.get("command"))
        if key not in seen:
            seen.add(key)
            gpus = f" ({p['gpu_count']} GPUs visible)" if p.get("gpu_count") else ""
            lines.append(f"*Measured on {p.get('device')}{gpus}, torch {p.get('torch')}, "
                         f"{p.get('date')}, commit {p.get('git_commit')}: `{p.get('command')}`*")
    return "\n\n".join(lines)


def _md(df: pd.DataFrame, fmt: str = ".4g") -> str:
    return df.to_markdown(index=False, floatfmt=fmt)


# --- distributed_communication_single_node --------------------------------------------------------
def _comm_section(ctx) -> str | None:
    rows = _latest(read_records(COMM, ctx.results_dir), ("backend", "world_size", "size_mb"))
    if not rows:
        return None
    rows.sort(key=lambda r: (r["backend"], r["world_size"], r["size_mb"]))
    df = pd.DataFrame([{"backend": r["backend"], "device": _device(r), "processes": r["world_size"],
                        "size MB": r["size_mb"], "latency ms (median)": r["latency_median_ms"],
                        "± std": r["latency_std_ms"], "algbw GB/s": r["algbw_gbps"], "busbw GB/s": r["busbw_gbps"]}
                       for r in rows])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for (backend, ws), g in df.groupby(["backend", "processes"]):
        a1.loglog(g["size MB"], g["latency ms (median)"], marker="o", label=f"{backend}, {ws} proc")
        a2.semilogx(g["size MB"], g["busbw GB/s"], marker="o", label=f"{backend}, {ws} proc")
    a1.set(xlabel="all-reduce size (MB, float32)", ylabel="latency (ms, slowest rank, median)")
    a2.set(xlabel="all-reduce size (MB, float32)", ylabel="bus bandwidth (GB/s)", yscale="log")
    a1.legend(fontsize=8)
    a1.grid(True, which="both", alpha=0.3)
    a2.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = ctx.figure_path("allreduce.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)

    notes = []
    for backend, g in df.groupby("backend"):
        big = g[g["size MB"] == g["size MB"].max()]
        best = big.loc[big["busbw GB/s"].idxmax()]
        notes.append(f"{backend}: at {best['size MB']:g} MB the best bus bandwidth is {best['busbw GB/s']:.3g} GB/s "
                     f"({best['processes']} processes)")
    gloo = df[df.backend == "gloo"]
    if len(gloo.processes.unique()) > 1:
        lat = gloo.groupby("processes")["latency ms (median)"].max()
        notes.append(f"gloo's largest-size latency grows from {lat.iloc[0]:.0f} ms ({lat.index[0]} processes) to "
                     f"{lat.iloc[-1]:.0f} ms ({lat.index[-1]} processes): the CPU processes share the machine's cores "
                     "and memory bandwidth, so more ranks add traffic without adding links")
    ctx.answer(COMM, "; ".join(notes[:2]))
    return (f"## {COMM}\n\n`cs336-systems comm-bench` (5 warm-up iterations, barrier + synchronize around each timed "
            "all-reduce, latency = slowest rank; bus bandwidth = algbw x 2(n-1)/n as in nccl-tests).\n\n"
            f"![all-reduce]({ctx.link(path)})\n\n{_md(df)}\n\n" + "; ".join(notes) + ". Small all-reduces are "
            "latency bound (a fixed per-call cost dominates and bandwidth is far below the large-size value); large "
            "ones run at the transport's bandwidth. NCCL moves GPU memory over NVLink, gloo copies through host "
            "memory and TCP, hence orders of magnitude between them at every size.\n\n" + _provenance(rows) + "\n")


# --- implementation problems ------------------------------------------------------------------------
IMPLEMENTATION = {
    "naive_ddp": (
        "`cs336_systems.parallel.ddp.NaiveDDP`: after backward, `finish_gradient_synchronization()` all-reduces every "
        "gradient tensor separately, averaged inside the collective (`ReduceOp.AVG` on NCCL; sum then one divide "
        "on gloo). Verified in `tests/test_ddp.py` "
        "(gloo, 2 ranks): trained on a toy model with a frozen parameter and a bias without grad, a model with "
        "tied weights and a tiny `BasicsTransformerLM` with AdamW, its weights match single-process training on "
        "the global batch after every step (max deviation ~3e-7, fp32 summation order), and both ranks end "
        "bitwise identical."),
    "ddp_overlap_individual_parameters": (
        "`cs336_systems.parallel.ddp.OverlapDDP` (adapters `get_ddp_individual_parameters` / `get_ddp`): a "
        "`register_post_accumulate_grad_hook` on each trainable parameter issues an async all-reduce of its "
        "gradient in place (averaged by the collective on NCCL); `finish_gradient_synchronization()` waits on "
        "the handles. Launches follow "
        "reverse parameter order on every rank, so all ranks issue the same collective sequence. Rank 0's "
        "parameters and buffers are broadcast at construction, tied tensors reduced once, frozen ones skipped; a "
        "parameter without gradient raises naming it; `no_sync()` supports accumulation."),
    "ddp_overlap_bucketed": (
        "`cs336_systems.parallel.ddp.BucketedDDP(module, bucket_size_mb)` (adapters `get_ddp_bucketed`, "
        "`ddp_bucketed_on_after_backward`, `ddp_bucketed_on_train_batch_start`): parameters are packed in "
        "reverse order into buckets of at most `bucket_size_mb` MiB (one dtype/device each; a larger tensor gets "
        "its own); when a bucket's last gradient arrives, the bucket is all-reduced asynchronously (averaged by "
        "the collective on NCCL), buckets launched strictly in order. Gradients are views of the bucket's flat "
        "buffer (PyTorch DDP's `gradient_as_bucket_view` idea): when they already lie in it (kept by "
        "`zero_grad(set_to_none=False)`) nothing is copied, otherwise one concatenation fills a new buffer and "
        "each `.grad` becomes its view, so `finish_gradient_synchronization()` only waits. Tested with one "
        "bucket per parameter, a few buckets, and one bucket."),
}


# --- DDP benchmarks ---------------------------------------------------------------------------------
def _ddp_rows(ctx) -> tuple[list[dict], list[dict]]:
    """(the latest record of every variant and setting: the rows shown; every record of those runs' shape:
    where a row finds the single-GPU step and the peer measured in its own run)."""
    rows = read_records(DDP, ctx.results_dir)
    gpu = [r for r in rows if r.get("backend") == "nccl"] or rows
    if not gpu:
        return [], []
    # The DDP problems are answered at the smallest world size measured (2 GPUs); larger ones belong to the
    # data_parallel_scaling section.
    smallest = min(r.get("world_size", 2) for r in gpu)
    gpu = [r for r in gpu if r.get("world_size", 2) == smallest]
    # grad_comm_dtype: a run with bf16 gradients has its own `none` row (same label) that must not replace the
    # fp32 run's.
    latest = _latest([{**r, "compute_dtype": (r.get("experiment") or {}).get("compute_dtype")} for r in gpu],
                     ("preset", "precision", "label", "batch_size", "context_length", "grad_comm_dtype",
                      "compute_dtype"))
    shape = {(r["preset"], r["batch_size"], r["context_length"]) for r in latest}
    return latest, [r for r in gpu if (r["preset"], r["batch_size"], r["context_length"]) in shape]


# Experiment options that make a setting of their own (compared with the single-GPU step and the peer of the
# same setting); the others are variants within a setting.
SETTING_EXPERIMENTS = ("cpus_bound", "compute_dtype")


def _setting(r: dict) -> tuple[str, bool, str, bool, str]:
    """(precision, compiled, gradient all-reduce dtype, CPUs bound, dtype of our wrappers' Linear-weight copies):
    rows are compared with the single-GPU step and the peer of the same setting (measured in the same run)."""
    exp = r.get("experiment") or {}
    return (r["precision"], bool(r.get("compile")), r.get("grad_comm_dtype") or "fp32",
            cpus_bound(r), exp.get("compute_dtype") or "")


def _row_experiment(r: dict) -> dict:
    """The experiment options of ``r`` that vary within a setting."""
    return {k: v for k, v in (r.get("experiment") or {}).items() if k not in SETTING_EXPERIMENTS}


def _run(r: dict) -> str:
    return r["provenance"]["date"]


def _reference(rows: list[dict], r: dict, variant: str) -> dict | None:
    """The `variant` record to compare r with: from r's own run if it has one (``rows`` holds every record,
    not only the latest of each label), else the latest of r's setting (a run that only measured capped NCCL
    variants borrows the uncapped run's single-GPU step)."""
    same = [x for x in rows if x["variant"] == variant and _setting(x) == _setting(r)]
    own = [x for x in same if _run(x) == _run(r)]
    return max(own or same, key=_run) if (own or same) else None


def _ddp_table(rows: list[dict], everything: list[dict]) -> pd.DataFrame:
    out = []
    for r in rows:
        base, peer = _reference(everything, r, "none"), _reference(everything, r, "torch-ddp")
        out.append({
            "precision": r["precision"], "variant": r["label"], "step ms": r["step_ms"], "± std": r["step_std_ms"],
            "vs 1 GPU": r["step_ms"] / base["step_ms"] - 1 if base else math.nan,
            "vs torch DDP": r["step_ms"] / peer["step_ms"] - 1 if peer else math.nan,
            "paired overhead [95% CI]": _paired(r),
            # `none` has no coupled half: both of its halves are means over the ranks
            "vs slower rank [95% CI]": _paired(r, "overhead_vs_slowest") if r["variant"] != "none" else "",
            "exposed comm ms": r["exposed_comm_ms"], "in collectives ms": r.get("comm_kernel_ms", math.nan),
            "of it overlapped ms": r.get("comm_hidden_ms", math.nan), "sync wait ms": r["sync_ms"],
            "calls/step": r["comm_calls_per_step"], "peak GiB": r.get("peak_memory_gib")})
    return pd.DataFrame(out)


def _paired(r: dict, key: str = "overhead") -> str:
    """Median over pairs of step / (same step inside no_sync()) - 1, with its bootstrap interval (paired runs);
    ``key="overhead_vs_slowest"``: against the slower rank's no_sync() step (records that carry it)."""
    if r.get("timing") not in PAIRED or key not in r:
        return ""
    lo, hi = r[f"{key}_ci95"]
    return f"{100 * r[key]:+.1f}% [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def _fmt_pct(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for c in ("vs 1 GPU", "vs torch DDP"):
        df[c] = df[c].map(lambda x: "" if pd.isna(x) else f"{100 * x:+.1f}%")
    return df


def _setup(rows: list[dict]) -> str:
    r = rows[0]
    return (f"Setup: `{r['preset']}` ({r['n_params'] / 1e9:.2f} B parameters, {r['grad_bytes'] / 1e9:.1f} GB of fp32 "
            f"gradients per step), {r['world_size']} ranks x batch {r['batch_size']} x context {r['context_length']}, "
            f"{r['backend']}, AdamW, {r['warmup']} warm-up + {r['steps']} timed steps per variant (median of the "
            "slowest rank). *step*: synchronize-to-synchronize; *exposed comm*: step minus the same step inside "
            "`no_sync()` (no collectives); *in collectives*: summed NCCL kernel time of one profiled step, and the "
            "part of it that ran concurrently with compute kernels; *sync wait*: CUDA-event time the compute stream "
            "spent in `finish_gradient_synchronization()`. `none` = the plain model, no wrapper (single-GPU step). "
            "*paired overhead*: in runs with paired timing every timed step is followed by the same step inside "
            "`no_sync()`; the median over pairs of their ratio, minus 1, with a bootstrap 95% interval; with "
            "`paired-aligned` timing the ranks pass a barrier before every step and the "
            "no-communication half is the mean of the ranks' own steps. *vs slower rank*: the same pairs against the "
            "slower rank's own `no_sync()` step (newer records): a synchronised step cannot end "
            "before its slowest rank, so what the ranks' spread alone costs is left out. `@bf16-weights`: our "
            "wrapper computes with bf16 copies of the Linear weights (`BucketedDDP(compute_dtype=bf16)`; the "
            "values autocast would use, gradients into the buckets in bf16). `@ce`: buckets averaged by the copy "
            "engines over NVLink (symmetric memory) instead of NCCL kernels. The eager "
            "bf16 step is host-bound and the lent machines' host speed drifts, so steps measured a minute apart "
            "(the `vs 1 GPU` column compares separately measured variants, each with the single-GPU step of its own "
            "run) can differ by more than the effect; "
            "pairs cancel the drift.")


def _select(df: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    return _fmt_pct(df[df.variant.isin(labels)])


def _overhead_model(ctx, rows: list[dict]) -> str:
    comm = [r for r in read_records(COMM, ctx.results_dir) if r.get("backend") == rows[0]["backend"]
            and r.get("world_size") == rows[0]["world_size"]]
    comm = _latest(comm, ("size_mb",))
    text = ("**(b) Overhead model.** Let backward produce n_b equal buckets whose compute time equals their transfer "
            "time c = s / (n_b w), and let each all-reduce cost o on top. Bucket i's transfer starts after its "
            "compute and after bucket i-1's transfer, so the communication stream ends at n_b (o + c) + c while "
            "backward ends at n_b c:\n\n    overhead(n_b) = s / (n_b w) + n_b o\n\nMinimising over n_b: "
            "n_b* = sqrt(s / (w o)), i.e. optimal bucket size b* = s / n_b* = sqrt(s w o), with overhead "
            "2 sqrt(s o / w).")
    if len(comm) < 2:
        return text + " (No all-reduce records on this backend / world size to fit o and w yet.)"
    o, w = acc.fit_latency_model([r["bytes"] for r in comm], [r["latency_median_ms"] / 1e3 for r in comm])
    s = rows[0]["grad_bytes"]
    n_opt, b_opt = acc.optimal_buckets(s, w, max(o, 1e-9))
    lines = [text, "",
             f"Fitting latency = o + bytes / w to this run's all-reduce records ({rows[0]['backend']}, "
             f"{rows[0]['world_size']} ranks, {len(comm)} sizes) gives o = {o * 1e6:.1f} us, w = {w / 1e9:.1f} GB/s; "
             f"with s = {s / 1e9:.2f} GB the model predicts n_b* = {n_opt:.0f} buckets of "
             f"b* = {b_opt / 2**20:.0f} MiB. "
             "Predicted vs measured overhead per bucket size:", ""]
    table = []
    for r in rows:
        if r["variant"] != "bucketed":
            continue
        nb = max(1, math.ceil(s / (r["bucket_size_mb"] * 2**20)))
        table.append({"precision": r["precision"], "bucket MiB": f"{r['bucket_size_mb']:g}", "buckets (model)": nb,
                      "calls/step (measured)": r["comm_calls_per_step"],
                      "model overhead ms": acc.ddp_overhead_s(s, w, o, nb) * 1e3,
                      "measured exposed ms": r["exposed_comm_ms"]})
    if table:
        lines.append(_md(pd.DataFrame(table), ".3g"))
    lines.append("\nThe model's assumption (per-bucket compute = per-bucket transfer) holds only roughly: where "
                 "backward is much longer than the transfer, every bucket but the last hides completely and the "
                 "measured overhead sits below the model; the trend (huge buckets expose one large transfer, "
                 "tiny buckets pay per-call costs) is what it predicts.")
    return "\n".join(lines)


def _ddp_sections(ctx) -> dict[str, str]:
    rows, everything = _ddp_rows(ctx)
    if not rows:
        return {}
    order = {lab: i for i, lab in enumerate(["none", "naive", "flat", "overlap"])}
    rows.sort(key=lambda r: (r["precision"], bool(r.get("compile")), order.get(r["variant"], 4),
                             r.get("bucket_size_mb") or 0, r["variant"] == "torch-ddp", r["label"]))
    df = _ddp_table(rows, everything)
    prov = _provenance(rows)
    cpu_note = ("\n\n*These records come from a CPU (gloo) run: they check the pipeline, not the hardware; the GPU "
                "numbers come from `scripts/device/ddp.sh`.*" if rows[0]["backend"] != "nccl" else "")
    head = _setup(rows) + cpu_note
    out = {}
    for pid, label in (("naive_ddp_benchmarking", "naive"), ("minimal_ddp_flat_benchmarking", "flat"),
                       ("ddp_overlap_individual_parameters_benchmarking", "overlap")):
        for r in (x for x in rows if x["label"] == label and x.get("step_ms") is not None):
            base = _reference(everything, r, "none")
            if base and base.get("step_ms"):
                exposed = r.get("exposed_comm_ms")
                ctx.answer(pid, f"{r['preset']}, {r['world_size']} ranks, {r['precision']}: {label} "
                           f"{r['step_ms']:.1f} ms/step vs single-GPU {base['step_ms']:.1f} ms "
                           f"({100 * (r['step_ms'] / base['step_ms'] - 1):+.1f}%)"
                           + (f", exposed communication {exposed:.1f} ms" if exposed is not None else ""))
    out["naive_ddp_benchmarking"] = (f"## naive_ddp_benchmarking\n\n{head}\n\n"
                                     f"{_md(_select(df, ['none', 'naive']))}\n\n{prov}\n")
    out["minimal_ddp_flat_benchmarking"] = (
        "## minimal_ddp_flat_benchmarking\n\nOne all-reduce of all gradients flattened together vs one per tensor "
        f"(same run):\n\n{_md(_select(df, ['none', 'naive', 'flat']))}\n")
    png = None

    timeline_rows = [r for r in rows if r.get("timeline")]
    if timeline_rows:
        precision = "bf16" if any(r["precision"] == "bf16" for r in timeline_rows) else timeline_rows[0]["precision"]
        png = render_timeline([r for r in timeline_rows if r["precision"] == precision],
                              ctx.figure_path(f"ddp_timeline_{precision}.png"),
                              f"{rows[0]['preset']}: one profiled training step on rank 0 (blue: compute kernels, "
                              "red: NCCL all-reduce kernels)")
    out["ddp_overlap_individual_parameters_benchmarking"] = (
        "## ddp_overlap_individual_parameters_benchmarking\n\n(a) Per-parameter async all-reduce from gradient hooks "
        f"vs the two post-backward variants:\n\n{_md(_select(df, ['none', 'naive', 'flat', 'overlap']))}\n\n"
        "(b) Kernel timelines of one profiled step (torch.profiler, rendered from the recorded kernel intervals): "
        "in `naive` every all-reduce kernel starts after the last backward kernel; in the overlapped variants they "
        "run during backward." + (f"\n\n![timeline]({ctx.link(png)})" if png else "") + "\n")
    perf = []
    shown = {"none", "naive", "flat", "overlap", "torch-ddp", *(f"bucketed-{mb}MB" for mb in (1, 10, 100, 1000))}
    for setting in sorted({_setting(r) for r in rows}):
        precision, compiled, comm, bound, weights = setting
        buckets = [r for r in rows if _setting(r) == setting and r["variant"] == "bucketed"]
        if not buckets:
            continue
        # Paired rows (the latest method) when there are any: their overhead is the drift-free figure.
        paired = next(([r for r in buckets if r.get("timing") == t] for t in PAIRED
                       if any(r.get("timing") == t for r in buckets)), [])
        best = min(paired, key=lambda r: r["overhead"]) if paired else min(buckets, key=lambda r: r["step_ms"])
        none, peer = _reference(everything, best, "none"), _reference(everything, best, "torch-ddp")
        if none is None:
            continue
        vs1 = best["step_ms"] / none["step_ms"] - 1
        line = (f"- {precision}{', compiled blocks' if compiled else ', eager'}"
                f"{f', gradients all-reduced in {comm}' if comm != 'fp32' else ''}"
                f"{f', our wrapper computing with {weights} copies of the Linear weights' if weights else ''}"
                f"{', each rank bound to its own CPU cores' if bound else ''}: best bucketed ({best['label']}) "
                f"{best['step_ms']:.1f} ± {best['step_std_ms']:.1f} ms vs single-GPU ({none['label']}) "
                f"{none['step_ms']:.1f} ± {none['step_std_ms']:.1f} ms ({100 * vs1:+.1f}%"
                + (", measured apart: the paired figure that follows is the one the target is judged on)" if paired else
                   f": {'within' if vs1 <= 0.05 else 'NOT within'} 5%)"))
        if peer:
            vsp = best["step_ms"] / peer["step_ms"] - 1
            line += (f"; vs PyTorch DDP ({peer['label']}) {peer['step_ms']:.1f} ms ({100 * vsp:+.1f}%: "
                     f"{'at most' if vsp <= 0 else 'SLOWER than'} the peer)")
        if paired:
            lo, hi = best["overhead_ci95"]
            line += (f". Paired with its own no-communication steps (each step followed by the same step inside "
                     f"`no_sync()`, so both see the same host conditions): {100 * best['overhead']:+.1f}% (95% "
                     f"interval {100 * lo:+.1f}% to {100 * hi:+.1f}%: "
                     f"{'within' if best['overhead'] <= 0.05 else 'NOT within'} 5%)")
            if peer and peer.get("timing") in PAIRED:
                line += f"; PyTorch DDP paired the same way: {_paired(peer)}"
            if "nocomm_fwd_bwd_ms" in best:
                line += (f". Where the pairs differ: forward+backward {best['fwd_bwd_ms']:.1f} ms vs "
                         f"{best['nocomm_fwd_bwd_ms']:.1f} ms in the `no_sync()` steps, then {best['sync_ms']:.1f} ms "
                         f"waiting for the gradients, optimizer {best['optimizer_ms']:.1f} vs "
                         f"{best['nocomm_optimizer_ms']:.1f} ms (medians, mean over ranks)")
            if "overhead_vs_slowest" in best:
                line += (f". Against the slower rank's own `no_sync()` step (a synchronised step cannot end before "
                         f"its slowest rank: the ranks' spread is not communication): "
                         f"{_paired(best, 'overhead_vs_slowest')}")
            tried = [r for r in paired if _row_experiment(r) and r["variant"] == "bucketed"]
            if tried:
                runs = {(_run(r), r["bucket_size_mb"]) for r in tried}
                plain = [r for r in paired if not _row_experiment(r)]
                free = min(plain, key=lambda r: r["overhead"]) if plain else None
                same = [r for r in plain if (_run(r), r["bucket_size_mb"]) in runs and r is not free]
                line += (". Rows with an experiment's options (each record's `experiment`; docs/report/notes.md): "
                         + "; ".join(f"`{r['label']}` {_paired(r)}, forward+backward "
                                     f"{r['fwd_bwd_ms']:.0f} ms then {r['sync_ms']:.0f} ms waiting for the gradients"
                                     for r in sorted(tried, key=lambda r: r["label"]))
                         + "".join(f"; without (`{r['label']}`, the same run): {_paired(r)}" for r in same)
                         + (f"; without, the best (`{free['label']}`, its own run): {_paired(free)}, forward+backward "
                            f"{free['fwd_bwd_ms']:.0f} ms then {free['sync_ms']:.0f} ms" if free else ""))
        if compiled and best.get("comm_kernel_ms") is not None:
            line += (f". Compiled, the backward no longer hides the all-reduce: forward+backward grows from "
                     f"{none['fwd_bwd_ms']:.0f} ms to {best['fwd_bwd_ms']:.0f} ms while the collectives run "
                     f"{best['comm_kernel_ms']:.0f} ms, {best['comm_hidden_ms']:.0f} ms of it beside compute "
                     "kernels (timeline above); docs/report/notes.md discusses the variants tried against it")
        host = none.get("compute_kernel_ms")
        if host:
            line += (f". The single-GPU step's kernels add up to {host:.0f} ms of its {none['step_ms']:.0f} ms "
                     f"({100 * (1 - host / none['step_ms']):.0f}% of the step the GPU waits for the host)")
        perf.append(line)
        shown.add(best["label"])
        what = (f"{best['preset']}, {best['world_size']} ranks, {precision}{', compiled blocks' if compiled else ''}"
                f"{f', {comm} gradients' if comm != 'fp32' else ''}{f', {weights} weight copies' if weights else ''}"
                f"{', CPUs bound' if bound else ''}")
        # The summary compares what the package ships: settings and rows without an experiment's options.
        shipped = [r for r in (paired or buckets) if not _row_experiment(r)]
        if shipped and not (bound or weights):
            ours = (min(shipped, key=lambda r: r["overhead"]) if paired else min(shipped, key=lambda r: r["step_ms"]))
            ours_peer = _reference(everything, ours, "torch-ddp")
            if ours_peer:
                ctx.versus("ddp_bucketed_benchmarking", what, f"{ours['label']} {ours['step_ms']:.1f} ms"
                           + (f" (paired overhead {_paired(ours)})" if paired else ""),
                           f"{ours_peer['label']} {ours_peer['step_ms']:.1f} ms"
                           + (f" (paired overhead {_paired(ours_peer)})" if ours_peer.get("timing") in PAIRED else ""),
                           ours["step_ms"] / ours_peer["step_ms"], "overhead vs 1 GPU <= 5%, at most the peer")
        if not (compiled or bound or weights or comm != "fp32"):
            overhead = (f"paired overhead {_paired(best)}" if paired else f"{100 * vs1:+.1f}% vs one GPU")
            ctx.answer("ddp_bucketed_benchmarking", f"{precision}: best {best['label']} {best['step_ms']:.1f} ms/step, "
                       f"{overhead}" + (f"; PyTorch DDP {peer['step_ms']:.1f} ms" if peer else ""))
    out["ddp_bucketed_benchmarking"] = (
        "## ddp_bucketed_benchmarking\n\n(a) Bucket sizes 1 / 10 / 100 / 1000 MiB next to the other wrappers and "
        "PyTorch DDP (default 25 MiB buckets), measured in the same run (the handout's variants and the best "
        f"bucketed configuration of each setting; all {len(df)} rows below):\n\n{_md(_select(df, sorted(shown)))}\n\n"
        f"<details><summary>all {len(df)} variants</summary>\n\n{_md(_fmt_pct(df))}\n\n</details>\n\n"
        "Targets (issue #5):\n\n" + "\n".join(perf) + "\n\n" + _overhead_model(ctx, rows) + "\n")
    return out


# --- communication_accounting ---------------------------------------------------------------------
def _accounting() -> str:
    m, mesh = acc.FFNStack(), acc.Mesh()
    state = m.fp32_state_bytes
    act_tok = m.activation_bytes_per_token
    n_fsdp = acc.min_fsdp_degree(m, 95e9, tokens=0)
    b_dev = acc.fsdp_tp_min_batch_per_device(m, mesh)
    n_dev = mesh.x * mesh.y
    per_dev_tokens = math.ceil(b_dev)
    ex_tokens = 4096
    ex_n = acc.min_fsdp_degree(m, 95e9, tokens=ex_tokens)
    return f"""## communication_accounting

Computed by `cs336_systems.parallel.accounting` (XXL: d_model {m.d_model}, d_ff {m.d_ff}, {m.num_blocks} blocks of two
linears; {m.params / 1e9:.1f} B parameters).

(a) FP32 master weights + gradients + AdamW m and v = 16 B/parameter = **{state / 1e12:.2f} TB**
({state / 2**30:,.0f} GiB), i.e. {acc.devices_for(state, 80e9)} H100s of 80 GB for the state alone. Saved for backward
in BF16 (each linear's input: d_model + d_ff values per block): **{act_tok / 1e6:.1f} MB per token**
({act_tok * ex_tokens / 1e9:.0f} GB for a {ex_tokens}-token batch), on top of the state.

(b) Per device with state and half of the activations sharded over N_FSDP devices:
state / N + A / 2 + A / (2N), A = {act_tok / 1e6:.1f} MB x tokens. Below 95 GB (one v5p) takes N_FSDP >= **{n_fsdp}**
counting the state alone, and N_FSDP >= {ex_n} with a {ex_tokens}-token batch: the unsharded half of the
activations ({act_tok * ex_tokens / 2 / 1e9:.0f} GB there) caps how far sharding helps.

(c) X = {mesh.x} (FSDP, M_X = {mesh.m_x}), Y = {mesh.y} (TP, M_Y = {mesh.m_y}), W_ici = {mesh.w_ici:.2g} B/s,
C = {mesh.flops:.2g} FLOP/s. Per block and device, T_math = 4bDF/C against T_FSDP = 4DF/(Y W M_X) plus
T_TP = 4bYD/(W M_Y) (Scaling Book, part 5); compute bound when b >= (F/(Y W M_X)) / (F/C - Y/(W M_Y)) =
**{b_dev:.1f} tokens per device**, so at least {per_dev_tokens} per device and **{per_dev_tokens * n_dev:,} tokens**
overall on {n_dev} chips.

(d) To shrink the global batch while staying compute bound: raise arithmetic intensity per byte communicated.
Keep the weights' all-gathers off the critical path by overlapping them with compute (prefetch the next layer,
T = max(T_math, T_comm) instead of the sum); give TP the fast axis and a larger share of the mesh only as far as
T_TP stays below T_math, since the FSDP term falls as 1/Y; communicate in lower precision (FP8 all-gathers halve
T_FSDP); replace part of the data/FSDP axis by pipeline parallelism, whose communication is only activations at
stage boundaries and is independent of the weight size (GPipe, Huang et al. 2019; 1F1B / interleaved schedules,
Narayanan et al. 2021), paying with bubbles that micro-batching amortises; and use expert/sequence parallelism
where the model allows (Scaling Book, parts 5-6; Ultra-Scale Playbook).
"""


def build(ctx) -> str | None:
    ctx.code("naive_ddp", "cs336_systems/parallel/ddp.py", "NaiveDDP", "one all-reduce per gradient after backward")
    ctx.code("ddp_overlap_individual_parameters", "cs336_systems/parallel/ddp.py", "OverlapDDP",
             "async all-reduce per parameter from gradient hooks")
    ctx.code("ddp_overlap_bucketed", "cs336_systems/parallel/ddp.py", "BucketedDDP",
             "async all-reduce per bucket as its last gradient arrives")
    m, mesh = acc.FFNStack(), acc.Mesh()
    ctx.answer("communication_accounting",
               f"(a) {m.fp32_state_bytes / 1e12:.2f} TB of fp32 state, {m.activation_bytes_per_token / 1e6:.1f} MB "
               f"of bf16 activations per token; (b) N_FSDP >= {acc.min_fsdp_degree(m, 95e9, tokens=0)}; (c) "
               f"{math.ceil(acc.fsdp_tp_min_batch_per_device(m, mesh)) * mesh.x * mesh.y:,} tokens overall "
               "(computed by cs336_systems.parallel.accounting)")
    parts = []
    comm = _comm_section(ctx)
    if comm:
        parts.append(comm)
    ddp = _ddp_sections(ctx)
    parts.append(f"## naive_ddp\n\n{IMPLEMENTATION['naive_ddp']}\n")
    for pid in ("naive_ddp_benchmarking", "minimal_ddp_flat_benchmarking"):
        if pid in ddp:
            parts.append(ddp[pid])
    parts.append(f"## ddp_overlap_individual_parameters\n\n{IMPLEMENTATION['ddp_overlap_individual_parameters']}\n")
    if "ddp_overlap_individual_parameters_benchmarking" in ddp:
        parts.append(ddp["ddp_overlap_individual_parameters_benchmarking"])
    parts.append(f"## ddp_overlap_bucketed\n\n{IMPLEMENTATION['ddp_overlap_bucketed']}\n")
    if "ddp_bucketed_benchmarking" in ddp:
        parts.append(ddp["ddp_bucketed_benchmarking"])
    parts.append(_accounting())
    return "\n".join(parts)
