"""Bad input on the command line and through the Python API: one line and exit 2, or a ValueError."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cs336_basics.model import BasicsTransformerLM
from cs336_systems.cli import COMMANDS, main
from cs336_systems.devices import resolve_device

DEVICE_COMMANDS = ["bench", "profile", "memory", "precision", "attention-bench", "train", "ddp-bench", "shard-bench"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU-only machine")
@pytest.mark.parametrize("command", DEVICE_COMMANDS)
def test_missing_gpu_is_one_line_and_exit_2(command, capsys):
    assert command in COMMANDS
    assert main([command, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device 'cuda'" in err[0] and "allowed here: cpu" in err[0]


@pytest.mark.parametrize(("argv", "names"), [
    (["train", "--lr", "abc"], "invalid float value: 'abc'"),
    (["profile", "--scope", "all"], "choose from 'forward', 'forward-backward', 'train-step'"),
    (["fly"], "invalid choice: 'fly' (choose from 'info', 'bench'"),
    ([], "the following arguments are required: COMMAND"),
])
def test_argument_errors_are_one_line_and_exit_2(argv, names, capsys):
    """argparse's own errors (a bad type, an unknown choice or command) are one line with the allowed values, not
    the usage block."""
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and lines[0].endswith("--help')")


def test_device_names_are_checked():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="not a device name"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="only cpu and cuda"):
        resolve_device("meta")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match="allowed here"):
        resolve_device(f"cuda:{n}")


def test_missing_gpu_from_a_fresh_process_has_no_traceback():
    if torch.cuda.is_available():
        pytest.skip("checks a CPU-only machine")
    proc = subprocess.run([sys.executable, "-m", "cs336_systems", "precision", "--device", "cuda"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_empty_sequence_is_a_value_error():
    model = BasicsTransformerLM(vocab_size=11, context_length=8, d_model=8, num_layers=1, num_heads=2, d_ff=16)
    with pytest.raises(ValueError, match="at least one position"):
        model(torch.zeros(2, 0, dtype=torch.long))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU default")
def test_memory_picks_a_cpu_sized_preset_without_profiler_noise(capfd):
    assert main(["memory", "--no-save", "--context-length", "16", "--mode", "forward", "--precision", "fp32"]) == 0
    out, err = capfd.readouterr()
    assert "CPU-sized preset 'tiny'" in out and "| tiny" in out
    assert "profiler_start" not in out + err and "profiler_stop" not in out + err
    assert "nan" not in out  # values not measured on a CPU show as n/a


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("flag, path", [("--checkpoint-dir", "/proc/cs336-no-such-dir"),
                                        ("--export", "/proc/cs336-model.pt"), ("--metrics", "/proc/cs336-m.jsonl"),
                                        ("--tensorboard", "/proc/cs336-tb")])
def test_a_folder_the_file_system_refuses_fails_before_training(flag, path, capsys):
    # /proc passes the permission checks (root may write anywhere) but refuses new entries: the write probe finds
    # out before the first step (--export used to fail only after training).
    assert main(["train", "--preset", "tiny", "--steps", "1", flag, path]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cs336-systems train: error: {flag} {path}: /proc refuses "
                                                   "new entries (")
    assert "step" not in out


def test_the_write_probe_leaves_nothing_behind(tmp_path):
    from cs336_systems.train import check_writable

    check_writable(tmp_path / "a" / "b", "--checkpoint-dir", directory=True)
    check_writable(tmp_path / "model.pt", "--export", directory=False)
    assert list(tmp_path.iterdir()) == []


def test_an_os_error_naming_no_path_keeps_its_traceback(monkeypatch):
    import cs336_systems.commands.info as info

    def broken(args):
        raise OSError("internal failure")

    monkeypatch.setattr(info, "run", broken)
    with pytest.raises(OSError, match="internal failure"):
        main(["info"])
