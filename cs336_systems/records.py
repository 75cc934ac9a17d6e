"""Benchmark records with provenance.

A run of any benchmark writes one JSON-lines file ``results/<problem>/<timestamp>-<device>.jsonl``;
every line is one configuration with its measurements and a ``provenance`` object (device, torch /
triton / CUDA versions, date, git commit, the exact command). ``cs336-systems report`` reads these
files alone. Nothing in ``results/`` is written by hand.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path("results")


def _git_commit() -> str:
    # An explicit CS336_GIT_COMMIT wins: a launcher that runs an exported tree (e.g. `git archive` on a lent GPU
    # machine) knows the commit, while `git` there may find an enclosing repository at another commit.
    if os.environ.get("CS336_GIT_COMMIT"):
        return os.environ["CS336_GIT_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[1]
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return (commit + ("+dirty" if dirty else "")) if commit else _commit_from_env()
    except (OSError, subprocess.SubprocessError):
        return _commit_from_env()


def _commit_from_env() -> str:
    # A copy of the tree without .git (e.g. a lent GPU machine): the launcher passes the commit in.
    return os.environ.get("CS336_GIT_COMMIT", "unknown")


def device_name(device: torch.device | str | None = None) -> str:
    device = (
        torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def device_slug(device: torch.device | str | None = None) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", device_name(device).split(",")[0]).strip("-").lower() or "device"


@functools.cache
def _static_provenance() -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "git_commit": _git_commit(),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }


def provenance(device: torch.device | str | None = None) -> dict[str, Any]:
    argv = sys.argv[:]
    if argv and argv[0].endswith(("__main__.py", "cs336-systems")):
        argv[0] = "cs336-systems"
    return {
        "device": device_name(device),
        **_static_provenance(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join(argv),
        # NCCL tuning variables change communication timings: a run records the ones it ran under.
        **({"nccl_env": env} if (env := {k: v for k, v in sorted(os.environ.items())
                                         if k.startswith(("NCCL_", "CS336_NCCL_", "CS336_BIND_"))})
           else {}),
    }


def write_records(
    problem: str,
    rows: list[dict[str, Any]],
    results_dir: str | Path | None = None,
    device: torch.device | str | None = None,
) -> Path:
    """Write ``rows`` (each gets the same provenance) to a new file under ``results_dir/problem``."""
    results_dir = Path(results_dir) if results_dir is not None else RESULTS_DIR
    prov = provenance(device)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    out_dir = results_dir / problem
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stamp}-{device_slug(device)}.jsonl"
    n = 1
    while path.exists():
        n += 1
        path = out_dir / f"{stamp}-{device_slug(device)}-{n}.jsonl"
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps({**row, "provenance": prov}, default=str) + "\n")
    return path


def read_records(problem: str, results_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """All records of ``problem``, oldest file first."""
    results_dir = Path(results_dir) if results_dir is not None else RESULTS_DIR
    rows: list[dict[str, Any]] = []
    for path in sorted((results_dir / problem).glob("*.jsonl")):
        with path.open() as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows
