"""Checkpoints of the training driver (DCP): exact resume, atomic saves, export, resharding across strategies and
world sizes, preemption by a real signal, metrics written as training runs. CPU, gloo, 2 ranks spawned."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import torch

from cs336_basics.model import BasicsTransformerLM
from cs336_systems import checkpoint
from cs336_systems.configs import get_preset
from cs336_systems.parallel.process_group import spawn
from cs336_systems.train import TrainConfig, train

SMALL = dict(preset="tiny", context_length=16, steps=4, lr=3e-3, min_lr=3e-4, seed=5)
QUIET = lambda s: None


def test_resume_logs_exactly_the_uninterrupted_losses(tmp_path):
    """fp32 on CPU, one process: a run resumed from its step-2 checkpoint redoes steps 2 and 3 with bit-identical
    losses and weights (model, AdamW moments and step count, schedule position and data position restored);
    it starts at step 2, not 0. The export loads into a fresh BasicsTransformerLM in this process."""
    full = train(TrainConfig(**SMALL, batch_size=2, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=2,
                             export=str(tmp_path / "final.pt")), log=QUIET)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "a")] == ["step-000002", "step-000004"]
    shutil.rmtree(tmp_path / "a" / "step-000004")  # as if the run had died after step 3
    lines = []
    resumed = train(TrainConfig(**SMALL, batch_size=2, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=2,
                                resume=True), log=lines.append)
    assert any("resuming from" in s and "step-000002" in s for s in lines)
    assert resumed["start_step"] == 2 and [r["step"] for r in resumed["rows"]] == [2, 3]
    assert [r["loss"] for r in resumed["rows"]] == [r["loss"] for r in full["rows"][2:]]
    for k, v in full["final_state"].items():
        assert torch.equal(resumed["final_state"][k], v), k
    # The metrics file holds each step once: the resumed run replaced the records of the steps it redid.
    steps = [json.loads(line)["step"] for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]
    kwargs = json.loads((tmp_path / "final.pt.json").read_text())
    model = BasicsTransformerLM(**kwargs)
    model.load_state_dict(torch.load(tmp_path / "final.pt"))
    for k, v in model.state_dict().items():
        assert torch.equal(v, full["final_state"][k]), k


def test_a_killed_save_is_never_resumed_from(tmp_path, monkeypatch):
    """A save that dies after writing part of its files leaves only a .tmp- directory: --resume takes the previous
    complete checkpoint, and the next save of that step replaces the leftover."""
    root = tmp_path / "run"
    train(TrainConfig(**{**SMALL, "steps": 2}, batch_size=2, checkpoint_dir=str(root)), log=QUIET)
    real_save = checkpoint.dcp.save

    def dies_midway(state, **kwargs):
        real_save(dict(list(state.items())[:3]), **kwargs)  # some files written
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.dcp, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**SMALL, batch_size=2, checkpoint_dir=str(root), resume=True), log=QUIET)
    monkeypatch.undo()
    assert (root / ".tmp-step-000004").is_dir() and not (root / "step-000004").exists()
    assert checkpoint.latest_checkpoint(root).name == "step-000002"
    (root / "step-000009").mkdir()  # a directory with the right name but no checkpoint in it is not complete
    assert checkpoint.latest_checkpoint(root).name == "step-000002"
    shutil.rmtree(root / "step-000009")
    out = train(TrainConfig(**SMALL, batch_size=2, checkpoint_dir=str(root), resume=True), log=QUIET)
    assert out["start_step"] == 2 and out["checkpoint"] == str(root / "step-000004")
    assert not (root / ".tmp-step-000004").exists()


def test_metrics_are_written_as_training_runs(tmp_path):
    """Each logged step is on disk (JSON lines, flushed) before the next step starts, with every field."""
    seen = []
    metrics = tmp_path / "m" / "log.jsonl"

    def log(line: str) -> None:
        if line.startswith("step "):
            seen.append(len(metrics.read_text().splitlines()))

    train(TrainConfig(**{**SMALL, "steps": 3}, batch_size=2, metrics=str(metrics)), log=log)
    assert seen == [1, 2, 3]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_memory_gib", "step_s"} <= set(rows[0])


def test_tensorboard_gets_the_same_scalars(tmp_path):
    pytest.importorskip("tensorboard")  # a dependency of the project (pyproject.toml)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = train(TrainConfig(**{**SMALL, "steps": 2}, batch_size=2, tensorboard=str(tmp_path / "tb")), log=QUIET)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
        assert [e.value for e in events.Scalars(f"train/{key}")] == pytest.approx([r[key] for r in out["rows"]])


# -- several ranks ---------------------------------------------------------------------------------------------

RESHARD = ("zero1", "torch-zero", "fsdp", "torch-fsdp2")


def _worker(info, root: str):
    out = {}

    def log(line: str) -> None:  # rank 0 only: a real SIGTERM to this process once step 1 is logged
        if line.startswith("step     1"):
            os.kill(os.getpid(), signal.SIGTERM)

    out["sig"] = train(TrainConfig(**SMALL, batch_size=2, parallel="fsdp", checkpoint_dir=f"{root}/sig"), info=info,
                       log=log)
    for p in RESHARD:  # each continues the one-process run's step-2 checkpoint (copied by the test)
        out[p] = train(TrainConfig(**SMALL, batch_size=2, parallel=p, checkpoint_dir=f"{root}/{p}", resume=True),
                       info=info, log=QUIET)
    return out


def _close(got: dict, want: dict) -> None:
    """fp32, the same global batch, only summation order differs (tests/test_train.py argues the tolerances)."""
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=3e-5, msg=k)


@pytest.mark.timeout(180)
def test_resume_under_another_strategy_and_world_size_and_preemption(tmp_path):
    """One process (batch 4) writes step 2; 2 ranks (batch 2 each: the same global batch) resume it under zero1,
    torch-zero, fsdp and torch-fsdp2 and log the losses and reach the weights of the uninterrupted run. The other
    way: 2 fsdp ranks stopped by a real SIGTERM (rank 0 only) both finish the step in flight, save step 3 together
    and return; one process resumes that and matches too. The checkpoints the ranks wrote hold the full AdamW state
    of the uninterrupted run."""
    ref = train(TrainConfig(**SMALL, batch_size=4, checkpoint_dir=str(tmp_path / "ref"), checkpoint_every=2),
                log=QUIET)
    for p in RESHARD:
        shutil.copytree(tmp_path / "ref" / "step-000002", tmp_path / p / "step-000002")
    r0, r1 = spawn(_worker, 2, (str(tmp_path),), timeout_s=150)

    assert r0["sig"]["stopped"] == "SIGTERM" and r1["sig"]["stopped"] == "a peer's signal"
    assert r0["sig"]["checkpoint"] == r1["sig"]["checkpoint"] == str(tmp_path / "sig" / "step-000003")
    assert [r["step"] for r in r0["sig"]["rows"]] == [0, 1, 2]
    after = train(TrainConfig(**SMALL, batch_size=4, checkpoint_dir=str(tmp_path / "sig"), resume=True), log=QUIET)
    assert after["start_step"] == 3
    for a, b in zip(r0["sig"]["rows"] + after["rows"], ref["rows"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    _close(after["final_state"], ref["final_state"])

    want = checkpoint.read_checkpoint(tmp_path / "ref" / "step-000004")
    for p in RESHARD:
        assert r0[p]["start_step"] == 2, p
        for a, b in zip(r0[p]["rows"], ref["rows"][2:], strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), p
        _close(r0[p]["final_state"], ref["final_state"])
        got = checkpoint.read_checkpoint(tmp_path / p / "step-000004")
        optim = {k: v for k, v in want.items() if k.startswith(("optim.", "model."))}
        assert set(optim) <= set(got), p
        _close({k: got[k] for k in optim}, optim)


@pytest.mark.timeout(120)
def test_torchrun_ranks_stop_and_save_together_on_sigterm(tmp_path):
    """The command as users run it: torchrun with 2 ranks; a SIGTERM to ONE worker (as a scheduler or a kill
    would send it) makes both finish the step in flight, write one checkpoint together and exit 0, so torchrun
    exits 0 too; the step log on disk ends at the checkpoint's step."""
    import subprocess
    import sys
    import time

    root = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "cs336_systems", "train",
           "--parallel", "zero1", "--steps", "100000", "--context-length", "16", "--batch-size", "2",
           "--checkpoint-dir", str(root)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        metrics = root / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else ""
            time.sleep(0.2)
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            workers = [int(pid) for pid in f.read().split()]
        assert len(workers) == 2
        os.kill(workers[1], signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    (saved,) = checkpoint.list_checkpoints(root)
    step = int(saved.name.removeprefix("step-"))
    assert "stopped by" in out and f"checkpoint {saved}" in out, out
    assert json.loads(metrics.read_text().splitlines()[-1])["step"] == step - 1


# -- activation checkpointing, fused loss and fused optimizer (issue 19) ---------------------------------------

@pytest.mark.parametrize(("precision", "residual"), [("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "bf16")])
def test_resume_is_exact_with_the_fused_loss_and_optimizer(tmp_path, precision, residual):
    """As the test above, with --loss fused and --optimizer fused (CPU: its foreach path). Under bf16 the Linear
    weights (and with --residual-dtype bf16 the token embedding) are bf16 copies of fp32 masters: the checkpoint
    stores the masters (fp32, the model's keys) and loading restores both, so the resumed run is still
    bit-identical."""
    cfg = dict(SMALL, batch_size=2, optimizer="fused", loss="fused", precision=precision, attention="reference",
               residual_dtype=residual)
    full = train(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=2), log=QUIET)
    shutil.rmtree(tmp_path / "a" / "step-000004")
    resumed = train(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "a"), resume=True), log=QUIET)
    assert [r["loss"] for r in resumed["rows"]] == [r["loss"] for r in full["rows"][2:]]
    for k, v in full["final_state"].items():
        assert v.dtype == torch.float32 and torch.equal(resumed["final_state"][k], v), k
    saved = checkpoint.read_checkpoint(tmp_path / "a" / "step-000002")
    model = {k: v for k, v in saved.items() if k.startswith("model.")}
    assert set(model) == {f"model.{k}" for k in full["final_state"]}
    assert set(full["final_state"]) == set(BasicsTransformerLM(**get_preset("tiny").model_kwargs()).state_dict())
    assert all(v.dtype == torch.float32 for v in model.values())
    if precision == "bf16":  # the masters carry bits a bf16 copy would have lost
        assert any(not torch.equal(v, v.bfloat16().float()) for k, v in model.items() if k.endswith("proj.weight")
                   or "linear" in k or "lm_head" in k)
        embedding = model["model.token_embeddings.weight"]
        assert not torch.equal(embedding, embedding.bfloat16().float())  # a master under either residual dtype


def test_checkpoints_keep_the_model_names_under_activation_checkpointing(tmp_path):
    """A checkpoint written with --activation-checkpointing selective holds the model's own keys and resumes
    without it; one written without resumes under nested, and one written by the fused bf16 optimizer resumes
    under our AdamW. fp32 losses within 1e-6 of the uninterrupted plain run (same ops, recomputed)."""
    ref = train(TrainConfig(**SMALL, batch_size=2), log=QUIET)
    plain_keys = None
    for first, then in ((dict(activation_checkpointing="selective"), {}),
                        ({}, dict(activation_checkpointing="nested")),
                        (dict(activation_checkpointing="2"), dict(activation_checkpointing="selective"))):
        root = tmp_path / f"{first}-{then}".replace(" ", "").replace("'", "")
        train(TrainConfig(**SMALL, batch_size=2, checkpoint_dir=str(root), checkpoint_every=2, **first), log=QUIET)
        shutil.rmtree(root / "step-000004")  # as if the run had died after step 3 (the schedule spans 4 steps)
        keys = set(checkpoint.read_checkpoint(root / "step-000002"))
        assert plain_keys is None or keys == plain_keys, first
        plain_keys = keys
        out = train(TrainConfig(**SMALL, batch_size=2, checkpoint_dir=str(root), resume=True, **then), log=QUIET)
        assert [r["loss"] for r in out["rows"]] == pytest.approx([r["loss"] for r in ref["rows"][2:]], abs=1e-6)
        _close(out["final_state"], ref["final_state"])
    assert all(not k.startswith("model.layers.0.blocks") for k in plain_keys)
    # fused bf16 optimizer's checkpoint -> our AdamW (and activation checkpointing): it loads and trains on
    root = tmp_path / "fused"
    train(TrainConfig(**{**SMALL, "steps": 2}, batch_size=2, precision="bf16", optimizer="fused",
                      checkpoint_dir=str(root)), log=QUIET)
    lines = []
    out = train(TrainConfig(**SMALL, batch_size=2, precision="bf16", optimizer="ours", activation_checkpointing="1",
                            checkpoint_dir=str(root), resume=True), log=lines.append)
    assert out["start_step"] == 2 and set(out["final_state"]) == set(ref["final_state"])
    assert any("changed since" in s and "optimizer fused -> ours; activation_checkpointing none -> 1" in s
               for s in lines), lines


def _ac_worker(info, root: str):
    return {p: train(TrainConfig(**SMALL, batch_size=2, parallel=p, activation_checkpointing=ac, loss=loss,
                                 checkpoint_dir=f"{root}/{p}", resume=True), info=info, log=QUIET)
            for p, ac, loss in (("torch-fsdp2", "selective", None), ("zero1", "nested", None),
                                ("bucketed", "1", "fused"))}


@pytest.mark.timeout(120)
def test_activation_checkpointing_under_parallel_strategies(tmp_path):
    """2 ranks resume the one-process plain run's step-2 checkpoint with activation checkpointing under
    torch-fsdp2, zero1 and bucketed (with the fused loss) and reach its weights (fp32, same global batch: the
    tolerances of _close). Our fsdp refuses activation checkpointing (tests/test_train.py)."""
    ref = train(TrainConfig(**SMALL, batch_size=4, checkpoint_dir=str(tmp_path / "ref"), checkpoint_every=2),
                log=QUIET)
    for p in ("torch-fsdp2", "zero1", "bucketed"):
        shutil.copytree(tmp_path / "ref" / "step-000002", tmp_path / p / "step-000002")
    r0, _ = spawn(_ac_worker, 2, (str(tmp_path),), timeout_s=100)
    for p, out in r0.items():
        assert out["start_step"] == 2, p
        for a, b in zip(out["rows"], ref["rows"][2:], strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), p
        _close(out["final_state"], ref["final_state"])
        assert set(checkpoint.read_checkpoint(tmp_path / p / "step-000004")) >= {
            k for k in checkpoint.read_checkpoint(tmp_path / "ref" / "step-000004") if not k.startswith("rng.")}, p
