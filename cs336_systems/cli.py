"""``cs336-systems <command>`` (also ``python -m cs336_systems``).

Each command lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
modules are imported only when their command runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("cs336_systems.commands.info", "torch / triton / CUDA versions, GPUs, NCCL"),
    "bench": (
        "cs336_systems.commands.bench",
        "end-to-end timing of forward / backward / optimizer (benchmarking_script)",
    ),
    "profile": ("cs336_systems.commands.profile", "kernel tables, GEMM share, attention split, traces (nsys_profile)"),
    "precision": ("cs336_systems.commands.precision",
                  "accumulation loops and observed autocast dtypes (mixed_precision_accumulation)"),
    "memory": ("cs336_systems.commands.memory", "peak memory, snapshots, largest allocations (memory_profiling)"),
    "attention-bench": ("cs336_systems.commands.attention_bench",
                        "attention forward/backward timing and memory vs sequence length (pytorch_attention)"),
    "comm-bench": ("cs336_systems.commands.comm_bench",
                   "all-reduce latency / bandwidth, gloo and NCCL (distributed_communication_single_node)"),
    "train": ("cs336_systems.commands.train",
              "train the LM, one process or under torchrun (--parallel: DDP variants, ZeRO, FSDP)"),
    "ddp-bench": ("cs336_systems.commands.ddp_bench",
                  "DDP wrappers vs torch DDP: step time, exposed communication, traces (*_ddp_benchmarking)"),
    "shard-bench": ("cs336_systems.commands.shard_bench",
                    "sharded optimizer and FSDP vs DDP, ZeRO and FSDP2: memory breakdown, step time, traces"),
    "flash-bench": ("cs336_systems.commands.flash_bench",
                    "FlashAttention-2 vs its peers (flash_benchmarking, leaderboard)"),
    "leaderboard": ("cs336_systems.commands.leaderboard",
                    "one full 8B training step, timed as the 2026 handout's leaderboard (leaderboard)"),
    "report": ("cs336_systems.commands.report", "rebuild REPORT.md from results/"),
}


class _Parser(argparse.ArgumentParser):
    """An argument error is one line naming the problem (argparse's own names the allowed choices) and where the
    options are listed, not the whole usage block above it; exit code 2 as argparse's."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cs336-systems",
        description="Make Transformer LM training fast, and measure it honestly (CS336 Assignment 2).",
        epilog="Run `cs336-systems COMMAND --help` for a command's options. Distributed commands run under "
        "torchrun: torchrun --nproc-per-node N -m cs336_systems COMMAND ...",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        # Arguments are added lazily for the chosen command only (see main()).
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    # First pass: find the command; second pass: parse its own arguments.
    if argv and argv[0] in COMMANDS:
        module = importlib.import_module(COMMANDS[argv[0]][0])
        sub = _Parser(prog=f"cs336-systems {argv[0]}", description=COMMANDS[argv[0]][1])
        module.add_arguments(sub)
        args = sub.parse_args(argv[1:])
        try:
            # Every command's --device is checked here, before the command imports or allocates anything.
            if getattr(args, "device", None) is not None:
                from cs336_systems.devices import resolve_device

                resolve_device(args.device)
            return int(module.run(args) or 0)
        except ValueError as err:  # bad input: a clear message, not a traceback
            # library messages name their function ("train: ..."), which the prefix already names here
            print(f"cs336-systems {argv[0]}: error: {str(err).removeprefix(f'{argv[0]}: ')}", file=sys.stderr)
            return 2
        except OSError as err:
            # A path the user named that the file system refuses (a folder that cannot be created, no
            # permission, a full disk) is bad input too; an OSError that names no path is a bug: traceback.
            if err.filename is None:
                raise
            print(f"cs336-systems {argv[0]}: error: {err.filename}: {err.strerror or err}", file=sys.stderr)
            return 2
    parser.parse_args(argv)  # prints help / usage error
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
