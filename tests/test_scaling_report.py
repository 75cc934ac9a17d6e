"""The data_parallel_scaling report section, from synthetic ddp-bench / shard-bench records."""

from __future__ import annotations

import itertools

import pytest

from cs336_systems import records
from cs336_systems.report import SECTION_MODULES, ReportContext
from cs336_systems.report.sections import scaling

B, T = 4, 512  # batch per GPU, context


@pytest.fixture
def fake_provenance(monkeypatch):
    """Each write_records call gets its own date (a new run) and the device given in ``fake_provenance.device``."""
    clock = itertools.count()

    class Fake:
        device = "NVIDIA H200"

        def __call__(self, device=None):
            return {"device": self.device, "torch": "2.11", "date": f"2026-01-01T00:00:{next(clock):02d}Z",
                    "command": "cs336-systems fake", "git_commit": "abc123"}

    fake = Fake()
    monkeypatch.setattr(records, "provenance", fake)
    return fake


def _ddp(world, steps, peak=None):
    base = {"preset": "xl", "context_length": T, "batch_size": B, "precision": "bf16", "world_size": world}
    return [{**base, "status": "ok", "variant": label.split("-1")[0], "label": label, "step_ms": ms,
             "exposed_comm_ms": ms / 10, "peak_memory_gib": peak, "peak_memory_scope": "variant"}
            for label, ms in steps.items()]


def test_scaling_section_efficiency_latest_run_and_gaps(tmp_path, fake_provenance):
    res = tmp_path / "results"
    ddp, shard = scaling.DDP_PROBLEM, scaling.SHARD_PROBLEM
    # An older 2-GPU run that the newer one replaces (its bucketed efficiency would be 100/140 = 71.4%).
    records.write_records(ddp, _ddp(2, {"none": 100.0, "bucketed-100MB": 140.0, "torch-ddp": 140.0}), res)
    records.write_records(ddp, _ddp(2, {"none": 100.0, "bucketed-1MB": 300.0, "bucketed-100MB": 125.0,
                                        "torch-ddp": 110.0}, peak=50.0), res)
    records.write_records(ddp, _ddp(4, {"none": 100.0, "bucketed-100MB": 200.0, "torch-ddp": 160.0}), res)
    base = {"preset": "xl", "context_length": T, "batch_size": B, "precision": "bf16", "world_size": 4}
    mem = {"start_alloc_gib": 0.0, "pre_step_peak_net_gib": 30.0, "post_step_peak_net_gib": 35.0}
    records.write_records(shard, [{**base, **mem, "variant": "none", "status": "ok", "step_ms": 80.0},
                                  {**base, **mem, "variant": "zero1", "status": "ok", "step_ms": 100.0},
                                  {**base, "variant": "torch-zero", "status": "OOM"},
                                  {**base, **mem, "variant": "fsdp", "status": "ok", "step_ms": 120.0}], res)
    fake_provenance.device = "CPU (x86_64, 2 threads)"  # a CPU dry run at 8: ignored beside GPU records
    records.write_records(ddp, _ddp(8, {"none": 100.0, "bucketed-100MB": 101.0, "torch-ddp": 101.0}), res)

    text = scaling.build(ReportContext(res, tmp_path / "REPORT.md"))
    assert text.startswith("## data_parallel_scaling\n")
    ddp_table = text.split("**Bucketed DDP")[1].split("**Sharded optimizer")[0]
    # efficiency = step(none) / step(N) of the same run; tokens/s = N * B * T / step
    assert "80.0%" in ddp_table and "90.9%" in ddp_table  # 2 GPUs, the newer run
    assert "50.0%" in ddp_table and "62.5%" in ddp_table  # 4 GPUs
    assert f"{2 * B * T / 0.125:,.0f}" in ddp_table and f"{4 * B * T / 0.2:,.0f}" in ddp_table
    assert "71.4%" not in text and "99.0%" not in text  # the replaced run and the CPU run are not shown
    assert "| 50.0 " in ddp_table and "running maximum" not in ddp_table  # per-variant peak: no caveat
    zero_table = text.split("**Sharded optimizer")[1].split("**FSDP")[0]
    assert "80.0%" in zero_table and "OOM" in zero_table and "35.0" in zero_table
    fsdp_table = text.split("**FSDP")[1].split("At the largest")[0]
    assert "66.7%" in fsdp_table and "not run" in fsdp_table  # torch-fsdp2 has no record
    assert "`ddp-bench`: measured at 2, 4 GPUs; not yet measured at 8 GPUs" in text
    assert "`shard-bench`: measured at 4 GPUs; not yet measured at 2, 8 GPUs" in text
    png = tmp_path / "figures" / "scaling_xl_bf16_b4_c512.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and "figures/scaling_xl_bf16_b4_c512.png" in text
    assert "*Measured on NVIDIA H200" in text and "CPU" not in text.split("*Measured on")[1]


def test_scaling_section_without_records(tmp_path):
    assert scaling.build(ReportContext(tmp_path / "results", tmp_path / "REPORT.md")) is None
    assert ("scaling", scaling.PROBLEM_IDS) in SECTION_MODULES


def test_ddp_bench_accepts_no_timeline_variants():
    """scripts/device/scaling.sh passes ``--timeline-variants`` with no label: keep no timeline."""
    import argparse

    from cs336_systems.commands import ddp_bench

    p = argparse.ArgumentParser()
    ddp_bench.add_arguments(p)
    args = p.parse_args(["--timeline-variants", "--warmup", "2"])
    assert args.timeline_variants == [] and args.warmup == 2
    assert p.parse_args([]).timeline_variants == ["naive", "overlap"]
