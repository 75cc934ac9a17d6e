"""The CLI and the arithmetic on presets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cs336_systems.cli import main
from cs336_systems.configs import count_parameters, forward_flops_per_token, get_preset, training_flops_per_token


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("torch", "triton", "CUDA available", "NCCL", "attention backends"):
        assert key in out


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "cs336_systems", "info"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "torch" in proc.stdout


def test_bench_default_cpu_writes_records(tmp_path, capsys):
    assert main(["bench", "--default", "--device", "cpu", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| tiny" in out and "train-step" in out
    files = list((tmp_path / "benchmarking_script").glob("*.jsonl"))
    assert len(files) == 1
    rows = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert {r["mode"] for r in rows} == {"forward", "forward-backward", "train-step"}
    for r in rows:
        assert r["status"] == "ok" and r["step_mean_ms"] > 0
        assert {"device", "torch", "date", "command", "git_commit"} <= set(r["provenance"])


def test_bad_cli_input_is_a_clear_error(capsys):
    assert main(["bench", "--preset", "huge", "--no-save"]) == 2
    assert "unknown model preset 'huge'" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--seq-len", "128", "-5"], "--seq-len takes sizes >= 1, got 128 -5"),
    (["--head-dim", "0"], "--head-dim takes sizes >= 1, got 0"),
    (["--rep-ms", "0"], "--rep-ms must be > 0, got 0.0"),
    (["--lb-rep-ms", "nan"], "--lb-rep-ms must be > 0, got nan"),
])
def test_flash_bench_bad_sizes_exit_2_before_any_gpu_check(capsys, args, message):
    assert main(["flash-bench", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_flops_hand_count_small():
    # small: d=768, d_ff=3072, 12 layers, vocab 10,000, T=512.
    cfg = get_preset("small")
    per_layer_matmul = 4 * 768 * 768 + 3 * 768 * 3072  # q,k,v,o + w1,w2,w3
    matmul_params = 12 * per_layer_matmul + 768 * 10_000  # + lm head
    assert forward_flops_per_token(cfg, 512) == 2 * matmul_params + 4 * 12 * 512 * 768
    assert training_flops_per_token(cfg, 512) == 3 * forward_flops_per_token(cfg, 512)
    assert count_parameters(cfg) == 12 * (per_layer_matmul + 2 * 768) + 768 + 2 * 768 * 10_000


def test_preset_table():
    # Handout Table 1 (d_model, d_ff, layers, heads) and the 2026 leaderboard model.
    expected = {
        "small": (768, 3072, 12, 12),
        "medium": (1024, 4096, 24, 16),
        "large": (1280, 5120, 36, 20),
        "xl": (1600, 6400, 48, 25),
        "2.7B": (2560, 10240, 32, 32),
        "8b": (4096, 11008, 34, 32),
    }
    for name, dims in expected.items():
        c = get_preset(name)
        assert (c.d_model, c.d_ff, c.num_layers, c.num_heads) == dims
    assert get_preset("8b").vocab_size == 151_936 and get_preset("8b").context_length == 32_768
    assert get_preset("8b").batch_size == 2 and get_preset("8b").dtype == "bf16"
    assert get_preset("small").vocab_size == 10_000 and get_preset("small").batch_size == 4
    assert get_preset("2.7b").name == "2.7B"  # case-insensitive
    with pytest.raises(ValueError):
        get_preset("small", dtype="fp8")
