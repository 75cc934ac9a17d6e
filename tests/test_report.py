"""REPORT.md is rebuilt from records alone: run every command on tiny, then build the report; the
report refuses inputs that would make it smaller by accident and opens with its summary."""

from __future__ import annotations

import pytest

from cs336_systems.cli import main
from cs336_systems.records import RecordFileError, read_records, write_records
from cs336_systems.report import HANDOUT_PROBLEMS, build_report

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


def _one_record(results):
    row = {"kind": "accumulation", "loop": "fp32 += fp32", "accumulator": "fp32", "summand": "fp32",
           "result": 10.0001, "exact": 10.0, "abs_error": 1e-4, "summand_as_stored": 0.01}
    return write_records("mixed_precision_accumulation", [row], results, device="cpu")


@pytest.mark.parametrize("results", ["missing", "empty"])
def test_report_refuses_missing_or_empty_results_and_keeps_the_report(tmp_path, capsys, results):
    (tmp_path / "empty").mkdir()
    report = tmp_path / "REPORT.md"
    report.write_text("the previous report\n")
    assert main(["report", "--results-dir", str(tmp_path / results), "--output", str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "results directory" in err and str(tmp_path / results) in err
    assert report.read_text() == "the previous report\n"


def test_report_refuses_an_output_in_a_missing_folder_before_any_work(tmp_path, capsys, monkeypatch):
    res = tmp_path / "results"
    _one_record(res)
    monkeypatch.setattr("cs336_systems.report.SECTION_MODULES", [("no_such_section", ())])  # any work would fail
    assert main(["report", "--results-dir", str(res), "--output", str(tmp_path / "nope" / "REPORT.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not exist" in err and "nope" in err


def test_report_skips_a_bad_record_line_naming_file_and_line(tmp_path):
    res = tmp_path / "results"
    path = _one_record(res)
    with path.open("a") as f:
        f.write('{"kind": "accumulation", "loop": "cut off\n')
    with pytest.warns(UserWarning, match=rf"{path.name}:2: not JSON"):
        text = build_report(res, tmp_path / "REPORT.md").read_text()
    assert "## mixed_precision_accumulation\n" in text and "10.0001" in text
    with pytest.raises(RecordFileError, match=rf"{path.name}:2"):
        read_records("mixed_precision_accumulation", res, strict=True)


def test_report_opens_with_a_summary_linking_every_problem(tmp_path):
    res = tmp_path / "results"
    _one_record(res)
    text = build_report(res, tmp_path / "REPORT.md").read_text()
    summary = text.split("## Summary\n")[1].split("\n## ")[0]
    assert len(HANDOUT_PROBLEMS) == 26  # the 24 problems of the 2025 and 2026 handouts and both leaderboards
    for anchor, label in HANDOUT_PROBLEMS:
        target = anchor if f"## {anchor}\n" in text else "not-yet-measured"
        assert f"[{label}](#{target})" in summary, label
    assert "| [mixed_precision_accumulation](#mixed_precision_accumulation) | see the section |" in summary
    assert "| [benchmarking_script](#not-yet-measured) | not yet measured |" in summary
    assert "### Versus PyTorch" in summary
    assert "- `training_step`" in text.split("## Not yet measured")[1]


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
