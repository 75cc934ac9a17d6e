"""Helpers shared by the benchmarking / profiling sections: pick the records to show, and say where
they were measured."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from cs336_systems.records import read_records


def load(ctx, problem: str, keys: Iterable[str] | None = None, where: dict | None = None) -> list[dict]:
    """Records of ``problem``: those of a GPU if there are any (else all), filtered by ``where``; with
    ``keys``, only the newest record of each configuration (later runs replace earlier ones)."""
    rows = read_records(problem, ctx.results_dir)
    gpu = [r for r in rows if "CPU" not in r.get("provenance", {}).get("device", "CPU")]
    rows = gpu or rows
    if where:
        rows = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    if keys:
        latest: dict[tuple, dict] = {}
        for r in rows:  # oldest file first: later ones overwrite
            latest[tuple(str(r.get(k)) for k in keys)] = r
        rows = list(latest.values())
    return rows


def cpus_bound(r: dict) -> bool:
    """Whether a distributed record ran with each rank bound to its own CPU cores (the record's
    ``experiment.cpus_bound``): an experiment's setting, reported apart from the plain runs."""
    return (r.get("experiment") or {}).get("cpus_bound") is True


def provenance(rows: list[dict]) -> str:
    """One italic line per distinct (device, versions, date, command) of ``rows``."""
    seen, lines = set(), []
    for r in rows:
        p = r.get("provenance", {})
        key = (p.get("device"), p.get("date"), p.get("command"))
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"*Measured on {p.get('device')}, torch {p.get('torch')}, triton {p.get('triton')}, "
                     f"CUDA {p.get('cuda')}, {p.get('date')}, commit {p.get('git_commit')}: "
                     f"`{p.get('command')}`*")
    return "\n\n".join(lines)


def table(df: pd.DataFrame, floatfmt: str = ".3g") -> str:
    return df.to_markdown(index=False, floatfmt=floatfmt)


def ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok"]


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"
