"""Benchmark records with provenance: the one way results are written and read.

A run of a benchmark writes ``results/<problem>/<timestamp>-<device>.jsonl``; every line is one
configuration with its measurements and a ``provenance`` object (device, versions, date, git commit,
the command with the results directory named relatively, the record file relative to the results
directory). Every row is checked against its problem's kind (:mod:`cs336_systems.records.schema`)
before anything is written, and read back as a typed :class:`~cs336_systems.records.schema.Record`.
``cs336-systems report`` reads these files alone; nothing in ``results/`` is written by hand.
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
import warnings
from pathlib import Path
from typing import Any

import torch

from cs336_systems.records.schema import KINDS, Provenance, Record, RecordKind, kind_of

__all__ = [
    "KINDS",
    "RESULTS_DIR",
    "Provenance",
    "Record",
    "RecordKind",
    "append_records",
    "device_name",
    "device_slug",
    "kind_of",
    "provenance",
    "read_records",
    "write_records",
]

RESULTS_DIR = Path("results")


def _git_commit() -> str:
    # An explicit CS336_GIT_COMMIT wins: a launcher that runs an exported tree (e.g. `git archive` on a lent GPU
    # machine) knows the commit, while `git` there may find an enclosing repository at another commit.
    if os.environ.get("CS336_GIT_COMMIT"):
        return os.environ["CS336_GIT_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[2]
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
        return (commit + ("+dirty" if dirty else "")) if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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


def relative_command(argv: list[str], results_dir: str | Path | None = None) -> str:
    """``argv`` as a shell line with the program named ``cs336-systems`` and no machine-local path:
    the results directory (``--results-dir``'s value, ``results_dir``, or any folder named
    ``results``) becomes ``results``, another absolute path its last component."""
    argv = list(argv)
    if argv and argv[0].endswith(("__main__.py", "cs336-systems")):
        argv[0] = "cs336-systems"
    results = str(Path(results_dir).resolve()) if results_dir is not None else None
    out = []
    prev = None
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if eq and name.startswith("--"):
            out.append(f"{name}={_relative_path(value, name == '--results-dir', results)}")
        else:
            out.append(arg if i == 0 else _relative_path(arg, prev == "--results-dir", results))
        prev = arg
    return shlex.join(out)


def _relative_path(value: str, is_results: bool, results: str | None) -> str:
    if not os.path.isabs(value):
        return value
    if is_results or value.rstrip("/") == results or Path(value).name == "results":
        return "results"
    return Path(value).name or "."


def provenance(device: torch.device | str | None = None) -> dict[str, Any]:
    return {
        "device": device_name(device),
        **_static_provenance(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": relative_command(sys.argv),  # write_records names its results directory relatively too
        # NCCL tuning variables change communication timings: a run records the ones it ran under.
        **({"nccl_env": env} if (env := {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")})
           else {}),
    }


def _normalised(problem: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as they will read back (JSON round trip), each checked against ``problem``'s kind."""
    kind = kind_of(problem)
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{problem} record {i}: expected a dict, got {type(row).__name__}")
        row = json.loads(json.dumps({k: v for k, v in row.items() if k != "provenance"}, default=str))
        kind.validate(row, where=f"row {i}")
        out.append(row)
    return out


def write_records(
    problem: str,
    rows: list[dict[str, Any]],
    results_dir: str | Path | None = None,
    device: torch.device | str | None = None,
) -> Path:
    """Write ``rows`` (each gets the same provenance) to a new file under ``results_dir/problem``.

    Every row is validated against the problem's record kind first: an unknown or missing field is a
    ``ValueError`` naming it, and nothing is written."""
    rows = _normalised(problem, rows)
    results_dir = Path(results_dir) if results_dir is not None else RESULTS_DIR
    prov = dict(provenance(device))
    prov["command"] = relative_command(shlex.split(prov.get("command", "")), results_dir)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    out_dir = results_dir / problem
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stamp}-{device_slug(device)}.jsonl"
    n = 1
    while path.exists():
        n += 1
        path = out_dir / f"{stamp}-{device_slug(device)}-{n}.jsonl"
    prov["output"] = f"{problem}/{path.name}"
    Provenance.from_dict(prov)  # the provenance is typed too
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps({**row, "provenance": prov}, default=str) + "\n")
    return path


def append_records(path: str | Path, problem: str, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to a file ``write_records`` created, with its first line's provenance, each
    validated like ``write_records``'s (for sweeps that write as they measure)."""
    path = Path(path)
    rows = _normalised(problem, rows)
    prov = json.loads(path.read_text().splitlines()[0])["provenance"]
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps({**row, "provenance": prov}, default=str) + "\n")


class RecordFileError(ValueError):
    """A line of a record file that is not a valid record; the message names ``file:line``."""


def read_records(problem: str, results_dir: str | Path | None = None, *, strict: bool = False) -> list[Record]:
    """All records of ``problem``, oldest file first, as typed rows.

    A line that is not JSON or does not fit the problem's kind is skipped with a warning naming
    ``file:line`` (``strict=True``: a :class:`RecordFileError` instead), so one bad line never hides
    the rest of the results and never goes unnoticed."""
    results_dir = Path(results_dir) if results_dir is not None else RESULTS_DIR
    kind = kind_of(problem)
    rows: list[Record] = []
    for path in sorted((results_dir / problem).glob("*.jsonl")):
        with path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(parse_record(kind, line))
                except ValueError as e:
                    err = RecordFileError(f"{path}:{lineno}: {e}")
                    if strict:
                        raise err from None
                    warnings.warn(f"skipping a record: {err}", stacklevel=2)
    return rows


def parse_record(kind: RecordKind, line: str) -> Record:
    """One JSON line -> a validated :class:`Record` (``ValueError`` saying what is wrong)."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("provenance"), dict):
        raise ValueError("not a record (a JSON object with a provenance object)")
    row = {k: v for k, v in data.items() if k != "provenance"}
    kind.validate(row)
    return Record(kind.problem, row, data["provenance"])
