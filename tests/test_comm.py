"""comm-bench on CPU with gloo (small sizes), its bandwidth arithmetic, and ddp-bench end to end on ``tiny``."""

from __future__ import annotations

import pytest

from cs336_systems.bench.comm import CommBenchConfig, run_comm_bench, summarize_ranks
from cs336_systems.bench.ddp import DDPBenchConfig, render_timeline, run_ddp_bench
from cs336_systems.cli import main
from cs336_systems.records import read_records


def test_summary_takes_slowest_rank_and_nccl_tests_bandwidths():
    cfg = CommBenchConfig(backend="gloo", world_size=4, sizes_mb=(2.0,), iters=3)
    per_rank = [{2.0: [0.010, 0.030, 0.020]}, {2.0: [0.020, 0.010, 0.020]}, {2.0: [0.001] * 3}, {2.0: [0.002] * 3}]
    (row,) = summarize_ranks(cfg, per_rank)
    # slowest rank per iteration: 20, 30, 20 ms -> median 20 ms
    assert row["latency_median_ms"] == pytest.approx(20.0)
    assert row["latency_mean_ms"] == pytest.approx(70 / 3)
    assert row["algbw_gbps"] == pytest.approx(2e6 / 0.020 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 3 / 4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_all_reduce_runs(world_size):
    rows = run_comm_bench(CommBenchConfig(backend="gloo", world_size=world_size, sizes_mb=(0.004, 0.4), warmup=1,
                                          iters=3, timeout_s=60))
    assert [r["size_mb"] for r in rows] == [0.004, 0.4]
    for r in rows:
        assert r["world_size"] == world_size and len(r["per_rank_median_ms"]) == world_size
        assert r["latency_median_ms"] > 0 and r["busbw_gbps"] > 0
        assert r["latency_min_ms"] <= r["latency_median_ms"]


def test_bad_configs():
    with pytest.raises(ValueError, match="unknown backend"):
        CommBenchConfig(backend="mpi")
    with pytest.raises(ValueError, match="world_size"):
        CommBenchConfig(world_size=1)
    with pytest.raises(ValueError, match="positive"):
        CommBenchConfig(sizes_mb=(0.0,))
    import torch

    if torch.cuda.device_count() < 64:
        with pytest.raises(ValueError, match="GPUs"):
            CommBenchConfig(backend="nccl", world_size=64)
    with pytest.raises(ValueError, match="unknown variant"):
        DDPBenchConfig(variants=("zero3",))
    with pytest.raises(ValueError, match="world_size"):
        DDPBenchConfig(world_size=1)


@pytest.mark.timeout(120)
def test_comm_bench_cli_writes_records(tmp_path):
    assert main(["comm-bench", "--backend", "gloo", "--world-sizes", "2", "--sizes-mb", "0.01", "--iters", "2",
                 "--warmup", "1", "--results-dir", str(tmp_path)]) == 0
    (rec,) = read_records("distributed_communication_single_node", tmp_path)
    assert rec["backend"] == "gloo" and rec["world_size"] == 2 and "torch" in rec["provenance"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ddp_bench_tiny_end_to_end(tmp_path):
    cfg = DDPBenchConfig(preset="tiny", context_length=32, batch_size=2, precisions=("fp32",),
                         bucket_sizes_mb=(0.1, 1000.0), warmup=1, steps=2, device="cpu",
                         timeline_variants=("naive", "overlap"), timeout_s=200)
    rows = run_ddp_bench(cfg)
    labels = [r["label"] for r in rows]
    assert labels == ["none", "naive", "flat", "overlap", "bucketed-0.1MB", "bucketed-1000MB", "torch-ddp"]
    by = {r["label"]: r for r in rows}
    assert by["none"]["comm_calls_per_step"] == 0
    assert by["naive"]["comm_calls_per_step"] == by["overlap"]["comm_calls_per_step"] == 21  # tiny: 21 tensors
    assert by["flat"]["comm_calls_per_step"] == by["bucketed-1000MB"]["comm_calls_per_step"] == 1
    assert 1 < by["bucketed-0.1MB"]["comm_calls_per_step"] < 21
    for r in rows:
        assert r["step_ms"] > 0 and r["nocomm_step_ms"] > 0 and r["status"] == "ok"
    assert "timeline" in by["naive"] and "timeline" in by["overlap"] and "timeline" not in by["flat"]
    assert render_timeline(rows, tmp_path / "t.png").stat().st_size > 0
