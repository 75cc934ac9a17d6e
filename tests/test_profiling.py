"""profile / memory / precision / attention-bench: end to end on tiny, records well formed, numbers read
off tensors, OOM recorded."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

import cs336_systems.bench.attention as attn_bench
from cs336_basics.attention import register_attention_backend
from cs336_systems.bench.attention import (
    AttentionBenchConfig,
    memory_accounting,
    run_attention_benchmark,
    saved_bytes_model,
)
from cs336_systems.bench.memory import MemoryConfig, residual_stream_bytes, run_memory_profile
from cs336_systems.bench.precision import accumulation_loops, layernorm_range_check, observed_autocast_dtypes
from cs336_systems.bench.profile import ProfileConfig, attention_flops, run_profile
from cs336_systems.cli import main
from cs336_systems.profiling.kernels import is_gemm


def _rows(path):
    return [json.loads(x) for f in path.glob("*.jsonl") for x in f.read_text().splitlines()]


@pytest.mark.slow
def test_profile_end_to_end_on_tiny(tmp_path):
    assert main(["profile", "--preset", "tiny", "--context-length", "48", "--device", "cpu", "--warmup", "1",
                 "--steps", "2", "--trace-dir", str(tmp_path / "tr"), "--results-dir", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "nsys_profile")
    assert {r["scope"] for r in rows} == {"forward", "forward-backward", "train-step"}
    for r in rows:
        assert r["status"] == "ok" and 0 < r["gemm_share"] < 1
        assert r["kernels"] and all(k["pct"] > 0 for k in r["kernels"])
        assert (tmp_path / "tr" / r["trace"]).stat().st_size > 1000
        assert r["attention_ms_per_step"]["softmax"] > 0
    train = next(r for r in rows if r["scope"] == "train-step")
    assert train["unprofiled"]["optimizer"] > 0


def test_profile_attention_ranges_are_counted_once_per_layer_and_step():
    rec = run_profile(ProfileConfig(preset="tiny", context_length=40, scope="forward", warmup=0, steps=3,
                                    device="cpu"))
    assert rec["status"] == "ok"
    # sum of shares is 100% over all kernels; the kept rows are the largest
    assert sum(k["pct"] for k in rec["kernels"]) <= 100.0 + 1e-9
    assert rec["kernels"] == sorted(rec["kernels"], key=lambda k: -k["total_ms"])


def test_attention_flop_ratio_hand_count():
    f = attention_flops(batch=2, heads=3, seq=5, head_dim=7)
    assert f["scores"] == f["final_matmul"] == 2 * 2 * 3 * 5 * 5 * 7
    assert f["softmax"] == 5 * 2 * 3 * 5 * 5


def test_gemm_names():
    assert is_gemm("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32")
    assert is_gemm("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTN")
    assert is_gemm("aten::mm") and not is_gemm("aten::mul")
    assert not is_gemm("void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda>")


def test_memory_end_to_end_on_tiny(tmp_path):
    assert main(["memory", "--preset", "tiny", "--context-length", "32", "--device", "cpu", "--precision", "fp32",
                 "--snapshot-dir", str(tmp_path / "snap"), "--results-dir", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "memory_profiling")
    assert {r["mode"] for r in rows} == {"forward", "train-step"}
    for r in rows:
        assert r["status"] == "ok" and r["peak_memory_gib"] >= r["baseline_gib"] > 0
        assert (tmp_path / "snap" / r["timeline_png"]).read_bytes()[:4] == b"\x89PNG"
    train = next(r for r in rows if r["mode"] == "train-step")
    assert train["block_saved_for_backward_mib"] > train["residual_stream_mib_fp32"]


def test_residual_stream_size_hand_count():
    # 2.7B: d_model 2560, batch 4, T 512, fp32
    assert residual_stream_bytes("2.7B", 512) == 4 * 512 * 2560 * 4
    assert residual_stream_bytes("xl", 2048, bytes_per_element=2) == 4 * 2048 * 1600 * 2


def test_accumulation_loops_are_run():
    rows = {r["loop"]: r for r in accumulation_loops()}
    assert rows["fp32 += fp32"]["abs_error"] < 1e-3
    # fp16 accumulator: once s ~ 8, its spacing is 2^-7 ~ 0.0078, so +0.01 rounds badly
    assert rows["fp16 += fp16"]["abs_error"] > 1e-2
    # an fp32 accumulator only carries fp16's representation error of 0.01 (about 2e-6 per add)
    assert 1e-3 < rows["fp32 += fp16.to(fp32)"]["abs_error"] < 1e-2


def test_observed_autocast_dtypes_cpu_bf16():
    obs = observed_autocast_dtypes("bf16", torch.device("cpu"))
    assert obs["parameters (inside autocast)"] == "float32"
    assert obs["fc1 output"] == "bfloat16" and obs["gradients"] == "float32" and obs["loss"] == "float32"
    with pytest.raises(ValueError):
        observed_autocast_dtypes("fp8", torch.device("cpu"))


def test_layernorm_variance_overflows_in_fp16_only():
    rows = {r["dtype"]: r for r in layernorm_range_check(torch.device("cpu"))}
    assert not rows["fp16"]["finite"] and rows["bf16"]["finite"] and rows["fp32"]["rel_error"] < 1e-5
    assert rows["bf16"]["rel_error"] < 2**-7  # 8 significant bits


def test_precision_command_writes_records(tmp_path):
    assert main(["precision", "--device", "cpu", "--results-dir", str(tmp_path)]) == 0
    assert len(_rows(tmp_path / "mixed_precision_accumulation")) == 4
    kinds = {r["kind"] for r in _rows(tmp_path / "benchmarking_mixed_precision")}
    assert kinds == {"toy_dtypes", "layernorm_range"}


def test_saved_bytes_of_reference_attention_per_score():
    # causal reference attention saves three fp32 (T x T) tensors (masked scores, exp, probabilities)
    # and the boolean mask: 13 bytes per score element.
    model = saved_bytes_model("reference", causal=True)
    assert model["bytes_per_score"] == pytest.approx(13.0)
    acc = memory_accounting(AttentionBenchConfig(head_dim=16, seq_len=16384, device="cpu"), model)
    assert acc["one_score_matrix_gib"] == pytest.approx(8 * 16384**2 * 4 / 2**30)


def test_attention_bench_records_and_oom(tmp_path, monkeypatch):
    @register_attention_backend("_test_oom")
    def _oom(q, k, v, is_causal):
        if q.shape[-2] > 40:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return q

    monkeypatch.setattr(attn_bench, "_COMPILED", {})
    assert main(["attention-bench", "--backend", "reference", "_test_oom", "--compile", "no", "--head-dim", "16",
                 "--seq-len", "32", "64", "--reps", "2", "--warmup", "1", "--device", "cpu",
                 "--results-dir", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "pytorch_attention")
    status = {(r.get("backend"), r.get("seq_len")): r["status"] for r in rows if r.get("kind") != "memory_accounting"}
    assert status == {("reference", 32): "ok", ("reference", 64): "ok", ("_test_oom", 32): "ok",
                      ("_test_oom", 64): "OOM"}
    acc = next(r for r in rows if r.get("kind") == "memory_accounting")
    assert acc["seq_len"] == 64 and acc["status"] == "OOM"


@pytest.mark.gpu
def test_gpu_memory_snapshot(tmp_path):
    rec = run_memory_profile(MemoryConfig(preset="small", context_length=128, device="cuda",
                                          snapshot_dir=str(tmp_path)))
    assert rec["status"] == "ok" and rec["peak_memory_gib"] > rec["baseline_gib"] > 0
    snap = pickle.loads((tmp_path / rec["snapshot"]).read_bytes())
    assert snap["device_traces"][0]
    assert any("cs336" in a["where"] for a in rec["largest_allocations"])


@pytest.mark.gpu
def test_gpu_profile_has_device_kernels():
    rec = run_profile(ProfileConfig(preset="small", context_length=128, scope="forward", warmup=1, steps=2,
                                    device="cuda"))
    assert rec["on_gpu"] and rec["gemm_share"] > 0.2
    assert rec["attention_ms_per_step"]["softmax"] > 0 and rec["attention_ms_per_step"]["scores"] > 0


@pytest.mark.gpu
def test_gpu_attention_bench_compiled():
    cfg = AttentionBenchConfig(compile=True, head_dim=32, seq_len=512, reps=3, warmup=2, device="cuda")
    rec = run_attention_benchmark(cfg)
    assert rec["status"] == "ok" and rec["memory_before_backward_gib"] > 0
