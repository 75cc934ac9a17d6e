"""``cs336-systems report``: rebuild REPORT.md from results/ alone.

Refuses (one line, exit 2) before any work when the results directory is missing or holds no records,
or when the output's folder does not exist; a record line that cannot be read is skipped with a warning
naming its file and line. REPORT.md is replaced only by a complete new report."""

from __future__ import annotations

import argparse

from cs336_systems.report import build_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-dir", default="results")
    p.add_argument("--output", default="REPORT.md")


def run(args: argparse.Namespace) -> int:
    path = build_report(args.results_dir, args.output)
    print(f"wrote {path}")
    return 0
