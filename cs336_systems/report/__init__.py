"""Records in ``results/`` -> ``REPORT.md`` (tables via pandas, plots via matplotlib, saved beside it).

Each handout problem has a section module in ``cs336_systems.report.sections`` exposing

    PROBLEM_IDS: tuple[str, ...]          # handout ids this module answers, e.g. ("benchmarking_script",)
    def build(ctx: ReportContext) -> str | None

``build`` returns the markdown of its section(s), each headed ``## <problem_id>``, written only from
records under ``ctx.results_dir`` (``cs336_systems.records.read_records``), or None when there are
no records yet (the report then lists the problem as not yet measured). While building, a section
gives each problem's answer in a line (``ctx.answer``) and each performance target's same-run
comparison with PyTorch (``ctx.versus``): the report opens with both tables. Plots go to
``ctx.figure_path(name)`` and are linked relative to the report.

The report is written only when it is complete: a missing or empty results directory, or an output
in a folder that does not exist, is a ``ValueError`` before any work, and the file is replaced
atomically, so a failed run never leaves a smaller REPORT.md behind.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cs336_systems.records import KINDS

REPO_ROOT = Path(__file__).resolve().parents[2]

# Handout order. (module name in cs336_systems.report.sections, problem ids it answers)
SECTION_MODULES: list[tuple[str, tuple[str, ...]]] = [
    ("benchmarking", ("benchmarking_script",)),
    ("profiling", ("nsys_profile",)),
    ("precision", ("mixed_precision_accumulation", "benchmarking_mixed_precision")),
    ("memory", ("memory_profiling",)),
    ("checkpointing", ("gradient_checkpointing",)),
    ("attention", ("pytorch_attention", "torch_compile")),
    ("mfu", ("mfu_target",)),
    ("flash", ("flash_forward", "flash_backward", "flash_benchmarking", "leaderboard")),
    ("ddp", ("distributed_communication_single_node", "naive_ddp", "naive_ddp_benchmarking",
             "minimal_ddp_flat_benchmarking", "ddp_overlap_individual_parameters",
             "ddp_overlap_individual_parameters_benchmarking", "ddp_overlap_bucketed", "ddp_bucketed_benchmarking",
             "communication_accounting")),
    ("sharding", ("optimizer_state_sharding", "optimizer_state_sharding_accounting", "fsdp", "fsdp_accounting")),
    ("scaling", ("data_parallel_scaling",)),  # issue #7, not a handout problem: our wrappers on 2-8 GPUs
    ("leaderboard_2026", ("leaderboard_2026",)),  # the 2026 leaderboard: the 8B training step
    ("training_step", ("training_step",)),  # issue 19, not a handout problem: our step vs a compiled PyTorch script
    ("flash_features", ("flash_features",)),  # issue 21, not a handout problem: GQA, windows, packed documents
]

# The summary's rows: (section anchor, label) for the problems of the 2025 and 2026 handouts (in handout
# order) and both leaderboards, then the project's own targets. A problem without a section links to
# "Not yet measured".
HANDOUT_PROBLEMS: list[tuple[str, str]] = [
    ("benchmarking_script", "benchmarking_script"), ("nsys_profile", "nsys_profile"),
    ("mixed_precision_accumulation", "mixed_precision_accumulation"),
    ("benchmarking_mixed_precision", "benchmarking_mixed_precision"), ("memory_profiling", "memory_profiling"),
    ("gradient_checkpointing", "gradient_checkpointing (2026)"), ("pytorch_attention", "pytorch_attention"),
    ("torch_compile", "torch_compile"), ("flash_forward", "flash_forward"), ("flash_backward", "flash_backward"),
    ("flash_benchmarking", "flash_benchmarking"), ("leaderboard", "leaderboard (2025: FlashAttention-2)"),
    ("distributed_communication_single_node", "distributed_communication_single_node"),
    ("naive_ddp", "naive_ddp"), ("naive_ddp_benchmarking", "naive_ddp_benchmarking"),
    ("minimal_ddp_flat_benchmarking", "minimal_ddp_flat_benchmarking"),
    ("ddp_overlap_individual_parameters", "ddp_overlap_individual_parameters"),
    ("ddp_overlap_individual_parameters_benchmarking", "ddp_overlap_individual_parameters_benchmarking"),
    ("ddp_overlap_bucketed", "ddp_overlap_bucketed (2025)"),
    ("ddp_bucketed_benchmarking", "ddp_bucketed_benchmarking (2025)"),
    ("communication_accounting", "communication_accounting (2025)"),
    ("optimizer_state_sharding", "optimizer_state_sharding"),
    ("optimizer_state_sharding_accounting", "optimizer_state_sharding_accounting"),
    ("fsdp", "fsdp (2026)"), ("fsdp_accounting", "fsdp_accounting (2026)"),
    ("leaderboard_2026", "leaderboard (2026: 8B training step)"),
]
PROJECT_TARGETS: list[tuple[str, str]] = [("mfu_target", "mfu_target (project)"),
                                          ("data_parallel_scaling", "data_parallel_scaling (project)"),
                                          ("training_step", "training_step (project: vs a compiled PyTorch script)"),
                                          ("flash_features", "flash_features (project: grouped-query heads, windows, "
                                                             "packed documents vs FlexAttention and SDPA)")]
# The 2026 handout's written calculations: answered on paper, not measured; named below the summary.
WRITTEN_PROBLEMS = ("alternate_ring_all_reduce", "data_parallel_calcs", "fsdp_calcs", "tp_calcs", "fsdp_tp_calcs")


@dataclass
class Versus:
    """One performance target: ours against the best PyTorch peer of the same run."""

    target: str  # the problem id (section anchor)
    what: str
    ours: str
    peer: str
    ratio: float | None  # ours / peer (time), or None where no peer ran
    goal: str


@dataclass
class ReportContext:
    results_dir: Path
    report_path: Path
    answers: dict[str, str] = field(default_factory=dict)
    comparisons: list[Versus] = field(default_factory=list)

    @property
    def figures_dir(self) -> Path:
        return self.report_path.parent / "figures"

    def figure_path(self, name: str) -> Path:
        self.figures_dir.mkdir(parents=True, exist_ok=True)
        return self.figures_dir / name

    def link(self, path: Path) -> str:
        return str(path.relative_to(self.report_path.parent))

    def answer(self, problem_id: str, text: str) -> None:
        """Add ``text`` to the summary line of ``problem_id``."""
        old = self.answers.get(problem_id)
        self.answers[problem_id] = f"{old}; {text}" if old else text

    def code(self, problem_id: str, path: str, name: str, what: str = "") -> None:
        """Answer an implementation problem with where its code is: ``path`` (from the repository root)
        must define ``name``, else the answer says it is missing."""
        file = REPO_ROOT / path
        found = file.is_file() and (f"class {name}" in file.read_text() or f"def {name}" in file.read_text())
        self.answer(problem_id, (f"`{name}` in `{path}`" + (f": {what}" if what else "")) if found
                    else f"`{name}` not found in `{path}`")

    def versus(self, target: str, what: str, ours: str, peer: str, ratio: float | None, goal: str) -> None:
        self.comparisons.append(Versus(target, what, ours, peer, ratio, goal))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _summary(ctx: ReportContext, present: set[str]) -> str:
    def link(anchor: str, label: str) -> str:
        return f"[{label}](#{anchor})" if anchor in present else f"[{label}](#not-yet-measured)"

    lines = ["## Summary\n", "One row per problem of the 2025 and 2026 handouts (and both leaderboards), then the "
             "project's own targets; each answer is computed from the records, the link leads to its section.\n",
             "| problem | answer |", "|:--|:--|"]
    for anchor, label in HANDOUT_PROBLEMS + PROJECT_TARGETS:
        answer = ctx.answers.get(anchor) or ("see the section" if anchor in present else "not yet measured")
        lines.append(f"| {link(anchor, label)} | {_cell(answer)} |")
    lines.append(f"\nThe 2026 handout's written calculations ({', '.join(f'`{p}`' for p in WRITTEN_PROBLEMS)}) "
                 "are not measured and not part of this report.\n")
    lines += ["### Versus PyTorch\n", "Every performance target: ours against the best PyTorch peer timed in the "
              "same run (ratio = our time / the peer's, or the inverse of throughput; below 1 is faster).\n",
              "| target | configuration | ours | best PyTorch peer | ratio | goal |",
              "|:--|:--|:--|:--|--:|:--|"]
    for v in ctx.comparisons:
        ratio = f"{v.ratio:.3f}x" if v.ratio is not None else "–"  # 3 places: 0.851 must not read as 0.85
        lines.append(f"| {link(v.target, v.target)} | {_cell(v.what)} | {_cell(v.ours)} | {_cell(v.peer)} | "
                     f"{ratio} | {_cell(v.goal)} |")
    return "\n".join(lines) + "\n"


def check_paths(results_dir: str | Path, report_path: str | Path) -> None:
    """``ValueError`` unless ``results_dir`` holds records of at least one problem and the report's
    folder exists: checked before any work, so a typo never replaces REPORT.md with an empty one."""
    results_dir, report_path = Path(results_dir), Path(report_path)
    if not report_path.parent.is_dir():
        raise ValueError(f"output {report_path}: folder {report_path.parent} does not exist")
    if not results_dir.is_dir():
        raise ValueError(f"results directory {results_dir} does not exist (expected results/<problem>/*.jsonl)")
    if not any(any((results_dir / p).glob("*.jsonl")) for p in KINDS):
        raise ValueError(f"results directory {results_dir} holds no records (no <problem>/*.jsonl for any of "
                         f"{', '.join(sorted(KINDS))}); REPORT.md left as it is")


def build_report(results_dir: str | Path = "results", report_path: str | Path = "REPORT.md") -> Path:
    check_paths(results_dir, report_path)
    ctx = ReportContext(Path(results_dir), Path(report_path))
    sections = []
    missing = []
    for module_name, problem_ids in SECTION_MODULES:
        module = importlib.import_module(f"cs336_systems.report.sections.{module_name}")
        text = module.build(ctx) or ""
        if text:
            sections.append(text.rstrip() + "\n")
        missing.extend(p for p in problem_ids if f"## {p}\n" not in text)
    present = {anchor for anchor, _ in HANDOUT_PROBLEMS + PROJECT_TARGETS
               if any(f"## {anchor}\n" in s for s in sections)}
    missing += [a for a, _ in HANDOUT_PROBLEMS + PROJECT_TARGETS if a not in present and a not in missing]
    parts = [
        "# cs336-systems: measured report\n",
        "Generated by `cs336-systems report` from the records in `results/`; every number below comes "
        "from a recorded run, whose device, library versions, date and command are given beside it.\n",
        _summary(ctx, present),
        *sections,
    ]
    if missing:
        parts.append("## Not yet measured\n\n" + "\n".join(f"- `{p}`" for p in missing) + "\n")
    _write_atomically(ctx.report_path, "\n".join(parts))
    return ctx.report_path


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
