"""Migrate superseded records in ``results/`` once, in place, so that the report reads every record
the same way and repairs none (run from the repository root: ``python scripts/migrate_records.py``).

Idempotent: a second run changes nothing. Every changed field is named in the record's
``provenance.migrated`` with the reason; no measurement is dropped. What it does, per record:

* ``git_commit`` "unknown": the last commit before the record's date that touched the modules that
  wrote it (``git log --before``), marked as inferred.
* ``command`` (and ``trace_dir`` / ``snapshot_dir``) naming machine-local output folders
  (``/root/out/...``): made relative as ``cs336_systems.records.relative_command`` does for new runs.
* ``output``: the record file relative to ``results/`` (new records carry it).
* shard-bench runs recorded before ``start_alloc_gib``: the memory the ``none`` variant left allocated
  is derived from the run (init_alloc(ddp or zero1) - init_alloc(none); exact because neither wrapper
  allocates at construction) and recorded as ``start_alloc_gib`` with the ``*_net_gib`` counters.
* memory runs recorded before ``start_alloc_gib``: derived per run as the excess of "allocated before
  the step" over parameters + optimizer state, minus the run's smallest excess (the first
  configuration of a fresh process starts clean).
* ddp-bench runs recorded before ``peak_memory_scope``: ``"process"`` (the peak was the running
  maximum since the processes started, an upper bound for every variant after the first).
* options of experiments since moved out of the package (BucketedDDP's ``compute_dtype`` and
  ``transport``, NCCL CTA caps ``nccl_max_ctas``, high-priority streams, SM carveout, and CPU binding,
  which was an environment variable recorded in ``nccl_env``): gathered in one ``experiment`` object
  per row, default values (None, False, "collective") left out; ``nccl_env`` keeps ``NCCL_*`` only.
* ``COMMIT_CORRECTIONS``: runs whose recorded commit was wrong (named per file, with the reason and the
  commit whose tree ran).
* ``training_step`` step rows and loss checks recorded before ``residual_dtype``: ``"fp32"`` (the token
  embedding was fp32 in every earlier version); our step rows recorded before ``rope``: ``"torch"``.
* FlexAttention sweep timings taken before each shape got a fresh compile (no ``flex_compile``):
  past dynamo's recompile limit they ran eagerly, so ``status`` becomes ``discarded: eager fallback``
  (the timings stay in the record).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cs336_systems.records import relative_command  # noqa: E402
from cs336_systems.records.schema import ABS_MEMORY_KEYS, net_key  # noqa: E402

# The modules that wrote each problem's records (for the inferred commit).
WRITERS = {
    "benchmarking_script": ("cs336_systems/commands/bench.py", "cs336_systems/bench/e2e.py"),
    "torch_compile": ("cs336_systems/commands/bench.py", "cs336_systems/bench/e2e.py"),
    "gradient_checkpointing": ("cs336_systems/commands/bench.py", "cs336_systems/bench/e2e.py"),
    "mfu_target": ("cs336_systems/commands/bench.py", "cs336_systems/bench/e2e.py"),
    "benchmarking_mixed_precision": ("cs336_systems/commands/precision.py", "cs336_systems/bench/precision.py"),
    "mixed_precision_accumulation": ("cs336_systems/commands/precision.py", "cs336_systems/bench/precision.py"),
    "nsys_profile": ("cs336_systems/commands/profile.py", "cs336_systems/bench/profile.py"),
    "memory_profiling": ("cs336_systems/commands/memory.py", "cs336_systems/bench/memory.py"),
    "pytorch_attention": ("cs336_systems/commands/attention_bench.py", "cs336_systems/bench/attention.py"),
    "flash_benchmarking": ("cs336_systems/commands/flash_bench.py", "cs336_systems/bench/flash.py"),
    "flash_leaderboard": ("cs336_systems/commands/flash_bench.py", "cs336_systems/bench/flash.py"),
    "distributed_communication_single_node": ("cs336_systems/commands/comm_bench.py", "cs336_systems/bench/comm.py"),
    "ddp_bucketed_benchmarking": ("cs336_systems/commands/ddp_bench.py", "cs336_systems/bench/ddp.py"),
    "optimizer_state_sharding_accounting": ("cs336_systems/commands/shard_bench.py", "cs336_systems/bench/shard.py"),
    "train": ("cs336_systems/commands/train.py", "cs336_systems/train.py"),
    "training_step": ("cs336_systems/commands/bench.py", "cs336_systems/bench/e2e.py", "scripts/device/ce_memory.py",
                      "scripts/device/step_loss_check.py"),
}
DIR_FIELDS = {"trace_dir": "--trace-dir", "snapshot_dir": "--snapshot-dir"}


def inferred_commit(problem: str, date: str) -> str:
    if problem not in WRITERS:
        raise SystemExit(f"{problem}: a record without a commit, and no writing modules listed in WRITERS")
    out = subprocess.run(["git", "log", "-1", f"--before={date}", "--format=%h", "--abbrev=12", "--",
                          *WRITERS[problem]], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if not out:
        raise SystemExit(f"no commit of {WRITERS[problem]} before {date}")
    return out


# record file (relative to results/) -> (recorded commit, the commit whose tree ran, why)
COMMIT_CORRECTIONS = {
    f"leaderboard_2026/20261124-{stamp}-nvidia-h200.jsonl": (
        "9325235", "a560477", "the command took CS336_GIT_COMMIT from `git rev-parse` on the device, whose copy of "
        ".git is the session's starting checkout; the working tree sent was main at a560477")
    for stamp in ("125831", "125845")
} | {
    f"train/20261124-{stamp}-nvidia-h100-80gb-hbm3.jsonl": (
        "5d5b9f0", "7b728a0", "CS336_GIT_COMMIT was typed from memory, not from `git rev-parse --short HEAD`; the "
        "working tree sent was main at 7b728a0")
    for stamp in ("164225", "164616")
} | {
    "flash_leaderboard/20261207-165818-nvidia-h100-80gb-hbm3.jsonl": (
        "590bcdb", "9ea8e9f", "the command took CS336_GIT_COMMIT from `git rev-parse` on the device, whose copy of "
        ".git is the session's starting checkout; the working tree sent was main at 9ea8e9f")
}


def _mark(row: dict, field: str, why: str) -> None:
    row["provenance"].setdefault("migrated", {})[field] = why


def migrate_provenance(problem: str, path: Path, row: dict) -> None:
    prov = row["provenance"]
    wrong, right, why = COMMIT_CORRECTIONS.get(f"{problem}/{path.name}", (None, None, None))
    if wrong is not None and prov.get("git_commit") == wrong:
        prov["git_commit"] = right
        _mark(row, "git_commit", f"corrected from {wrong}: {why}")
    if prov.get("git_commit") in (None, "", "unknown"):
        prov["git_commit"] = inferred_commit(problem, prov["date"])
        _mark(row, "git_commit", "inferred: the last commit before the record's date touching "
                                 + ", ".join(WRITERS[problem]) + " (the run did not record one)")
    command = relative_command(shlex.split(prov["command"])) if "/root/" in prov["command"] else prov["command"]
    if command != prov["command"]:
        prov["command"] = command
        _mark(row, "command", "machine-local output folders written relative")
    for field, flag in DIR_FIELDS.items():
        value = row.get(field)
        if isinstance(value, str) and value.startswith("/"):
            row[field] = relative_command(["x", flag, value]).split(" ")[-1]
            _mark(row, field, "machine-local folder written relative")
    prov.setdefault("output", f"{problem}/{path.name}")


def _ok(rows: list[dict], variant: str) -> dict | None:
    return next((r for r in rows if r.get("variant") == variant and r.get("status") == "ok"), None)


def migrate_shard_run(rows: list[dict]) -> None:
    if all("start_alloc_gib" in r for r in rows):
        return
    names = [r["variant"] for r in rows]
    none = _ok(rows, "none")
    if none is None or "init_alloc_gib" not in none:
        return  # nothing to derive from: the absolute counters stay as recorded
    start = names.index("none") + 1
    after = rows[start:]
    estimates = [r["init_alloc_gib"] - none["init_alloc_gib"] for r in (_ok(after, "ddp"), _ok(after, "zero1")) if r]
    if not estimates:
        return
    leftover = estimates[0]
    for i, r in enumerate(rows):
        sub = leftover if i >= start else 0.0
        r["start_alloc_gib"] = sub
        for k in ABS_MEMORY_KEYS:
            if k in r:
                r[net_key(k)] = r[k] - sub
        _mark(r, "start_alloc_gib", f"derived: {sub:.6f} GiB left allocated by the `none` variant measured before "
                                    "it (init_alloc(ddp) - init_alloc(none)), recorded before shard-bench measured it")


def migrate_memory_run(rows: list[dict]) -> None:
    run = [r for r in rows if r.get("status") == "ok" and "start_alloc_gib" not in r
           and r.get("baseline_gib") is not None and r.get("params_and_optimizer_state_gib") is not None]
    if not run:
        return
    excess = [r["baseline_gib"] - r["params_and_optimizer_state_gib"] for r in run]
    floor = min(excess)
    for r, e in zip(run, excess, strict=True):
        r["start_alloc_gib"] = e - floor
        _mark(r, "start_alloc_gib", "derived: excess of allocated-before-step over parameters + optimizer state, "
                                    "minus the run's smallest (recorded before memory measured it)")


def migrate_ddp_run(rows: list[dict]) -> None:
    for r in rows:
        if "peak_memory_scope" not in r and "peak_memory_gib" in r:
            r["peak_memory_scope"] = "process"
            _mark(r, "peak_memory_scope", "recorded before ddp-bench reset the peak per variant: the running "
                                          "maximum since the processes started")


def migrate_flash_rows(rows: list[dict]) -> None:
    for r in rows:
        if (r.get("impl") == "flex" and "flex_compile" not in r and r.get("status") == "ok"):
            r["status"] = "discarded: eager fallback"
            _mark(r, "status", "timed before each shape got a fresh torch.compile: past dynamo's recompile limit "
                               "flex_attention ran eagerly, so these are not FlexAttention's timings")


EXPERIMENT_KEYS = ("compute_dtype", "transport", "nccl_high_priority", "nccl_max_ctas", "sm_carveout")
EXPERIMENT_DEFAULTS = (None, False, "collective")
ENV_EXPERIMENTS = {"CS336_BIND_CPUS": ("cpus_bound", lambda v: v == "1")}


def migrate_experiments(row: dict) -> None:
    found = [k for k in EXPERIMENT_KEYS if k in row]
    env = row["provenance"].get("nccl_env") or {}
    found_env = [k for k in env if not k.startswith("NCCL_")]
    if not (found or found_env):
        return
    exp = row.setdefault("experiment", {})
    for k in found:
        v = row.pop(k)
        if v not in EXPERIMENT_DEFAULTS:
            exp[k] = v
    for k in found_env:
        v = env.pop(k)
        if k in ENV_EXPERIMENTS:
            name, convert = ENV_EXPERIMENTS[k]
            exp[name] = convert(v)
        else:
            exp[k.lower()] = v
    if not env:
        row["provenance"].pop("nccl_env", None)
    if not exp:
        del row["experiment"]
    _mark(row, "experiment", "options of experiments since moved to experiments/ gathered here (defaults left out); "
                             "nccl_env keeps NCCL_* only")


def migrate_residual_dtype(rows: list[dict]) -> None:
    for r in rows:
        if "residual_dtype" not in r and (r.get("check") == "loss" or "impl" in r):
            r["residual_dtype"] = "fp32"
            _mark(r, "residual_dtype", "recorded before the field: the token embedding was fp32 in every earlier "
                                       "version, so the residual stream was (autocast's) fp32")


def migrate_rope(rows: list[dict]) -> None:
    for r in rows:
        if "rope" not in r and r.get("impl") == "ours":
            r["rope"] = "torch"
            _mark(r, "rope", "recorded before the field: RoPE was the model's PyTorch code in every earlier version")


def migrate_training_step(rows: list[dict]) -> None:
    migrate_residual_dtype(rows)
    migrate_rope(rows)


RUN_MIGRATIONS = {"optimizer_state_sharding_accounting": migrate_shard_run, "memory_profiling": migrate_memory_run,
                  "ddp_bucketed_benchmarking": migrate_ddp_run, "flash_benchmarking": migrate_flash_rows,
                  "training_step": migrate_training_step}


def migrate(results: Path) -> int:
    """Migrate every record file under ``results``; returns how many files changed."""
    changed = 0
    for path in sorted(results.glob("*/*.jsonl")):
        problem = path.parent.name
        text = path.read_text()
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        for row in rows:
            migrate_provenance(problem, path, row)
            migrate_experiments(row)
        if problem in RUN_MIGRATIONS:
            RUN_MIGRATIONS[problem](rows)
        new = "".join(json.dumps(r) + "\n" for r in rows)
        if new != text:
            path.write_text(new)
            changed += 1
    return changed


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results"
    print(f"migrated {migrate(target)} record files under {target}")
