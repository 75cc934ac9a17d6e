"""The training driver: data-parallel and sharded runs equal one-process runs on the global batch;
global-norm clipping under sharding; token files; bad input. CPU, gloo, 2 ranks spawned on a free
port with a timeout."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import clip_gradient, cross_entropy
from cs336_systems import checkpoint
from cs336_systems.cli import main
from cs336_systems.configs import get_preset
from cs336_systems.parallel import get_strategy
from cs336_systems.parallel.clip import clip_grad_norm_global
from cs336_systems.parallel.process_group import spawn
from cs336_systems.train import TrainConfig, train

SMALL = dict(preset="tiny", context_length=16, steps=3, lr=3e-3, min_lr=3e-4, grad_accum=2, seed=7)


def ddp_train_worker(info, parallel: str):
    return train(TrainConfig(**SMALL, batch_size=2, parallel=parallel), info=info, log=lambda s: None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("parallel", ["bucketed", "torch-ddp"])
def test_two_ranks_match_one_process_on_the_global_batch(parallel):
    """2 ranks x batch 2 x 2 micro-batches (the first inside no_sync) == 1 process x batch 4 x 2 micro-batches,
    with AdamW, cosine lr and gradient clipping after the average. fp32: only summation order differs
    (see tests/test_ddp.py). AdamW's m / sqrt(v) amplifies that noise in the rare element whose moments nearly
    cancel (seen: 1 of 12k elements off by 7e-6), so: every element within lr / 100 = 3e-5, and all but
    0.1% within 1e-6; a real bug moves most elements by ~lr = 3e-3."""
    r0, r1 = spawn(ddp_train_worker, 2, (parallel,), timeout_s=90)
    ref = train(TrainConfig(**SMALL, batch_size=4, parallel="none"), log=lambda s: None)
    for k, v in ref["final_state"].items():
        assert torch.equal(r0["final_state"][k], r1["final_state"][k]), k
        torch.testing.assert_close(r0["final_state"][k], v, rtol=1e-5, atol=3e-5)
        assert ((r0["final_state"][k] - v).abs() > 1e-6).float().mean() < 1e-3, k
    for a, b in zip(r0["rows"], ref["rows"]):  # logged loss is the mean over ranks = the global-batch loss
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def comm_dtype_train_worker(info):
    return {dt: train(TrainConfig(**SMALL, batch_size=2, parallel="bucketed", grad_comm_dtype=dt), info=info,
                      log=lambda s: None) for dt in (None, "bf16")}


@pytest.mark.timeout(120)
def test_grad_comm_dtype_reaches_the_wrapper():
    """--grad-comm-dtype bf16: the ranks stay identical and differ from the fp32-communication run (bf16 was
    on the wire), but only slightly: each averaged gradient is rounded to 8 significant bits, and AdamW's
    update (~lr per element, invariant to the gradient's scale) moves by about that relative amount, so almost
    every element is within lr / 16 of the fp32 run, and the mean move is far below lr (seen: 0.07% beyond
    lr / 16, mean lr / 700; a gradient that lost its sign would move most elements by ~lr)."""
    r0, r1 = spawn(comm_dtype_train_worker, 2, timeout_s=90)
    moved = []
    for k, v in r0[None]["final_state"].items():
        assert torch.equal(r0["bf16"]["final_state"][k], r1["bf16"]["final_state"][k]), k
        moved.append((r0["bf16"]["final_state"][k] - v).abs().flatten())
    moved = torch.cat(moved)
    lr = SMALL["lr"]
    assert moved.max() > 0 and (moved > lr / 16).float().mean() < 1e-2 and moved.mean() < lr / 100, moved.mean()


SHARDING = ("zero1", "torch-zero", "fsdp", "torch-fsdp2")
CLIP_BATCH, CLIP_MAX = 4, 0.25  # the init gradient norm of `tiny` is ~1.2: clipping is active


def _clip_case(info, parallel: str) -> dict:
    """Gradients of the global batch, each rank backpropagating its half through the wrapped model: the
    norm clip_gradients() reports, the norm after clipping, the norm this rank would see alone."""
    model_cfg = get_preset("tiny").replace(context_length=16)
    tokens = torch.randint(0, model_cfg.vocab_size, (CLIP_BATCH, 17), generator=torch.Generator().manual_seed(11))
    mine = tokens[info.rank * CLIP_BATCH // 2:(info.rank + 1) * CLIP_BATCH // 2]
    torch.manual_seed(3)
    strategy = get_strategy(parallel)
    wrapped = strategy.wrap(BasicsTransformerLM(**model_cfg.model_kwargs()))
    cross_entropy(wrapped(mine[:, :-1]), mine[:, 1:]).backward()
    wrapped.finish_gradient_synchronization()
    params = list(wrapped.module.parameters())
    local = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(
        p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad) for p in params]))
    out = {"local": local.item()}
    if parallel == "torch-fsdp2":  # torch's own clip on DTensor gradients, as a second opinion
        out["torch"] = torch.nn.utils.clip_grad_norm_(params, float("inf")).full_tensor().item()
    out["norm"] = strategy.clip_gradients(wrapped, CLIP_MAX).item()
    sharded = wrapped.sharded_parameters() if strategy.shards_gradients else ()
    out["after"] = clip_grad_norm_global(params, float("inf"), sharded=sharded).item()
    wrapped.close()
    return out


def sharded_train_worker(info):
    out = {p: train(TrainConfig(**SMALL, batch_size=2, parallel=p), info=info, log=lambda s: None)
           for p in SHARDING}
    for p in ("fsdp", "torch-fsdp2"):
        out[f"{p}-bf16"] = train(TrainConfig(**{**SMALL, "steps": 2}, batch_size=2, parallel=p, precision="bf16"),
                                 info=info, log=lambda s: None)
    out["clip"] = {p: _clip_case(info, p) for p in SHARDING}
    return out


@pytest.mark.timeout(180)
def test_sharded_strategies_match_one_process_on_the_global_batch():
    """zero1, torch-zero, fsdp and torch-fsdp2 on 2 ranks x batch 2 train the weights of 1 process x batch 4
    (same argument and tolerances as the DDP test above: fp32, only summation order differs; ZeRO adds only
    broadcasts, FSDP reduce-scatters instead of all-reducing and gathers exact fp32 weights). One spawn for
    every case to keep the test short.

    Clipping: AdamW is nearly invariant to a gradient scale, so the curves alone would not catch a wrong
    norm; the clip case checks the number itself. The norm over ranks must equal the single-process norm
    of the global batch to fp32 summation noise (~1e-6 relative over 172k elements: rtol 1e-5), the norm after
    clipping must be CLIP_MAX. Under fsdp / torch-fsdp2 the norm of one rank's shard gradients differs by > 10%
    (so a per-rank clip would be caught); under zero1 / torch-zero the averaged gradients are replicated and
    the per-rank norm already is the global one.

    bf16 (fsdp, torch-fsdp2): weights gathered in bf16 keep the residual stream in bf16, which autocast alone
    does not; the logged global-batch loss must stay within 2e-3 relative (bf16's unit roundoff 2^-9)
    of the one-process bf16 run."""
    r0, r1 = spawn(sharded_train_worker, 2, timeout_s=150)
    ref = train(TrainConfig(**SMALL, batch_size=4, parallel="none"), log=lambda s: None)
    for p in SHARDING:
        for k, v in ref["final_state"].items():
            assert torch.equal(r0[p]["final_state"][k], r1[p]["final_state"][k]), (p, k)
            torch.testing.assert_close(r0[p]["final_state"][k], v, rtol=1e-5, atol=3e-5, msg=f"{p} {k}")
            assert ((r0[p]["final_state"][k] - v).abs() > 1e-6).float().mean() < 1e-3, (p, k)
        for a, b in zip(r0[p]["rows"], ref["rows"], strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), p
    ref_bf16 = train(TrainConfig(**{**SMALL, "steps": 2}, batch_size=4, precision="bf16"), log=lambda s: None)
    for p in ("fsdp", "torch-fsdp2"):
        for a, b in zip(r0[f"{p}-bf16"]["rows"], ref_bf16["rows"], strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=2e-3), p

    model_cfg = get_preset("tiny").replace(context_length=16)
    tokens = torch.randint(0, model_cfg.vocab_size, (CLIP_BATCH, 17), generator=torch.Generator().manual_seed(11))
    torch.manual_seed(3)
    model = BasicsTransformerLM(**model_cfg.model_kwargs())
    cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    want = clip_gradient(model.parameters(), float("inf")).item()
    assert want > 2 * CLIP_MAX
    for p in SHARDING:
        for r in (r0, r1):
            got = r["clip"][p]
            assert got["norm"] == pytest.approx(want, rel=1e-5), p
            assert got["after"] == pytest.approx(CLIP_MAX, rel=1e-5), p
            if get_strategy(p).shards_gradients:
                assert abs(got["local"] / want - 1) > 0.1, p  # a rank's shard alone: the wrong norm
            else:
                assert got["local"] == pytest.approx(want, rel=1e-5), p  # averaged and replicated: plain norm is right
            if "torch" in got:
                assert got["torch"] == pytest.approx(want, rel=1e-5), p


def test_bad_sharding_combinations():
    with pytest.raises(ValueError, match="torchrun"):
        train(TrainConfig(parallel="fsdp", steps=1))
    with pytest.raises(ValueError, match="--bucket-size-mb has no effect with --parallel fsdp"):
        TrainConfig(parallel="fsdp", bucket_size_mb=10)
    with pytest.raises(ValueError, match="--bucket-size-mb has no effect with --parallel torch-fsdp2"):
        TrainConfig(parallel="torch-fsdp2", bucket_size_mb=10)
    with pytest.raises(ValueError, match="bucket_size_mb must be > 0"):
        TrainConfig(parallel="zero1", bucket_size_mb=0)
    with pytest.raises(ValueError, match="unknown --parallel 'zero3'"):
        TrainConfig(parallel="zero3")
    with pytest.raises(ValueError, match="--grad-comm-dtype has no effect with --parallel fsdp"):
        TrainConfig(parallel="fsdp", grad_comm_dtype="bf16")
    with pytest.raises(ValueError, match="grad_comm_dtype must be one of bf16, fp16"):
        TrainConfig(parallel="bucketed", grad_comm_dtype="int8")
    assert main(["train", "--parallel", "torch-zero", "--steps", "1"]) == 2  # needs torchrun: a clear error


@pytest.mark.timeout(120)
def test_learns_from_a_token_file(tmp_path):
    path = tmp_path / "tokens.bin"
    rng = np.random.default_rng(0)
    pattern = rng.integers(0, 512, size=23)  # a periodic stream: predictable after one period
    np.tile(pattern, 400).astype(np.uint16).tofile(path)
    summary = train(TrainConfig(preset="tiny", context_length=32, batch_size=8, steps=40, lr=1e-2, min_lr=1e-3,
                                warmup_steps=2, data=str(path)), log=lambda s: None)
    losses = [r["loss"] for r in summary["rows"]]
    assert losses[0] > 5.5  # ~ln(512) at init
    assert min(losses[-5:]) < 0.6 * losses[0]
    assert all(r["tokens_per_s"] > 0 and r["mfu"] > 0 for r in summary["rows"])


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="torchrun"):
        train(TrainConfig(parallel="naive", steps=1))
    with pytest.raises(ValueError, match="unknown --parallel"):
        TrainConfig(parallel="zero7")
    with pytest.raises(ValueError, match="--seed must be >= 0, got -1"):  # before a run folder is made
        TrainConfig(seed=-1)
    with pytest.raises(ValueError, match="no such file"):
        train(TrainConfig(data=str(tmp_path / "nope.bin")))
    bad = tmp_path / "bad.bin"
    np.full(1000, 60000, dtype=np.uint16).tofile(bad)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        train(TrainConfig(data=str(bad), context_length=8, steps=1))


def test_cli_one_process(capsys, tmp_path, monkeypatch):
    """Without --checkpoint-dir the final weights still land on disk: runs/train-<start time>/step-NNNNNN."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--steps", "2", "--context-length", "16", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "step     1" in out and "tok/s" in out and "MFU" in out
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("train-") and (run / "step-000002" / ".metadata").is_file()
    assert f"final weights: runs/{run.name}/step-000002" in out and (run / "metrics.jsonl").is_file()
    assert main(["train", "--parallel", "flat", "--steps", "1"]) == 2  # needs torchrun: a clear error


def _refused(capsys, *argv: str) -> str:
    """The CLI's answer to bad settings: exit code 2 and one line on stderr naming the setting, no traceback."""
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_settings_are_checked_before_any_work(capsys, tmp_path, monkeypatch):
    for argv, needle in ((["--lr", "nan"], "--lr must be a finite number > 0"), (["--lr", "0"], "--lr must be"),
                         (["--lr", "inf"], "--lr must be"), (["--min-lr", "1", "--lr", "1e-4"], "--min-lr must be"),
                         (["--min-lr", "-1"], "--min-lr must be"), (["--warmup-steps", "30"], "--warmup-steps"),
                         (["--weight-decay", "nan"], "--weight-decay"), (["--grad-clip", "nan"], "--grad-clip"),
                         (["--checkpoint-every", "0"], "--checkpoint-every must be >= 1"),
                         (["--checkpoint-every", "-3"], "--checkpoint-every must be >= 1"),
                         (["--resume"], "--resume needs --checkpoint-dir"),
                         (["--device", "tpu"], "is not a device name")):
        assert needle in _refused(capsys, *argv), argv
    # Devices that are not there (a GPU machine is made to look like a CPU-only / one-GPU one).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "--device 'cuda': this machine has no CUDA GPU; allowed here: cpu" in _refused(capsys, "--device", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "has 1 CUDA GPU(s); allowed here: cpu, cuda, cuda:0" in _refused(capsys, "--device", "cuda:7")
    monkeypatch.undo()
    # Token files: each refusal names the file.
    files = {"missing": None, "dir": "dir", "empty": b"", "odd": b"\x01\x00\x02", "short": np.zeros(8, np.uint16),
             "bad-id": np.r_[np.zeros(5000, np.uint16), [512]].astype(np.uint16)}
    expect = {"missing": "no such file", "dir": "is a directory", "empty": "is empty",
              "odd": "not a whole number of uint16 tokens", "short": "fewer than --context-length + 1",
              "bad-id": "holds token id 512 (first bad id at token 5000), outside the vocabulary"}
    for name, content in files.items():
        path = tmp_path / name
        if isinstance(content, str):
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            content.tofile(path)
        err = _refused(capsys, "--data", str(path), "--context-length", "16", "--checkpoint-dir", str(tmp_path / "c"))
        assert expect[name] in err and str(path) in err, (name, err)
    # Activations that cannot fit: refused at once, before anything is allocated.
    assert "needs at least" in _refused(capsys, "--context-length", "100000")
    # Outputs that cannot be written: a folder under a file, a file where a folder must be.
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for flag in ("--checkpoint-dir", "--tensorboard", "--export", "--metrics"):
        assert "cannot be created" in _refused(capsys, flag, str(blocker / "sub" / "x")), flag
    assert "is a file" in _refused(capsys, "--checkpoint-dir", str(blocker))
    assert "is a directory" in _refused(capsys, "--metrics", str(tmp_path))
    assert "--results-dir" in _refused(capsys, "--save", "--results-dir", str(blocker / "r"))
    # World size from torchrun's environment.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert "world size must be >= 1" in _refused(capsys, "--parallel", "bucketed")
    monkeypatch.undo()
    # A directory that already holds a run is continued (--resume) or left alone, never overwritten.
    assert main(["train", "--steps", "1", "--context-length", "16", "--batch-size", "2",
                 "--checkpoint-dir", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert "already holds step-000001; add --resume" in _refused(capsys, "--steps", "1",
                                                                  "--checkpoint-dir", str(tmp_path / "run"))


# -- activation checkpointing and fast settings (issue 19) -------------------------------------------------------

def test_activation_checkpointing_option_is_validated(capsys):
    assert TrainConfig(activation_checkpointing="Selective").activation_checkpointing == "selective"
    assert TrainConfig(activation_checkpointing="2").activation_checkpointing == "2"  # tiny has 2 blocks
    for bad, needle in (("sometimes", "choose none, selective, nested or a positive integer"),
                        ("-1", "choose none, selective, nested"), ("3", "exceeds the tiny preset's 2 blocks")):
        with pytest.raises(ValueError, match="--activation-checkpointing"):
            TrainConfig(activation_checkpointing=bad)
        assert needle in _refused(capsys, "--activation-checkpointing", bad)
    assert "--attention: unknown attention backend 'nope'" in _refused(capsys, "--attention", "nope")
    with pytest.raises(ValueError, match="--activation-checkpointing selective does not work with --parallel fsdp"):
        TrainConfig(parallel="fsdp", activation_checkpointing="selective")
    for name, bad in (("optimizer", "adam"), ("loss", "chunked"), ("compile_scope", "layers")):
        with pytest.raises(ValueError, match=f"unknown --{name.replace('_', '-')} '{bad}'; choose from"):
            TrainConfig(**{name: bad})


def test_memory_bound_counts_what_activation_checkpointing_and_the_fused_loss_save():
    from cs336_systems.train import memory_lower_bound

    model_cfg = get_preset("small")
    bound = lambda **kw: memory_lower_bound(TrainConfig(preset="small", **kw), model_cfg, 2048, 4, 1)
    assert bound(activation_checkpointing="1") < bound(activation_checkpointing="selective") == bound()
    assert bound(loss="fused") == bound() - 4 * 4 * 2048 * model_cfg.vocab_size


def test_activation_checkpointing_changes_no_loss():
    """fp32 on CPU: recomputation repeats the same ops on the same inputs, so every policy logs the losses and
    reaches the weights of the run without it (1e-6: the ops are the same; only a changed kernel order could
    move a last bit), under the model's own state-dict names."""
    cfg = dict(SMALL, batch_size=2, steps=2, grad_accum=1)
    plain = train(TrainConfig(**cfg), log=lambda s: None)
    for spec in ("selective", "nested", "1"):
        ac = train(TrainConfig(**cfg, activation_checkpointing=spec), log=lambda s: None)
        assert [r["loss"] for r in ac["rows"]] == pytest.approx([r["loss"] for r in plain["rows"]], abs=1e-6), spec
        assert list(ac["final_state"]) == list(plain["final_state"]), spec
        for k, v in plain["final_state"].items():
            torch.testing.assert_close(ac["final_state"][k], v, rtol=0, atol=1e-6, msg=f"{spec} {k}")


def test_fast_settings_are_printed_and_not_applied_on_cpu():
    lines = []
    out = train(TrainConfig(**dict(SMALL, steps=1, grad_accum=1), batch_size=2, device="cpu"), log=lines.append)
    (line,) = [s for s in lines if "fast settings" in s]
    assert line == ("train: fast settings for cpu: attention=reference, compile=False, compile_scope=model, "
                    "optimizer=ours, loss=unfused, cuda_graph=False, residual_dtype=fp32, rope=torch, ffn=torch, "
                    "cublas_workspace=default")
    assert {k: out["config"][k] for k in ("attention", "compile", "optimizer", "loss")} == dict(
        attention="reference", compile=False, optimizer="ours", loss="unfused")


def test_explicit_flags_beat_fast_settings(monkeypatch):
    """fast_settings made to answer as on CUDA: whatever is given is kept, the rest is picked, and a pick the
    strategy cannot use falls back to the reference setting and says so. The fused picks then train on the CPU."""
    from cs336_systems import train as train_mod
    from cs336_systems.fast import FastSettings

    cuda_like = FastSettings(attention="sdpa", compile=True, compile_scope="model", optimizer="fused", loss="fused",
                             cuda_graph=False, residual_dtype="bf16", rope="triton", ffn="torch",
                             cublas_workspace="default")
    monkeypatch.setattr(train_mod, "fast_settings", lambda device, vocab_size, *shape: cuda_like)
    cpu = torch.device("cpu")
    cfg, line = train_mod.resolve_settings(TrainConfig(attention="reference", compile=False), cpu)
    assert (cfg.attention, cfg.compile, cfg.compile_scope, cfg.optimizer, cfg.loss) == (
        "reference", False, "model", "fused", "fused")
    assert line == ("train: fast settings for cpu: compile_scope=model, optimizer=fused, loss=fused, cuda_graph=False, "
                    "residual_dtype=fp32, rope=torch, ffn=torch, "
                    "cublas_workspace=default")  # fp32 training: autocast's residual stream does not apply;
    # RoPE's Triton kernel needs CUDA
    cfg, line = train_mod.resolve_settings(TrainConfig(parallel="fsdp"), cpu)
    assert (cfg.attention, cfg.compile, cfg.optimizer, cfg.loss) == ("sdpa", False, "ours", "unfused")
    assert "optimizer=fused not with --parallel fsdp" in line and "compile=True not with --parallel fsdp" in line
    with pytest.raises(ValueError, match="--optimizer fused works with --parallel none only"):
        TrainConfig(parallel="bucketed", optimizer="fused")
    with pytest.raises(ValueError, match="--loss fused does not work with --parallel torch-fsdp2"):
        TrainConfig(parallel="torch-fsdp2", loss="fused")
    lines = []
    out = train(TrainConfig(**dict(SMALL, steps=2, grad_accum=1), batch_size=2, compile=False), log=lines.append)
    assert out["config"]["optimizer"] == "fused" and out["config"]["loss"] == "fused"
    assert any(s.startswith("train: fast settings for cpu: attention=sdpa,") for s in lines)
    assert [r["step"] for r in out["rows"]] == [0, 1]


def test_cuda_graph_applies_only_where_it_can(monkeypatch):
    """The fast default's CUDA graph gives way to an optimizer or strategy it cannot capture (and says so); an
    explicit --cuda-graph yes there, or on a CPU, is an error naming the conflict."""
    from cs336_systems import train as train_mod
    from cs336_systems.fast import FastSettings

    cuda_like = FastSettings(attention="sdpa", compile=False, compile_scope="model", optimizer="fused",
                             loss="unfused", cuda_graph=True, residual_dtype="bf16", rope="triton", ffn="torch",
                             cublas_workspace="default")
    monkeypatch.setattr(train_mod, "fast_settings", lambda device, vocab_size, *shape: cuda_like)
    cuda = torch.device("cuda")
    cfg, line = train_mod.resolve_settings(TrainConfig(optimizer="ours"), cuda)
    assert cfg.cuda_graph is False and "cuda_graph=True not with optimizer=ours" in line
    cfg, line = train_mod.resolve_settings(TrainConfig(parallel="bucketed"), cuda)
    assert cfg.cuda_graph is False and "cuda_graph=True not with --parallel bucketed" in line
    assert train_mod.resolve_settings(TrainConfig(), cuda)[0].cuda_graph is True
    with pytest.raises(ValueError, match="--cuda-graph yes needs --optimizer fused"):
        TrainConfig(cuda_graph=True, optimizer="ours")
    with pytest.raises(ValueError, match="--cuda-graph yes works with --parallel none only"):
        TrainConfig(cuda_graph=True, parallel="bucketed")
    with pytest.raises(ValueError, match="--cuda-graph yes needs a CUDA device"):
        train(TrainConfig(**dict(SMALL, steps=1), cuda_graph=True, device="cpu"), log=lambda s: None)


def test_residual_dtype_applies_only_where_it_can(monkeypatch):
    """The fast default's bf16 residual stream needs bf16 and the fused optimizer (else fp32, autocast's); an
    explicit one without them is an error naming what it needs. With it, the token embedding trains as a bf16
    copy, and the checkpointed weights stay fp32 masters."""
    from cs336_systems import train as train_mod
    from cs336_systems.fast import FastSettings

    cuda_like = FastSettings(attention="sdpa", compile=False, compile_scope="model", optimizer="fused",
                             loss="unfused", cuda_graph=False, residual_dtype="bf16", rope="triton", ffn="torch",
                             cublas_workspace="default")
    monkeypatch.setattr(train_mod, "fast_settings", lambda device, vocab_size, *shape: cuda_like)
    cpu = torch.device("cpu")
    resolve = train_mod.resolve_settings
    assert resolve(TrainConfig(precision="bf16"), cpu)[0].residual_dtype == "bf16"
    assert resolve(TrainConfig(), cpu)[0].residual_dtype == "fp32"
    assert resolve(TrainConfig(precision="bf16", optimizer="ours"), cpu)[0].residual_dtype == "fp32"
    assert resolve(TrainConfig(precision="bf16", parallel="bucketed"), cpu)[0].residual_dtype == "fp32"
    with pytest.raises(ValueError, match=r"--residual-dtype bf16 keeps the token embedding .* needs --precision bf16"):
        TrainConfig(residual_dtype="bf16")
    with pytest.raises(ValueError, match="--residual-dtype bf16 works with --parallel none only"):
        TrainConfig(residual_dtype="bf16", precision="bf16", parallel="bucketed")
    with pytest.raises(ValueError, match="unknown --residual-dtype 'fp16'; choose from fp32, bf16"):
        TrainConfig(residual_dtype="fp16")
    with pytest.raises(ValueError, match="unknown --rope 'cuda'; choose from torch, triton"):
        TrainConfig(rope="cuda")
    assert resolve(TrainConfig(), cpu)[0].rope == "torch"  # the fast pick is CUDA's kernel
    with pytest.raises(ValueError, match="--rope triton needs a CUDA device, got cpu; use --rope torch"):
        resolve(TrainConfig(rope="triton"), cpu)
    out = train(TrainConfig(**dict(SMALL, steps=2), batch_size=2, precision="bf16", optimizer="fused",
                            residual_dtype="bf16"), log=lambda s: None)
    assert out["config"]["residual_dtype"] == "bf16"
    assert out["final_state"]["token_embeddings.weight"].dtype == torch.float32  # the master, not the bf16 copy


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_gpu_cuda_graph_train_tracks_eager_and_resumes(tmp_path):
    """The captured step (fp32, the fused optimizer, gradient accumulation, clipping and a learning rate that
    changes every step) gives the eager step's losses; stopped after step 3 and resumed, it tracks them on."""
    cfg = dict(SMALL, batch_size=2, grad_accum=2, steps=6, warmup_steps=2, precision="fp32", device="cuda",
               compile=False, attention="sdpa", optimizer="fused")
    eager = train(TrainConfig(**cfg, cuda_graph=False), log=lambda s: None)
    graphed = train(TrainConfig(**cfg, cuda_graph=True, checkpoint_dir=str(tmp_path), checkpoint_every=3),
                    log=lambda s: None)
    losses = [r["loss"] for r in graphed["rows"]]
    assert losses == pytest.approx([r["loss"] for r in eager["rows"]], rel=1e-5)
    for name, weight in eager["final_state"].items():  # the replays applied the same updates
        torch.testing.assert_close(graphed["final_state"][name], weight, rtol=1e-4, atol=1e-6)
    shutil.rmtree(tmp_path / "step-000006")
    resumed = train(TrainConfig(**cfg, cuda_graph=True, checkpoint_dir=str(tmp_path), resume=True),
                    log=lambda s: None)
    assert [r["loss"] for r in resumed["rows"]] == pytest.approx(losses[3:], rel=1e-5)


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_fast_settings_on_cuda_train_and_resume(tmp_path):
    """On a GPU with nothing given: flash_auto, whole-model compile, the fused optimizer (bf16 copies of fp32 masters
    under bf16) are picked and printed; a run stopped after step 2 and resumed tracks the uninterrupted one
    (bf16, compiled kernels and atomics in backward: 1e-2 relative on the loss, not bit-exact), and its
    checkpoint holds fp32 weights under the model's own keys."""
    cfg = dict(SMALL, batch_size=2, grad_accum=1, steps=4, precision="bf16", device="cuda")
    lines = []
    full = train(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=2), log=lines.append)
    assert any(s.startswith("train: fast settings for cuda: attention=flash_auto, compile=True") for s in lines), lines
    assert (full["config"]["optimizer"], full["config"]["compile"], full["config"]["residual_dtype"]) == (
        "fused", True, "bf16")
    shutil.rmtree(tmp_path / "a" / "step-000004")
    resumed = train(TrainConfig(**cfg, checkpoint_dir=str(tmp_path / "a"), resume=True), log=lambda s: None)
    assert [r["loss"] for r in resumed["rows"]] == pytest.approx([r["loss"] for r in full["rows"][2:]], rel=1e-2)
    saved = checkpoint.read_checkpoint(tmp_path / "a" / "step-000002")
    assert {k.removeprefix("model.") for k in saved if k.startswith("model.")} == set(full["final_state"])
    assert all(v.dtype == torch.float32 for k, v in saved.items() if k.startswith("model."))


def test_train_save_writes_step_records_with_the_run_settings(tmp_path):
    """``train --save``: one record per logged step, with the run's settings beside the step's values (the loss
    setting as ``loss_fn``: ``loss`` is the step's loss)."""
    import json

    argv = ["train", "--preset", "tiny", "--steps", "2", "--context-length", "16", "--device", "cpu", "--save",
            "--results-dir", str(tmp_path / "r"), "--checkpoint-dir", str(tmp_path / "c")]
    assert main(argv) == 0
    (path,) = (tmp_path / "r" / "train").glob("*.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [r.get("record", r) for r in rows]
    assert [r["step"] for r in rows] == [0, 1]
    assert all(isinstance(r["loss"], float) and r["loss_fn"] == "unfused" and r["cuda_graph"] is False
               for r in rows)


def test_graph_step_wiring_matches_the_eager_loop(monkeypatch):
    """What train hands to CapturedStep (stacked micro-batches, document ids, the same step body), run eagerly on
    the CPU in place of a capture: the losses and weights of the eager loop, with gradient accumulation and
    packed documents."""
    from cs336_systems import step_graph
    from cs336_systems import train as train_mod

    calls = []

    class Eager:  # CapturedStep's interface, without CUDA
        def __init__(self, step_fn, *, optimizer=None, warmup=2):
            self.step_fn = step_fn

        def __call__(self, *inputs):
            calls.append([tuple(t.shape) for t in inputs])
            return self.step_fn(*inputs)

    real_resolve = train_mod.resolve_settings
    monkeypatch.setattr(step_graph, "CapturedStep", Eager)
    cfg = dict(SMALL, steps=3, grad_accum=2, batch_size=2, optimizer="fused", eos_id=3, device="cpu")
    eager = train(TrainConfig(**cfg, cuda_graph=False), log=lambda s: None)
    monkeypatch.setattr(train_mod, "resolve_settings",
                        lambda c, d: (replace(real_resolve(c, d)[0], cuda_graph=True), "settings"))
    graphed = train(TrainConfig(**cfg), log=lambda s: None)
    assert graphed["config"]["cuda_graph"] is True and calls == [[(2, 2, 16)] * 3] * 3
    assert [r["loss"] for r in graphed["rows"]] == [r["loss"] for r in eager["rows"]]
    for name, weight in eager["final_state"].items():
        torch.testing.assert_close(graphed["final_state"][name], weight, rtol=0, atol=0)
