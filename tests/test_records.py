"""Records: the writer validates every row against its problem's kind, provenance names output folders
relatively, the one-off migration is idempotent, and the committed records fit the schema."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cs336_systems import records
from cs336_systems.records import KINDS, read_records

ROOT = Path(__file__).parents[1]
ROW = {"kind": "accumulation", "loop": "l", "accumulator": "fp32", "summand": "fp32", "result": 1.0}


@pytest.mark.parametrize(("row", "message"), [
    ({**ROW, "reslt": 1.0}, "unknown field 'reslt'"),
    ({k: v for k, v in ROW.items() if k != "loop"}, "missing the required field 'loop'"),
    ({**ROW, "result": "1.0"}, "field 'result' is str"),
])
def test_write_records_rejects_a_row_that_does_not_fit_its_kind(tmp_path, row, message):
    with pytest.raises(ValueError, match=message):
        records.write_records("mixed_precision_accumulation", [ROW, row], tmp_path, device="cpu")
    assert not any(tmp_path.rglob("*.jsonl"))  # nothing written


def test_write_records_names_unknown_problems_and_reads_back_typed_rows(tmp_path):
    with pytest.raises(ValueError, match="no record kind for problem 'bogus'"):
        records.write_records("bogus", [ROW], tmp_path, device="cpu")
    path = records.write_records("mixed_precision_accumulation", [ROW], tmp_path, device="cpu")
    (rec,) = read_records("mixed_precision_accumulation", tmp_path)
    assert rec["result"] == 1.0 and "exact" not in rec and rec.problem == "mixed_precision_accumulation"
    assert rec.prov.output == f"mixed_precision_accumulation/{path.name}"
    assert rec["provenance"]["device"].startswith("CPU")


def test_provenance_names_output_folders_relatively_and_keeps_only_nccl_variables(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("CS336_NCCL_CTAS", "8")
    monkeypatch.setattr("sys.argv", ["/x/cs336-systems", "ddp-bench", "--results-dir", "/root/out/results",
                                     "--trace-dir=/root/out/traces", "--steps", "3"])
    prov = records.provenance()
    assert prov["command"] == "cs336-systems ddp-bench --results-dir results --trace-dir=traces --steps 3"
    assert prov["nccl_env"]["NCCL_ALGO"] == "Ring" and all(k.startswith("NCCL_") for k in prov["nccl_env"])
    # a script that takes its results directory as an argument, and other machine-local paths
    assert records.relative_command(["scripts/x.py", "/root/out/r", "--data", "/data/tok.bin"], "/root/out/r") == \
        "scripts/x.py results --data tok.bin"


def _migration():
    spec = importlib.util.spec_from_file_location("migrate_records", ROOT / "scripts" / "migrate_records.py")
    mig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mig)
    return mig


def test_migration_is_idempotent_and_marks_what_it_changed(tmp_path):
    res = tmp_path / "results"
    (res / "memory_profiling").mkdir(parents=True)
    prov = {"device": "NVIDIA H100", "torch": "2.11", "date": "2026-11-22T05:30:40Z", "git_commit": "unknown",
            "command": "cs336-systems memory --results-dir /root/out/results --snapshot-dir /root/out/traces"}
    # A run recorded before start_alloc_gib, whose later rows found memory left over (excess 0 -> 0.5 -> 1.25).
    rows = [{"preset": "tiny", "mode": "forward", "precision": "fp32", "context_length": c, "batch_size": 1,
             "status": "ok", "baseline_gib": 12.85 + extra, "params_and_optimizer_state_gib": 12.69,
             "snapshot_dir": "/root/out/traces", "provenance": prov} for c, extra in ((8, 0.0), (16, 0.5), (32, 1.25))]
    path = res / "memory_profiling" / "20261122-053040-x.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mig = _migration()
    mig.inferred_commit = lambda problem, date: "c0ffee123456"  # git history: test_inferred_commit_...
    assert mig.migrate(res) == 1 and mig.migrate(res) == 0
    out = [json.loads(line) for line in path.read_text().splitlines()]
    assert [round(r["start_alloc_gib"], 6) for r in out] == [0.0, 0.5, 1.25]
    p = out[0]["provenance"]
    assert p["git_commit"] == "c0ffee123456" and p["migrated"]["git_commit"].startswith("inferred")
    assert p["command"] == "cs336-systems memory --results-dir results --snapshot-dir traces"
    assert out[0]["snapshot_dir"] == "traces" and p["output"] == "memory_profiling/20261122-053040-x.jsonl"
    assert "/root/" not in path.read_text()
    assert len(read_records("memory_profiling", res, strict=True)) == 3


def test_inferred_commit_is_the_writers_last_commit_before_the_record():
    import subprocess

    log = subprocess.run(["git", "log", "--format=%h %cI", "--abbrev=12", "--", "cs336_systems/bench/memory.py"],
                         cwd=ROOT, capture_output=True, text=True)
    commits = [line.split() for line in log.stdout.splitlines()]
    if log.returncode != 0 or len(commits) < 2:
        pytest.skip("needs the git history of cs336_systems/bench/memory.py (a full clone)")
    (new, new_date), (old, old_date) = commits[0], commits[-1]
    mig = _migration()
    mig.WRITERS = {"memory_profiling": ("cs336_systems/bench/memory.py",)}
    assert mig.inferred_commit("memory_profiling", old_date) == old
    assert mig.inferred_commit("memory_profiling", new_date) == new


def test_migration_derives_the_leftover_of_an_early_shard_run(tmp_path):
    (tmp_path / "optimizer_state_sharding_accounting").mkdir()
    prov = {"device": "NVIDIA H200", "torch": "2.11", "date": "2026-11-22T05:36:03Z", "git_commit": "abc",
            "command": "cs336-systems shard-bench"}
    base = {"preset": "xl", "precision": "bf16", "status": "ok", "context_length": 512, "batch_size": 4,
            "world_size": 2, "provenance": prov}
    rows = [{**base, "variant": "none", "init_alloc_gib": 8.0, "pre_step_peak_gib": 30.0},
            {**base, "variant": "ddp", "init_alloc_gib": 11.0, "pre_step_peak_gib": 34.0},
            {**base, "variant": "fsdp", "init_alloc_gib": 6.0, "pre_step_peak_gib": 20.0}]
    path = tmp_path / "optimizer_state_sharding_accounting" / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _migration().migrate(tmp_path)
    out = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["start_alloc_gib"] for r in out] == [0.0, 3.0, 3.0]  # init_alloc(ddp) - init_alloc(none)
    assert [r["pre_step_peak_net_gib"] for r in out] == [30.0, 31.0, 17.0]
    assert all("start_alloc_gib" in r["provenance"]["migrated"] for r in out)
    # without a `none` variant nothing can be derived: the run stays as recorded
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    _migration().migrate(tmp_path)
    assert all("start_alloc_gib" not in json.loads(line) for line in path.read_text().splitlines())


def test_committed_records_fit_the_schema_with_commit_and_relative_paths():
    n = 0
    for problem in KINDS:
        for r in read_records(problem, ROOT / "results", strict=True):
            assert r.prov.git_commit != "unknown" and "/root/" not in r.prov.command, r.prov.output
            assert r.prov.output and r.prov.output.startswith(f"{problem}/"), r.prov.output
            n += 1
    assert n > 1000
