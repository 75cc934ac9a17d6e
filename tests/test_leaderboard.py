"""The 2026 leaderboard step: the memory plan's arithmetic, its refusals, the CPU miniature of the
same code path (our kernels through the Triton interpreter) run end to end, and the data-parallel step
(gloo processes) against the one-process step on the same batch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from cs336_systems.cli import main
from cs336_systems.configs import count_parameters, get_preset
from cs336_systems.leaderboard import GIB, LeaderboardConfig, build_step, check_fits, plan_memory
from cs336_systems.parallel.process_group import spawn

H200_BYTES, H100_BYTES = 143_771 * 2**20, 81_559 * 2**20


def test_plan_counts_every_bf16_tensor_class():
    cfg = get_preset("8b")
    plan = plan_memory(cfg, device_bytes=H200_BYTES)
    n = count_parameters(cfg)
    assert plan.parameters == plan.gradients == 2 * n and plan.optimizer_state == 4 * n
    tokens = cfg.batch_size * cfg.context_length
    checkpointed = cfg.num_layers - plan.uncheckpointed_blocks
    assert plan.checkpointed_activations == checkpointed * tokens * cfg.d_model * 2
    # the full 34-layer step fits one H200 with at least the 5% margin the target asks, not an H100
    assert plan.total <= 0.95 * H200_BYTES
    check_fits(plan, 0.05)
    with pytest.raises(ValueError, match="reduce --layers"):
        check_fits(plan_memory(cfg, device_bytes=H100_BYTES), 0.05)


def test_plan_places_checkpoints_by_memory():
    cfg = get_preset("8b", num_layers=8, context_length=4096)
    roomy, tight = plan_memory(cfg, device_bytes=H200_BYTES), plan_memory(cfg, device_bytes=40 * GIB)
    assert roomy.uncheckpointed_blocks == 8 and roomy.checkpointed_activations == 0
    assert tight.uncheckpointed_blocks < roomy.uncheckpointed_blocks
    assert tight.uncheckpointed_blocks > 0 and tight.total <= 0.9 * 40 * GIB  # the default placement margin
    naive = plan_memory(get_preset("8b"), impl="naive", device_bytes=H200_BYTES)
    assert naive.total > H200_BYTES  # the handout's step cannot fit: its OOM is the expected result


def test_measured_block_is_within_the_estimate(seed):
    import torch

    from cs336_systems.leaderboard import block_saved_bytes_per_token, measure_block_saved_bytes

    cfg = get_preset("8b", d_model=64, d_ff=172, num_heads=4, context_length=48, batch_size=2)
    measured = measure_block_saved_bytes(cfg, torch.device("cpu"), "flash_torch")
    estimate = block_saved_bytes_per_token(cfg) * cfg.batch_size * cfg.context_length
    # The estimate counts the tensors the model's code saves; the measurement also sees kernel-specific ones
    # (flash_torch's tile statistics) and misses aliases: they agree within a factor below 1.5.
    assert estimate / 1.5 < measured < 1.5 * estimate, (measured, estimate)
    plan = plan_memory(cfg, device_bytes=H200_BYTES, block_saved_bytes=measured)
    assert plan.block_saved == measured and plan.block_saved_measured


@pytest.mark.parametrize("bad", [dict(layers=0), dict(context_length=-1), dict(impl="fast"), dict(rep_ms=float("nan")),
                                 dict(nproc=0), dict(nproc=2, impl="naive"), dict(parallel="fsdp"),
                                 dict(bucket_size_mb=0), dict(seed=-1)])
def test_bad_settings_are_value_errors(bad):
    with pytest.raises(ValueError, match="leaderboard"):
        LeaderboardConfig(**bad)


def test_batch_must_split_over_the_processes(capsys):
    with pytest.raises(ValueError, match="does not split evenly over 2 processes"):
        LeaderboardConfig(device="cpu", nproc=2, batch_size=3).model_config()
    assert main(["leaderboard", "--device", "cpu", "--nproc", "2", "--batch-size", "3", "--no-save"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size a multiple of --nproc" in err[0]


def test_data_parallel_plan_divides_batch_and_optimizer_state():
    two = LeaderboardConfig(device="cpu", nproc=2)
    assert two.rank_model_config().batch_size == two.model_config().batch_size // 2
    cfg = get_preset("8b")
    n = count_parameters(cfg)
    full = plan_memory(cfg, device_bytes=H200_BYTES)
    half = plan_memory(cfg.replace(batch_size=1), device_bytes=H200_BYTES, optimizer_shards=2, comm_bytes=GIB)
    assert half.optimizer_state == 2 * n and full.optimizer_state == 4 * n
    assert half.parameters == full.parameters and half.workspace == full.workspace + GIB
    # one sequence per GPU and half the AdamW state: more blocks keep their activations
    assert half.uncheckpointed_blocks > full.uncheckpointed_blocks


def _step_worker(info, nproc: int, parallel: str):
    """One leaderboard step (CPU miniature, SDPA attention, AdamW state rounded to nearest); returns the loss
    of this rank's slice, the synchronised gradients and the parameters after the step."""
    cfg = LeaderboardConfig(device="cpu", nproc=nproc, parallel=parallel, rounding="nearest", attention="sdpa")
    step = build_step(cfg, plan_memory(cfg.rank_model_config()), info.rank if info else 0)
    before = {k: v.detach().float().clone() for k, v in step.model.named_parameters()}
    step.zero_grad()
    loss = step.loss(step.forward())
    step.backward(loss)
    grads = {k: v.grad.float().clone() for k, v in step.model.named_parameters()}
    step.optimizer.step()
    after = {k: v.detach().float().clone() for k, v in step.model.named_parameters()}
    return float(loss.detach()), grads, {k: after[k] - before[k] for k in after}, after


@pytest.mark.parametrize("parallel", ["zero1", "bucketed"])
def test_data_parallel_step_matches_one_process(parallel):
    loss1, grads1, update1, _ = _step_worker(None, 1, parallel)  # no process group: the one-process step
    ranks = spawn(_step_worker, 2, (2, parallel), timeout_s=120)
    # each rank's loss is the mean cross-entropy of its sequence: their mean is the whole batch's
    assert sum(r[0] for r in ranks) / 2 == pytest.approx(loss1, rel=1e-5)
    for name, g1 in grads1.items():
        g = ranks[0][1][name]
        assert torch.equal(g, ranks[1][1][name]), name  # the same averaged gradient on every rank
        # the mean loss's gradient of the whole batch, up to bf16 rounding of the two partial sums and of
        # their all-reduce (a few 2^-8 relative roundings, not a factor of two)
        assert (g - g1).norm() <= 2**-6 * g1.norm() + 1e-30, name
    for name, u1 in update1.items():
        assert torch.equal(ranks[0][3][name], ranks[1][3][name]), name  # replicas stay identical
        # AdamW's first step moves each weight by about lr * sign(gradient) (then rounds to bf16): the same move
        # as one process wherever the gradient's sign is clear of the bf16 rounding above
        moved_apart = ((ranks[0][2][name] - u1).abs() > 1e-6).float().mean()
        assert moved_apart < 0.03, (name, float(moved_apart))


@pytest.mark.slow
def test_cpu_miniature_runs_ours_and_naive_with_the_same_logits(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cs336_systems", "leaderboard", "--device", "cpu", "--impl", "ours", "naive",
         "--check-logits", "--quality-check", "--results-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "memory plan" in proc.stdout and "blocks without checkpointing" in proc.stdout
    rows = [json.loads(line) for f in (tmp_path / "leaderboard_2026").glob("*.jsonl") for line in f.open()]
    assert {r["impl"] for r in rows} == {"ours", "naive"}
    for r in rows:
        assert r["status"] == "ok" and r["step_ms"] > 0 and r["layers"] == 3
        assert {"forward_ms", "loss_ms", "backward_ms", "optimizer_ms", "plan_total_gib"} <= set(r)
        # bf16 logits through a 3-layer model: a few bf16 ulps (2^-8) of relative error, not more
        assert r["logits_rel_error"] < 2e-2
    guard = [json.loads(line) for f in (tmp_path / "leaderboard_2026_quality").glob("*.jsonl") for line in f.open()]
    assert len(guard) == 1 and guard[0]["final_loss_bf16"] > 0


@pytest.mark.slow
def test_cpu_miniature_data_parallel_from_the_cli(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cs336_systems", "leaderboard", "--device", "cpu", "--nproc", "2", "--parallel",
         "bucketed", "--results-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("per process memory plan") == 2  # logged once (rank 0), estimated then measured
    rows = [json.loads(line) for f in (tmp_path / "leaderboard_2026").glob("*.jsonl") for line in f.open()]
    assert len(rows) == 1
    r = rows[0]
    assert r["status"] == "ok" and r["nproc"] == 2 and r["parallel"] == "bucketed" and r["batch_size"] == 2
    assert r["step_ms"] > 0 and r["optimizer_ms"] > 0


def _nccl_step_worker(info):
    cfg = LeaderboardConfig(nproc=info.world_size, layers=2, context_length=1024, rounding="nearest")
    step = build_step(cfg, plan_memory(cfg.rank_model_config()), info.rank)
    step.run()
    torch.cuda.synchronize()
    return {k: v.detach().float().cpu() for k, v in step.model.named_parameters()}


@pytest.mark.multigpu
def test_data_parallel_replicas_stay_identical_on_gpus():
    ranks = spawn(_nccl_step_worker, 2, backend="nccl", device_type="cuda", timeout_s=300, threads=None)
    for name, p in ranks[0].items():
        assert torch.isfinite(p).all() and torch.equal(p, ranks[1][name]), name
