"""ddp-bench and shard-bench as a user meets them on a CPU machine: bad settings are one line and exit code 2,
defaults sized for a CPU are announced, values that were not measured are None (n/a), never 0 or negative,
and the profiler's native log lines stay out of the output. The benchmarks themselves are replaced by a stub
that records the config (their runs are tested in test_comm.py and test_shard_bench.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cs336_systems.bench import ddp as ddp_bench
from cs336_systems.bench.harness import markdown_table, paired_overhead
from cs336_systems.cli import main
from cs336_systems.commands import ddp_bench as ddp_cmd
from cs336_systems.commands import shard_bench as shard_cmd

COMMANDS = {"ddp-bench": (ddp_cmd, "run_ddp_bench"), "shard-bench": (shard_cmd, "run_shard_bench")}


@pytest.fixture
def configs(monkeypatch):
    """The configs each command would run, without running them (a rank > 0 returns None: nothing to print)."""
    seen = []
    for module, name in COMMANDS.values():
        monkeypatch.setattr(module, name, lambda cfg: seen.append(cfg))
    return seen


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("world", ["0", "-3", "1"])
def test_world_size_below_two_is_refused(command, world, configs, capsys):
    assert main([command, "--device", "cpu", "--world-size", world, "--no-save"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert configs == [] and len(err) == 1 and "--world-size must be an integer >= 2" in err[0] and world in err[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_cuda_on_a_machine_without_it_is_one_line(command, configs, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main([command, "--device", "cuda", "--no-save"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert configs == [] and len(err) == 1 and "no CUDA GPU" in err[0] and "allowed here: cpu" in err[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_cpu_defaults_are_cpu_sized_and_announced(command, configs, capsys):
    assert main([command, "--device", "cpu", "--no-save"]) == 0
    (cfg,) = configs
    assert cfg.preset == "tiny" and cfg.context_length == ddp_cmd.CPU_CONTEXT_LENGTH and cfg.world_size == 2
    err = capsys.readouterr().err
    assert f"{command}: " in err and "preset tiny" in err and "2 CPU processes (gloo" in err
    assert main([command, "--device", "cpu", "--preset", "small", "--no-save"]) == 0
    assert configs[-1].preset == "small"  # an explicit preset wins


def test_exposed_communication_is_never_negative_or_zero():
    """Pairs whose synchronised step is not slower than the no-communication one: the exposed time is not
    measurable (None), and the 'none' variant, which communicates in neither half, has none either."""
    assert paired_overhead([1.0, 1.1, 0.9], [1.2, 1.3, 1.0])["exposed_ms"] is None
    assert paired_overhead([1.0, 1.0], [1.0, 1.0])["exposed_ms"] is None
    assert paired_overhead([1.5, 1.6, 1.4], [1.0, 1.1, 1.0])["exposed_ms"] == pytest.approx(500.0)
    cfg = ddp_bench.DDPBenchConfig(preset="tiny", device="cpu", precisions=("fp32",), variants=("none", "naive"))
    rank = {"precision": "fp32", "bucket_size_mb": None, "fwd_bwd_ms": 1.0, "sync_ms": 0.1, "optimizer_ms": 0.1,
            "nocomm_fwd_bwd_ms": 1.0, "nocomm_optimizer_ms": 0.1, "comm_calls_per_step": 0.0,
            "comm_bytes_per_step": 0.0, "comm_host_ms": 0.0, "peak_memory_gib": None, "peak_memory_scope": "variant"}
    faster = {"comm_step_s": [0.9, 0.8], "nocomm_step_s": [1.0, 1.0]}  # noise made the synchronised step faster
    runs = [{**rank, **faster, "variant": v, "label": v} for v in ("none", "naive")]
    rows = ddp_bench.summarize(cfg, [runs, runs], "gloo")
    assert [r["exposed_comm_ms"] for r in rows] == [None, None]
    assert all(r["peak_memory_gib"] is None for r in rows)  # a CPU has no allocator: not measured
    table = markdown_table(rows, ["label", "exposed_comm_ms", "peak_memory_gib", "not_a_column"])
    assert "n/a" in table and "nan" not in table and "None" not in table and "not_a_column" not in table


def test_profiler_log_lines_stay_out_of_the_output():
    """The native profiler writes a start and a stop line to stderr on every profiled step; ddp-bench profiles
    one step per variant. profile_comm keeps them out, and lets everything else through."""
    code = ("import sys, torch\n"
            "from cs336_systems.bench.harness import profile_comm\n"
            "def step():\n"
            "    print('kept line', file=sys.stderr, flush=True)\n"
            "    return torch.randn(64, 64) @ torch.randn(64, 64)\n"
            "out = profile_comm(step, torch.device('cpu'), keep_timeline=True)\n"
            "print(sorted(out))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "kept line" in done.stderr and "profiler_start" not in done.stderr and "USDT" not in done.stderr
    assert "comm_kernel_ms" in done.stdout and "timeline" in done.stdout
