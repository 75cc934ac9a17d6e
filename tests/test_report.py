"""REPORT.md is rebuilt from records alone: run every command on tiny, then build the report."""

from __future__ import annotations

import pytest

from cs336_systems.cli import main
from cs336_systems.report import SECTION_MODULES, build_report

MINE = ("benchmarking_script", "nsys_profile", "mixed_precision_accumulation", "benchmarking_mixed_precision",
        "memory_profiling", "gradient_checkpointing", "pytorch_attention", "mfu_target")


@pytest.mark.slow
def test_report_from_tiny_records(tmp_path):
    res = str(tmp_path / "results")
    common = ["--device", "cpu", "--results-dir", res]
    tiny = ["--preset", "tiny", "--context-length", "32", "--warmup", "1", "--steps", "2"]
    assert main(["bench", *tiny, "--mode", "forward", "forward-backward", "train-step", "--precision", "fp32", "bf16",
                 *common]) == 0
    assert main(["bench", *tiny, "--checkpoint", "none", "1", "2", "nested", "--problem", "gradient_checkpointing",
                 *common]) == 0
    assert main(["bench", *tiny, "--precision", "bf16", "--attention", "sdpa", "--optimizer", "ours", "torch-fused",
                 "--problem", "mfu_target", *common]) == 0
    assert main(["precision", *common]) == 0
    assert main(["memory", "--preset", "tiny", "--context-length", "32", "64", "--precision", "fp32",
                 "--snapshot-dir", str(tmp_path / "results" / "memory_profiling" / "figures"), *common]) == 0
    assert main(["profile", "--preset", "tiny", "--context-length", "32", "--warmup", "1", "--steps", "2",
                 "--scope", "forward",
                 *common]) == 0
    assert main(["attention-bench", "--compile", "no", "--head-dim", "16", "--seq-len", "32", "64", "--reps", "2",
                 "--warmup", "1", *common]) == 0
    report = tmp_path / "REPORT.md"
    assert main(["report", "--results-dir", res, "--output", str(report)]) == 0
    text = report.read_text()
    for pid in MINE:
        assert f"## {pid}\n" in text, pid
    assert "Measured on CPU" in text and "`cs336-systems bench" in text
    for png in (tmp_path / "figures").glob("*.png"):
        assert png.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "figures" / "mixed_precision_step_time.png").exists()
    # torch_compile has no records here: it is listed as not yet measured
    assert "- `torch_compile`" in text.split("## Not yet measured")[-1]


def test_empty_results_list_everything_as_not_measured(tmp_path):
    report = build_report(tmp_path / "none", tmp_path / "REPORT.md")
    text = report.read_text()
    registered = {pid for _module, ids in SECTION_MODULES for pid in ids}
    for pid in MINE:
        assert pid in registered and f"- `{pid}`" in text


def test_memory_section_subtracts_leftover_from_earlier_configurations():
    from cs336_systems.report.sections.memory import _leftover_gib, _net

    prov = {"date": "2026-11-22T05:30:40Z"}
    # A run whose later rows found memory left over from earlier ones (the excess grows 0 -> 0.5 -> 1.25).
    rows = [{"status": "ok", "provenance": prov, "baseline_gib": 12.85 + extra, "params_and_optimizer_state_gib": 12.69,
             "peak_memory_gib": 20.0 + extra} for extra in (0.0, 0.5, 1.25)]
    rows.append({"status": "ok", "provenance": {"date": "later"}, "start_alloc_gib": 0.3, "baseline_gib": 9.0,
                 "params_and_optimizer_state_gib": 1.0, "peak_memory_gib": 10.0})
    leftover = _leftover_gib(rows)
    assert [round(leftover[id(r)], 6) for r in rows] == [0.0, 0.5, 1.25, 0.3]
    net = [_net(r, leftover[id(r)]) for r in rows]
    assert [round(r["peak_memory_gib"], 6) for r in net[:3]] == [20.0, 20.0, 20.0]
    assert net[3]["peak_memory_gib"] == pytest.approx(9.7) and net[3]["params_and_optimizer_state_gib"] == 1.0


def test_explicit_commit_overrides_git(monkeypatch):
    # An exported tree run inside some other checkout must record the commit its launcher names.
    from cs336_systems import records

    monkeypatch.setenv("CS336_GIT_COMMIT", "abc123def456")
    assert records._git_commit() == "abc123def456"
    monkeypatch.delenv("CS336_GIT_COMMIT")
    assert records._git_commit() != "abc123def456"


def test_sharding_section_prefers_the_paired_run_over_a_later_scaling_run():
    from cs336_systems.report.sections.sharding import _latest_run

    def rec(date, variant, paired, world_size=2, precision="bf16"):
        r = {"precision": precision, "world_size": world_size, "variant": variant,
             "provenance": {"device": "NVIDIA H200", "date": date}}
        if paired:
            r["pair_ratio"] = 1.1
        return r

    paired = [rec("2026-11-22T09:41:11Z", v, v != "none") for v in ("none", "ddp", "fsdp")]
    scaling = [rec("2026-11-22T09:56:52Z", v, False) for v in ("none", "fsdp")]
    older_unpaired = [rec("2026-11-22T06:00:00Z", v, False, world_size=4) for v in ("none", "fsdp")]
    newer_unpaired = [rec("2026-11-22T09:54:27Z", v, False, world_size=4) for v in ("none", "fsdp")]
    rows = paired + scaling + older_unpaired + newer_unpaired
    assert _latest_run(rows, "bf16", 2) == paired
    assert _latest_run(rows, "bf16", 4) == newer_unpaired  # no paired run: the newest
    assert _latest_run(rows, "fp32", 2) == []
