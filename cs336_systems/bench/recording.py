"""Write a sweep's records as they are measured, so that a sweep stopped part way (a time limit, a
crash of one configuration's process) still leaves every finished configuration on disk."""

from __future__ import annotations

from pathlib import Path

import torch

from cs336_systems.records import append_records, write_records


class RecordWriter:
    """First ``add`` creates ``results/<problem>/<stamp>-<device>.jsonl`` (with provenance, via
    ``write_records``); later ones append to the same file with the same provenance."""

    def __init__(self, problem: str, results_dir: str | Path, device: torch.device | str | None, enabled: bool = True):
        self.problem, self.results_dir, self.device, self.enabled = problem, results_dir, device, enabled
        self.path: Path | None = None

    def add(self, row: dict) -> None:
        if not self.enabled:
            return
        if self.path is None:
            self.path = write_records(self.problem, [row], self.results_dir, device=self.device)
        else:
            append_records(self.path, self.problem, [row])  # validated like the first row
