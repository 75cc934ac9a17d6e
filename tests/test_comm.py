"""comm-bench on CPU with gloo (small sizes), its bandwidth arithmetic, and ddp-bench end to end on ``tiny``."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.bench.comm import CommBenchConfig, run_comm_bench, summarize_ranks
from cs336_systems.bench.ddp import DDPBenchConfig, run_ddp_bench
from cs336_systems.cli import main
from cs336_systems.records import read_records
from cs336_systems.report.plots import render_timeline


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
    with pytest.raises(ValueError, match="world-size"):
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
        # paired timing: one no-communication step per step, overhead from the pairs with its interval
        assert r["timing"] == "paired-aligned" and len(r["step_times_ms"]) == len(r["nocomm_times_ms"]) == 2
        pairs = sorted(s / n - 1 for s, n in zip(r["step_times_ms"], r["nocomm_times_ms"]))
        assert r["overhead"] == pytest.approx(sum(pairs) / 2)
        lo, hi = r["overhead_ci95"]
        assert pairs[0] - 1e-12 <= lo <= r["overhead"] <= hi <= pairs[1] + 1e-12
    assert "timeline" in by["naive"] and "timeline" in by["overlap"] and "timeline" not in by["flat"]
    assert render_timeline(rows, tmp_path / "t.png").stat().st_size > 0
    # The report section renders these records (tables, targets, overhead model, timeline) without a GPU.
    from cs336_systems.records import write_records
    from cs336_systems.report import ReportContext
    from cs336_systems.report.sections import ddp as section

    write_records("ddp_bucketed_benchmarking", rows, tmp_path / "results", device="cpu")
    text = section.build(ReportContext(tmp_path / "results", tmp_path / "REPORT.md"))
    for pid in section.PROBLEM_IDS[1:]:
        assert f"## {pid}\n" in text, pid
    assert "ddp_timeline_fp32.png" in text and (tmp_path / "figures" / "ddp_timeline_fp32.png").exists()


def test_median_ci95_brackets_the_median():
    from cs336_systems.bench.ddp import median_ci95

    rng = torch.Generator().manual_seed(3)
    x = (torch.randn(41, generator=rng) * 0.1 + 1.0).tolist()
    lo, hi = median_ci95(x)
    med = sorted(x)[20]
    assert lo < med < hi and hi - lo < 0.2  # ~ 2 * 1.96 * 1.25 * 0.1 / sqrt(41) ~= 0.08 wide
    assert median_ci95(x) == (lo, hi)  # seeded
    assert median_ci95([2.0]) == (2.0, 2.0)


def test_accounting_arithmetic():
    from cs336_systems.parallel import accounting as acc

    m = acc.FFNStack()
    assert m.params == 126 * 2 * 16384 * 53248
    assert m.fp32_state_bytes == 16 * m.params
    n = acc.min_fsdp_degree(m, 95e9, tokens=1000)
    assert acc.fsdp_bytes_per_device(m, n, 1000) <= 95e9 < acc.fsdp_bytes_per_device(m, n - 1, 1000)
    b = acc.fsdp_tp_min_batch_per_device(m, acc.Mesh())  # compute time equals communication time there
    mesh, d, f = acc.Mesh(), m.d_model, m.d_ff
    t_math = 4 * b * d * f / mesh.flops
    t_comm = 4 * d * f / (mesh.y * mesh.w_ici * mesh.m_x) + 4 * b * mesh.y * d / (mesh.w_ici * mesh.m_y)
    assert t_math == pytest.approx(t_comm, rel=1e-12)
    s, w, o = 8e9, 2e11, 3e-5
    n_opt, b_opt = acc.optimal_buckets(s, w, o)
    best = min(range(1, 2000), key=lambda k: acc.ddp_overhead_s(s, w, o, k))
    assert abs(best - n_opt) <= 1 and b_opt == pytest.approx(s / n_opt)
    o_fit, w_fit = acc.fit_latency_model([1e6, 1e7, 1e8], [o + x / w for x in (1e6, 1e7, 1e8)])
    assert o_fit == pytest.approx(o, rel=1e-6) and w_fit == pytest.approx(w, rel=1e-6)
