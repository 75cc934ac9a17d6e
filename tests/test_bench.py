"""The end-to-end benchmark harness: statistics exclude warm-up, OOM is recorded and the sweep goes on,
FLOP / MFU arithmetic against a hand count, activation checkpointing keeps gradients exact."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

import cs336_systems.bench.e2e as e2e
from cs336_basics.model import BasicsTransformerLM
from cs336_systems.bench.checkpointing import apply_activation_checkpointing
from cs336_systems.bench.e2e import BenchConfig, model_flops_per_step, run_benchmark
from cs336_systems.cli import main
from cs336_systems.commands.bench import configs_from_args
from cs336_systems.profiling.saved_tensors import saved_tensor_bytes
from cs336_systems.train import TrainConfig

TINY = dict(preset="tiny", context_length=32, device="cpu")


def _slow_first_calls(monkeypatch, n_slow: int, delay: float = 10.0):
    """A fake clock, and the first ``n_slow`` loss computations advance it by ``delay`` seconds (a stand-in
    for warm-up costs), so the test does not depend on the machine's speed or load."""
    import cs336_systems.profiling.timing as timing

    clock = {"t": 0.0}

    def fake_timer():
        clock["t"] += 1e-6
        return clock["t"]

    calls = {"n": 0}
    real = e2e.head_loss(False)

    def slow(logits, targets):
        calls["n"] += 1
        if calls["n"] <= n_slow:
            clock["t"] += delay
        return real(logits, targets)

    monkeypatch.setattr(timing.timeit, "default_timer", fake_timer)
    monkeypatch.setattr(e2e, "head_loss", lambda compile: slow)
    return calls


def test_warmup_steps_are_excluded_from_statistics(monkeypatch):
    calls = _slow_first_calls(monkeypatch, n_slow=2)
    rec = run_benchmark(BenchConfig(**TINY, mode="forward-backward", warmup=2, steps=3))
    assert calls["n"] == 5 and rec["status"] == "ok"
    assert len(rec["step_times_ms"]) == 3
    assert max(rec["step_times_ms"]) < 1.0  # fake clock: only the slow warm-up steps took 10 s
    assert rec["step_min_ms"] <= rec["step_median_ms"] <= max(rec["step_times_ms"])


def test_warmup_seconds_run_untimed_steps_until_that_long(monkeypatch):
    calls = _slow_first_calls(monkeypatch, n_slow=100, delay=0.3)  # every step 0.3 s of the fake clock
    rec = run_benchmark(BenchConfig(**TINY, mode="forward-backward", warmup=1, warmup_seconds=1.0, steps=2))
    assert rec["status"] == "ok" and rec["settle_steps"] == 4  # 0.3, 0.6, 0.9, then 1.2 s >= 1 s
    assert calls["n"] == 1 + 4 + 2 and len(rec["step_times_ms"]) == 2
    assert rec["warmup_seconds"] == 1.0


def test_warmup_seconds_default_and_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    quiet = dict(log=lambda _: None)
    assert [c.warmup_seconds for c in configs_from_args(_bench_args(["--preset", "tiny"]), **quiet)] == [0.0]
    given = configs_from_args(_bench_args(["--preset", "tiny", "--impl", "peer", "ours", "--warmup-seconds", "1.5"]),
                              **quiet)
    assert [(c.impl, c.warmup_seconds) for c in given] == [("peer", 1.5), ("ours", 1.5)]


def test_timing_step_synchronises_around_whole_steps_only(monkeypatch):
    """--timing step: no phase statistics and no synchronize inside a step (the GPU may run the backward while
    the host still launches it); phases: each phase's own, and the step spans them."""
    import cs336_systems.bench.harness as harness

    syncs = {"n": 0}
    real_sync = harness.synchronize
    monkeypatch.setattr(harness, "synchronize", lambda d: (syncs.__setitem__("n", syncs["n"] + 1), real_sync(d)))
    whole = run_benchmark(BenchConfig(**TINY, mode="train-step", warmup=1, steps=3, timing="step"))
    assert whole["status"] == "ok" and whole["timing"] == "step" and len(whole["step_times_ms"]) == 3
    assert not any(k.startswith(("forward_", "backward_", "optimizer_")) for k in whole)
    assert syncs["n"] == 2 * 4  # one before and one after each of the 4 steps
    syncs["n"] = 0
    split = run_benchmark(BenchConfig(**TINY, mode="train-step", warmup=1, steps=3, timing="phases"))
    assert split["timing"] == "phases" and syncs["n"] == 2 * 4 * 4  # the step and its three phases
    assert split["forward_mean_ms"] + split["backward_mean_ms"] + split["optimizer_mean_ms"] <= split["step_mean_ms"]
    with pytest.raises(ValueError, match=r"unknown timing 'events'.*phases, step"):
        BenchConfig(**TINY, timing="events")


def test_timing_default_is_whole_steps_against_a_peer(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    quiet = dict(log=lambda _: None)
    assert [c.timing for c in configs_from_args(_bench_args(["--preset", "tiny"]), **quiet)] == ["phases"]
    peers = configs_from_args(_bench_args(["--preset", "tiny", "--impl", "peer", "ours"]), **quiet)
    assert [(c.impl, c.timing) for c in peers] == [("peer", "step"), ("ours", "step")]
    given = configs_from_args(_bench_args(["--preset", "tiny", "--impl", "peer", "--timing", "phases"]), **quiet)
    assert [c.timing for c in given] == ["phases"]


def test_without_warmup_the_slow_steps_are_measured(monkeypatch):
    _slow_first_calls(monkeypatch, n_slow=2)
    rec = run_benchmark(BenchConfig(**TINY, mode="forward-backward", warmup=0, steps=3))
    assert sum(t >= 10_000 for t in rec["step_times_ms"]) == 2
    assert rec["forward_mean_ms"] == pytest.approx(2 * 10_000 / 3, rel=1e-3)
    assert rec["step_std_ms"] > 5_000


def test_oom_in_a_sweep_is_recorded_and_the_sweep_goes_on(monkeypatch, tmp_path, capsys):
    real = e2e.BasicsTransformerLM

    def model_or_oom(**kwargs):
        if kwargs["d_model"] == 768:  # the "small" preset: pretend it does not fit
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return real(**kwargs)

    monkeypatch.setattr(e2e, "BasicsTransformerLM", model_or_oom)
    argv = ["bench", "--preset", "small", "tiny", "--context-length", "32", "--device", "cpu", "--warmup", "1",
            "--steps", "2", "--results-dir", str(tmp_path)]
    assert main(argv) == 0
    assert "OOM" in capsys.readouterr().out
    files = (tmp_path / "benchmarking_script").glob("*.jsonl")
    rows = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    by_preset = {r["preset"]: r for r in rows}
    assert by_preset["small"]["status"] == "OOM" and "simulated" in by_preset["small"]["error"]
    assert by_preset["tiny"]["status"] == "ok" and by_preset["tiny"]["step_mean_ms"] > 0
    assert all("provenance" in r for r in rows)


def test_non_oom_errors_are_not_swallowed(monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(e2e, "BasicsTransformerLM", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_benchmark(BenchConfig(**TINY))


def test_flops_and_mfu_against_a_hand_count():
    # medium: d=1024, d_ff=4096, 24 layers, vocab 10,000; batch 4, T=256.
    d, f, n_layers, vocab, t, b = 1024, 4096, 24, 10_000, 256, 4
    matmul_params = n_layers * (4 * d * d + 3 * d * f) + d * vocab
    forward_per_token = 2 * matmul_params + 2 * 2 * n_layers * t * d  # weights + QK^T and PV
    cfg = BenchConfig(preset="medium", context_length=t, mode="forward", device="cpu")
    assert model_flops_per_step(cfg, b) == forward_per_token * b * t
    cfg = BenchConfig(preset="medium", context_length=t, mode="train-step", device="cpu")
    assert model_flops_per_step(cfg, b) == 3 * forward_per_token * b * t
    # MFU of a measured record is its model FLOP rate over the measured matmul peak.
    rec = run_benchmark(BenchConfig(**TINY, warmup=1, steps=2))
    flops = model_flops_per_step(BenchConfig(**TINY), 4)
    assert rec["model_flops_per_step"] == flops
    assert rec["model_tflops"] == pytest.approx(flops / (rec["step_mean_ms"] * 1e-3) / 1e12)
    assert rec["mfu"] == pytest.approx(rec["model_tflops"] / rec["peak_tflops"])
    assert rec["tokens_per_s"] == pytest.approx(4 * 32 / (rec["step_mean_ms"] * 1e-3))


def test_bad_configs_are_value_errors():
    for bad in (dict(mode="inference"), dict(precision="fp8"), dict(checkpoint="every"), dict(checkpoint=99),
                dict(optimizer="sgd"), dict(compile_scope="layer"), dict(steps=0), dict(attention="nope"),
                dict(warmup_seconds=-1.0), dict(warmup_seconds=float("nan")), dict(warmup_seconds=1e4)):
        with pytest.raises(ValueError):
            BenchConfig(**TINY, **bad)


@pytest.mark.parametrize(("bad", "message"), [
    (dict(steps=-3), r"need --warmup >= 0 and --steps >= 1, got --warmup \d+, --steps -3"),
    (dict(warmup=-1), r"need --warmup >= 0 and --steps >= 1, got --warmup -1"),
    (dict(context_length=0), r"--context-length must be >= 1, got 0"),
    (dict(batch_size=0), r"--batch-size must be >= 1, got 0"),
])
def test_bad_sizes_name_the_flag_and_value(bad, message):
    with pytest.raises(ValueError, match=message):
        BenchConfig(**{**TINY, **bad})


def test_warmup_study_flag_builds_the_study():
    args = argparse.Namespace(default=False, preset=["tiny"], context_length=[32], batch_size=None, mode=["train-step"],
                              precision=["fp32"], compile="no", compile_scope="model", attention=["reference"],
                              checkpoint=["none"], optimizer=["ours"], warmup=5, steps=3, warmup_study=True,
                              device="cpu")
    assert [c.warmup for c in configs_from_args(args)] == [0, 1, 2, 5]


@pytest.mark.slow
def test_isolated_run_returns_a_record():
    rec = e2e.run_benchmark_isolated(BenchConfig(**TINY, mode="forward", warmup=0, steps=2))
    assert rec["status"] == "ok" and len(rec["step_times_ms"]) == 2


def _tiny_lm(n_layers: int) -> BasicsTransformerLM:
    return BasicsTransformerLM(vocab_size=97, context_length=19, d_model=24, num_layers=n_layers, num_heads=3,
                               d_ff=40, dtype=torch.float64)


@pytest.mark.parametrize("spec", ["1", "2", "nested", "selective"])
def test_checkpointing_keeps_gradients_and_saves_memory(spec, seed):
    n_layers = 5  # odd: groups of 2 leave a last group of 1; bisection is uneven
    ref = _tiny_lm(n_layers)
    ckpt = _tiny_lm(n_layers)
    ckpt.load_state_dict(ref.state_dict())
    apply_activation_checkpointing(ckpt, spec)
    x = torch.randint(0, 97, (3, 19))
    for m in (ref, ckpt):
        m(x).pow(2).mean().backward()
    ckpt_grads = dict(ckpt.named_parameters())
    for name, p in ref.named_parameters():
        # parameter names differ only by the wrapper path; match by the block index inside the wrapper
        match = [q for n, q in ckpt_grads.items() if n.split(".")[-2:] == name.split(".")[-2:]
                 and q.shape == p.shape]
        assert any(torch.allclose(q.grad, p.grad, rtol=1e-10, atol=1e-12) for q in match), name
    saved_ref = saved_tensor_bytes(lambda: ref(x))
    saved_ckpt = saved_tensor_bytes(lambda: ckpt(x))
    assert saved_ckpt < saved_ref


def test_checkpoint_groups():
    m = apply_activation_checkpointing(_tiny_lm(5), "2")
    assert [len(g.blocks) for g in m.layers] == [2, 2, 1]
    with pytest.raises(ValueError):
        apply_activation_checkpointing(_tiny_lm(2), "3")


@pytest.mark.gpu
def test_gpu_bench_events_agree_with_host_timer():
    rec = run_benchmark(BenchConfig(preset="small", context_length=128, warmup=2, steps=5, device="cuda"))
    assert rec["status"] == "ok" and rec["peak_memory_gib"] > 0
    # CUDA events bracket the same region as the synchronised host clock: they agree to within launch overhead.
    assert rec["step_event_mean_ms"] == pytest.approx(rec["step_mean_ms"], rel=0.15)
    assert 0 < rec["mfu"] < 1


@pytest.mark.gpu
def test_gpu_compile_and_checkpoint_run():
    for cfg in (BenchConfig(preset="tiny", context_length=64, compile=True, warmup=2, steps=2, device="cuda"),
                BenchConfig(preset="small", context_length=128, checkpoint="2", warmup=1, steps=2, device="cuda",
                            precision="bf16")):
        assert run_benchmark(cfg)["status"] == "ok"


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["sdpa", "flash_auto"])
def test_gpu_cuda_graph_step_runs_with_compiled_blocks_and_fused_loss(attention):
    """The captured step in the settings it is meant for (bf16, compiled blocks, fused optimizer and loss; SDPA as
    PyTorch dispatches it and the measured backend); its record says so and has no phases (one replay)."""
    cfg = BenchConfig(preset="small", context_length=128, precision="bf16", compile=True, compile_scope="blocks",
                      attention=attention, optimizer="fused", loss="fused", cuda_graph=True, warmup=3, steps=3,
                      device="cuda")
    probe = BenchConfig(preset="tiny", context_length=32, precision="bf16", warmup=1, steps=1, device="cuda")
    left = []
    for _ in range(3):
        rec = run_benchmark(cfg)
        assert rec["status"] == "ok" and rec["cuda_graph"] is True and "forward_mean_ms" not in rec
        assert rec["timing"] == "step"  # asked for phases (the default), timed by whole replays
        assert rec["step_mean_ms"] > 0
        assert ("attention_choice" in rec) == (attention == "flash_auto")
        left.append(run_benchmark(probe)["memory_before_gib"])
    # nothing of a configuration (graph pool, compiled blocks, ~2 GiB of weights and optimizer state) is left for
    # the next one, beyond the libraries' workspaces: made on first use (the second run may still add one), then
    # no growth from one configuration to the next
    assert max(left) < 0.5 and left[2] - left[1] < 0.01, left


def test_cuda_graph_bench_config_bad_input():
    with pytest.raises(ValueError, match="--optimizer fused"):
        BenchConfig(**TINY, cuda_graph=True)
    with pytest.raises(ValueError, match="--warmup >= 2"):
        BenchConfig(**{**TINY, "warmup": 1}, optimizer="fused", cuda_graph=True)


# --- issue 17: CPU out-of-memory, CPU defaults, progress, --device cuda without a GPU ------------------------


@pytest.mark.parametrize("err", [RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                              "8000000000 bytes. Error code 12 (Cannot allocate memory)"),
                                 MemoryError()])
def test_cpu_allocator_failure_is_recorded_as_oom(monkeypatch, err):
    def no_memory(**kwargs):
        raise err

    monkeypatch.setattr(e2e, "BasicsTransformerLM", no_memory)
    assert run_benchmark(BenchConfig(**TINY))["status"] == "OOM"


def _bench_args(argv: list[str]) -> argparse.Namespace:
    from cs336_systems.commands.bench import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_no_arguments_on_a_cpu_pick_a_cpu_sized_default_and_say_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    said = []
    configs = configs_from_args(_bench_args([]), log=said.append)
    assert [(c.preset, c.context_length, c.torch_device.type) for c in configs] == [("tiny", 128, "cpu")]
    assert any("tiny" in line and "128" in line for line in said)


def test_device_cuda_without_a_gpu_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda", "--no-save"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA GPU" in err and "Traceback" not in err
    assert main(["bench", "--device", "tpu", "--no-save"]) == 2


def test_each_configuration_shows_progress_per_step(monkeypatch):
    bars = []
    real = e2e.tqdm

    def recording_tqdm(iterable, **kwargs):
        bars.append(kwargs)
        return real(iterable, **kwargs)

    monkeypatch.setattr(e2e, "tqdm", recording_tqdm)
    run_benchmark(BenchConfig(**TINY, warmup=1, steps=2))
    assert len(bars) == 1 and bars[0]["unit"] == "step" and 0 < bars[0]["delay"] <= 5


# --- issue 19: the peer, fast settings, selective checkpointing ---------------------------------------------


def test_peer_is_timed_in_the_same_run_and_records_carry_the_ratio(tmp_path, capsys):
    argv = ["bench", "--impl", "ours", "peer", "--preset", "tiny", "--context-length", "32", "--device", "cpu",
            "--warmup", "1", "--steps", "2", "--optimizer", "ours", "fused", "--results-dir", str(tmp_path)]
    assert main(argv) == 0
    files = (tmp_path / "benchmarking_script").glob("*.jsonl")
    rows = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    peer = [r for r in rows if r["impl"] == "peer"]
    ours = [r for r in rows if r["impl"] == "ours"]
    assert len(peer) == 1 and len(ours) == 2 and rows[0]["impl"] == "peer"  # the peer first: ours can be compared
    for r in ours:
        assert r["n_params"] == peer[0]["n_params"]  # same sizes, parameter for parameter
        assert r["step_ratio_vs_peer"] == pytest.approx(r["step_mean_ms"] / peer[0]["step_mean_ms"])
        assert r["peer_sdpa"] == peer[0]["peer_sdpa"] == "sdpa"  # no measured table for a CPU: PyTorch's dispatch


def test_captured_step_warms_up_on_replays():
    """At most two eager warm-up steps before the capture; the rest of the warm-up replays the graph, so that the timed
    replays follow replays (the GPU's power state settles on the timed work)."""
    class Optimizer:  # what CapturedStep asks of an optimizer; nothing is captured on a CPU
        def before_graph_replay(self):
            pass

    for warmup, eager in ((2, 1), (3, 2), (5, 2), (12, 2)):
        cfg = BenchConfig(preset="tiny", context_length=16, warmup=warmup, steps=1, device="cpu")
        assert e2e._captured_step(cfg, None, Optimizer(), None, torch.device("cpu")).warmup == eager


def test_flash_auto_runs_record_what_it_ran():
    """``attention_choice``: the kernels flash_auto ran at the model's shape (its table changes as kernels improve,
    so the name alone does not say); only for flash_auto runs (on a CPU, no table: SDPA)."""
    auto = run_benchmark(BenchConfig(preset="tiny", context_length=32, attention="flash_auto", warmup=1, steps=1,
                                     device="cpu"))
    plain = run_benchmark(BenchConfig(preset="tiny", context_length=32, attention="sdpa", warmup=1, steps=1,
                                      device="cpu"))
    assert auto["status"] == plain["status"] == "ok"
    assert auto["attention_choice"] == "sdpa" and "attention_choice" not in plain


def test_peer_with_a_pinned_sdpa_backend_computes_the_same_loss():
    """The peer's SDPA priority list (what bench pins from the measured table) changes the kernel, not the maths:
    with the memory-efficient backend first a CPU falls through to its own kernel and gets the same loss."""
    from cs336_systems.attention.auto import sdpa_priority
    from cs336_systems.bench.peer import build_peer
    from cs336_systems.configs import get_preset

    kwargs = get_preset("tiny").replace(context_length=16).model_kwargs()
    tokens = torch.randint(0, kwargs["vocab_size"], (2, 16))
    losses = []
    for backends in (None, sdpa_priority("sdpa_efficient")):
        torch.manual_seed(0)
        model, _, loss_fn = build_peer(kwargs, torch.device("cpu"), compile=False, sdpa_backends=backends)
        losses.append(loss_fn(tokens, tokens).item())
    assert model.blocks[0].sdpa_backends == sdpa_priority("sdpa_efficient")
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


def test_fast_settings_on_cpu_are_the_reference_and_bench_prints_them(monkeypatch):
    from cs336_systems.fast import fast_settings

    cpu, cuda = fast_settings("cpu"), fast_settings("cuda")
    assert (cpu.compile, cpu.optimizer, cpu.loss) == (False, "ours", "unfused")
    assert cuda.optimizer == "fused" and cuda.compile and cuda.loss == "unfused"
    assert (cpu.residual_dtype, cuda.residual_dtype) == ("fp32", "bf16")
    assert (cpu.rope, cuda.rope) == ("torch", "triton")
    assert (cpu.cublas_workspace, cuda.cublas_workspace) == ("default", "none")
    assert fast_settings("cuda", vocab_size=151_936).loss == "fused"  # the 8b vocabulary
    said = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    configs = configs_from_args(_bench_args(["--preset", "tiny", "--optimizer", "torch-fused"]), log=said.append)
    assert configs[0].optimizer == "torch-fused" and configs[0].loss == "unfused"  # the user's choice wins
    assert any("fast settings" in line and "loss=unfused (tiny)" in line for line in said)
    assert not any("optimizer=" in line for line in said)  # only what it picked is printed


def test_cublas_workspace_fills_the_variable_only_where_unset(monkeypatch):
    """"none" sets CUBLAS_WORKSPACE_CONFIG=:0:0 where the user set nothing and keeps what they set (e.g. ":4096:8"
    for deterministic algorithms); "default" changes nothing; the value in force is what records carry."""
    from cs336_systems.fast import CUBLAS_WORKSPACE_ENV, apply_cublas_workspace

    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    assert apply_cublas_workspace("default") == "" and CUBLAS_WORKSPACE_ENV not in os.environ
    assert apply_cublas_workspace("none") == ":0:0" and os.environ[CUBLAS_WORKSPACE_ENV] == ":0:0"
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert apply_cublas_workspace("none") == ""  # deterministic algorithms need one of cuBLAS's fixed workspaces
    monkeypatch.undo()
    monkeypatch.setenv(CUBLAS_WORKSPACE_ENV, ":4096:8")
    assert apply_cublas_workspace("none") == ":4096:8" and os.environ[CUBLAS_WORKSPACE_ENV] == ":4096:8"
    with pytest.raises(ValueError, match="choose from default, none"):
        apply_cublas_workspace("off")
    with pytest.raises(ValueError, match="unknown cuBLAS workspace 'off'"):
        BenchConfig(preset="tiny", cublas_workspace="off")
    with pytest.raises(ValueError, match="--cublas-workspace 'off'; choose from default, none"):
        TrainConfig(cublas_workspace="off")
    # bench: a setting given applies to peers too; the fast default to ours only (a peer runs as a plain script)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["--preset", "tiny", "--impl", "peer", "ours"]
    configs = configs_from_args(_bench_args([*args, "--cublas-workspace", "none"]))
    assert {(c.impl, c.cublas_workspace) for c in configs} == {("peer", "none"), ("ours", "none")}
    import cs336_systems.commands.bench as bench_cmd
    from cs336_systems.fast import fast_settings

    monkeypatch.setattr(bench_cmd, "fast_settings",
                        lambda device, vocab_size=None, **kw: fast_settings("cuda", vocab_size))
    configs = configs_from_args(_bench_args([*args, "--compile", "no", "--cuda-graph", "no", "--attention",
                                             "reference", "--rope", "torch"]))
    assert {(c.impl, c.cublas_workspace) for c in configs} == {("peer", "default"), ("ours", "none")}


def test_residual_dtype_default_applies_only_where_it_can(monkeypatch):
    """The fast default's bf16 residual stream goes to our bf16 train steps with the fused optimizer only; an
    explicit one elsewhere is refused, naming what it needs; a bf16 one trains on the CPU."""
    import cs336_systems.commands.bench as bench_cmd
    from cs336_systems.fast import FastSettings

    cuda_like = FastSettings(attention="reference", compile=False, compile_scope="model", optimizer="fused",
                             loss="unfused", cuda_graph=False, residual_dtype="bf16", rope="torch", ffn="torch",
                             cublas_workspace="default")
    monkeypatch.setattr(bench_cmd, "fast_settings", lambda device, vocab_size=None, **kw: cuda_like)
    said = []
    args = _bench_args(["--preset", "tiny", "--device", "cpu", "--precision", "fp32", "bf16", "--optimizer",
                        "fused", "ours", "--impl", "peer", "ours"])
    got = {(c.impl, c.precision, c.optimizer): c.residual_dtype for c in configs_from_args(args, log=said.append)}
    assert got == {("peer", "fp32", "torch-fused"): "fp32", ("peer", "bf16", "torch-fused"): "fp32",
                   ("ours", "fp32", "fused"): "fp32", ("ours", "fp32", "ours"): "fp32",
                   ("ours", "bf16", "fused"): "bf16", ("ours", "bf16", "ours"): "fp32"}
    assert any("residual_dtype=bf16" in line for line in said)
    args = _bench_args(["--preset", "tiny", "--device", "cpu", "--precision", "bf16", "--optimizer", "fused",
                        "--residual-dtype", "fp32", "bf16"])
    assert [c.residual_dtype for c in configs_from_args(args, log=lambda _: None)] == ["fp32", "bf16"]
    with pytest.raises(ValueError, match="needs our train step with --precision bf16 and --optimizer fused"):
        BenchConfig(**TINY, precision="fp32", optimizer="fused", residual_dtype="bf16")
    with pytest.raises(ValueError, match="unknown residual dtype 'fp16'; choose from fp32, bf16"):
        BenchConfig(**TINY, residual_dtype="fp16")
    rec = run_benchmark(BenchConfig(**TINY, precision="bf16", optimizer="fused", residual_dtype="bf16", warmup=1,
                                    steps=1))
    assert rec["status"] == "ok" and rec["residual_dtype"] == "bf16"


def test_rope_kernel_setting_bad_input():
    with pytest.raises(ValueError, match="unknown rope kernel 'cuda'; choose from torch, triton"):
        BenchConfig(**TINY, rope="cuda")
    with pytest.raises(ValueError, match="--rope triton runs our model on a CUDA device"):
        BenchConfig(**TINY, rope="triton")
    with pytest.raises(ValueError, match=r"--rope triton runs our model on a CUDA device \(got impl peer"):
        BenchConfig(**TINY, rope="triton", impl="peer")
    with pytest.raises(SystemExit) as err:
        _bench_args(["--rope", "cuda"])
    assert err.value.code == 2


def test_a_given_matmul_peak_is_the_mfu_denominator():
    """bench measures the matmul peak once per run on CUDA and hands it to every configuration: the record's MFU is
    against it (and says so); without one, each process measures its own."""
    shared = run_benchmark(BenchConfig(**TINY, warmup=1, steps=1, peak_tflops=0.125))
    assert shared["peak_tflops"] == 0.125 and shared["peak_tflops_shared"] is True
    assert shared["mfu"] == pytest.approx(shared["model_tflops"] / 0.125)
    own = run_benchmark(BenchConfig(**TINY, warmup=1, steps=1))
    assert own["peak_tflops_shared"] is False and own["peak_tflops"] > 0
    with pytest.raises(ValueError, match="peak_tflops must be > 0 or None, got 0"):
        BenchConfig(**TINY, peak_tflops=0)


def test_activation_checkpointing_flag_and_its_old_name():
    for flag in ("--activation-checkpointing", "--checkpoint"):
        args = _bench_args(["--preset", "tiny", "--device", "cpu", flag, "selective", "2"])
        assert [c.checkpoint for c in configs_from_args(args, log=lambda _: None)] == ["selective", "2"]


def test_sweep_order_is_kept_and_each_peer_comes_first():
    args = _bench_args(["--preset", "xl", "small", "--context-length", "64", "32", "--device", "cpu",
                        "--impl", "ours", "peer"])
    got = [(c.impl, c.preset, c.context_length) for c in configs_from_args(args, log=lambda _: None)]
    assert got == [(i, p, t) for p in ("xl", "small") for t in (64, 32) for i in ("peer", "ours")]


def test_a_step_that_cannot_fit_in_ram_is_recorded_oom_without_running(monkeypatch):
    """On the CPU the kernel kills a process that runs out of RAM (and the run's records with it): a configuration
    whose lower bound exceeds the free RAM is an OOM row with the numbers, and nothing is built."""
    from cs336_systems.configs import get_preset

    model_cfg = get_preset("tiny").replace(context_length=32, batch_size=4)
    bound = {mode: e2e.step_memory_lower_bound(BenchConfig(**TINY, mode=mode), model_cfg)
             for mode in ("forward", "forward-backward", "train-step")}
    assert bound["forward"] < bound["forward-backward"] < bound["train-step"]
    monkeypatch.setattr(e2e, "build_ours", lambda *a, **k: pytest.fail("built a model that cannot fit"))
    record = run_benchmark(BenchConfig(**TINY, batch_size=10**7, warmup=1, steps=1))
    assert record["status"] == "OOM" and record["error"].startswith("not run: needs at least")
    assert "GiB free" in record["error"]
