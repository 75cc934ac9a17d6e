"""Host (CPU/Python) cost of the FSDP wrappers per training step, measured without a GPU.

The eager bf16 ``xl`` step on the H200s is host-bound, so every millisecond a wrapper spends in Python
per step lands on the step time. This script runs a model with the xl *structure* (48
``TransformerBlock``s: 50 FSDP units, 338 sharded weights) but tiny widths (d_model 32, 4 heads,
d_ff 64, vocab 256, context 16, batch 1): the tensor work is a few microseconds per op, so a step's
time is host time, and a wrapper's extra time over the plain model is its host overhead (hooks,
autograd bookkeeping, the issue of collectives).

A step is what ``shard-bench`` times: ``on_train_batch_start()``, forward (under ``torch.autocast`` to
bf16 for the bf16 variants) + cross-entropy, backward, ``finish_gradient_synchronization()``,
``torch.optim.AdamW(foreach=True).step()``, ``zero_grad(set_to_none=True)``. Variants (``--variants``):

* ``plain-fp32`` / ``plain-bf16``: the model alone (no wrapper, no communication);
* ``fsdp-fp32`` / ``fsdp-bf16``: our FSDP as ``parallel.STRATEGIES["fsdp"]`` builds it for shard-bench
  (bf16: ``compute_dtype=reduce_dtype=torch.bfloat16``);
* ``fsdp2-fp32`` / ``fsdp2-bf16``: torch's FSDP2 (``strategies.TorchFSDP2``), for reference;
* ``other-fp32`` / ``other-bf16`` (with ``--other-fsdp PATH``): the ``FSDP`` of another version of
  ``fsdp.py``, built the same way, so that old and new code run in the same processes.

Backends (``--backend``):

* ``gloo`` (default): 2 processes on a free port (``run_distributed``). gloo's collectives are slow on
  the host (a TCP round trip, work handed to gloo's threads): on 2 shared cores they dominate the wall
  time, which says little about NCCL. ``cpu_ms``, the main thread's CPU time (``time.thread_time``),
  leaves out the waiting but still contains gloo's cost of issuing ~150 collectives.
* ``fake``: one process as rank 0 of 2 in torch's fake process group (``FakeStore``; every collective
  returns at once and moves nothing, so the gathered weights are garbage, which costs the tiny tensors
  nothing). What is left is the wrapper's own host work: the number to compare with NCCL's host cost.

All variants live in the same process(es) and are stepped in turn (one step of each per round, the
ranks aligned by a barrier before every step), so a drift of the host speed hits them alike. Per step
the slowest rank's time counts (``step_ms``: median over rounds); ``extra_ms`` / ``ratio`` compare with
the plain model of the same precision. ``--profile VARIANT`` also runs cProfile over a few steps of
that variant on rank 0 and prints the functions with the largest own and cumulative time.

    .venv/bin/python scripts/fsdp_host_overhead.py --backend fake                    # the table
    .venv/bin/python scripts/fsdp_host_overhead.py --backend fake --profile fsdp-bf16  # + where it goes
    .venv/bin/python scripts/fsdp_host_overhead.py --rounds 30                        # 2 gloo ranks
    git show REV:cs336_systems/parallel/fsdp.py > /tmp/fsdp_rev.py                   # before / after
    .venv/bin/python scripts/fsdp_host_overhead.py --backend fake --other-fsdp /tmp/fsdp_rev.py

Numbers depend on the machine (and on the other load on it): compare variants of one run, not runs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.util
import io
import pstats
import statistics
import sys
import time
import timeit
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_systems.parallel.process_group import run_distributed
from cs336_systems.parallel.strategies import WrapOptions, get_strategy

VARIANTS = ("plain-fp32", "plain-bf16", "fsdp-fp32", "fsdp-bf16", "fsdp2-fp32", "fsdp2-bf16", "other-fp32",
            "other-bf16")
DEFAULT_VARIANTS = VARIANTS[:6]
STRATEGY = {"plain": "none", "fsdp": "fsdp", "fsdp2": "torch-fsdp2"}
MODEL = dict(vocab_size=256, context_length=16, d_model=32, num_layers=48, num_heads=4, d_ff=64)
BATCH = 1


def _load_other_fsdp(path: str):
    """The module of another version of fsdp.py (e.g. ``git show REV:cs336_systems/parallel/fsdp.py``)."""
    spec = importlib.util.spec_from_file_location("_other_fsdp", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _build(variant: str, other_fsdp: str | None):
    kind, precision = variant.split("-")
    dtype = torch.bfloat16 if precision == "bf16" else None
    torch.manual_seed(0)
    model = BasicsTransformerLM(**MODEL, check_inputs=False)
    if kind == "other":  # as strategies._fsdp builds ours
        wrapped = _load_other_fsdp(other_fsdp).FSDP(model, compute_dtype=dtype, reduce_dtype=dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1, foreach=True)
    else:
        strategy = get_strategy(STRATEGY[kind])
        wrapped = strategy.wrap(model, WrapOptions(compute_dtype=dtype, reduce_dtype=dtype))  # as shard-bench does
        opt = strategy.make_optimizer(model.parameters(), torch.optim.AdamW, lr=1e-5, weight_decay=0.1,
                                      foreach=True)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype else contextlib.nullcontext
    return wrapped, opt, autocast


def _step(wrapped, opt, autocast, x, y) -> None:
    wrapped.on_train_batch_start()
    with autocast():
        loss = cross_entropy(wrapped(x), y)
    loss.backward()
    wrapped.finish_gradient_synchronization()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _worker(info, variants: list[str], rounds: int, warmup: int, profile: str | None, profile_steps: int,
            profile_lines: int, other_fsdp: str | None):
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add scheduling; 2 ranks share the cores
    g = torch.Generator().manual_seed(1000 + info.rank)
    x, y = (torch.randint(0, MODEL["vocab_size"], (BATCH, MODEL["context_length"]), generator=g) for _ in range(2))
    built = {v: _build(v, other_fsdp) for v in variants}
    for v in variants:
        for _ in range(warmup):
            _step(*built[v], x, y)
    times: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            dist.barrier()
            t0, c0 = timeit.default_timer(), time.thread_time()
            _step(*built[v], x, y)
            cpu[v].append(time.thread_time() - c0)
            times[v].append(timeit.default_timer() - t0)
    report = None
    if profile is not None:
        prof = cProfile.Profile()
        for _ in range(profile_steps):
            dist.barrier()
            if info.rank == 0:
                prof.enable()
            _step(*built[profile], x, y)
            if info.rank == 0:
                prof.disable()
        if info.rank == 0:
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf)
            stats.sort_stats("tottime").print_stats(profile_lines)
            stats.sort_stats("cumulative").print_stats(profile_lines)
            report = f"cProfile of {profile_steps} steps of {profile} (rank 0):\n{buf.getvalue()}"
    for wrapped, _, _ in built.values():
        if hasattr(wrapped, "close"):
            wrapped.close()
    return dict(times=times, cpu=cpu, profile=report)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=None, choices=VARIANTS,
                   help=f"default: {' '.join(DEFAULT_VARIANTS)} (+ other-fp32 other-bf16 with --other-fsdp)")
    p.add_argument("--other-fsdp", default=None, metavar="PATH",
                   help="another version of fsdp.py, run as the variants other-fp32 / other-bf16 in the same "
                        "processes (before/after comparisons without the drift between runs)")
    p.add_argument("--backend", choices=("gloo", "fake"), default="gloo",
                   help="gloo: 2 processes; fake: 1 process, torch's fake process group (collectives are no-ops)")
    p.add_argument("--rounds", type=int, default=30, help="timed steps per variant (one of each per round)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", choices=VARIANTS, default=None, help="cProfile this variant on rank 0")
    p.add_argument("--profile-steps", type=int, default=10)
    p.add_argument("--profile-lines", type=int, default=30)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0 or args.profile_steps < 1:
        raise ValueError("fsdp_host_overhead: --rounds and --profile-steps must be >= 1, --warmup >= 0")
    if args.variants is None:
        args.variants = list(DEFAULT_VARIANTS) + (["other-fp32", "other-bf16"] if args.other_fsdp else [])
    variants = list(dict.fromkeys(args.variants + ([args.profile] if args.profile else [])))
    if any(v.startswith("other-") for v in variants) and not args.other_fsdp:
        raise ValueError("fsdp_host_overhead: the other-* variants need --other-fsdp PATH")
    other = str(Path(args.other_fsdp).resolve()) if args.other_fsdp else None
    if other is not None and not Path(other).is_file():
        raise ValueError(f"fsdp_host_overhead: --other-fsdp {args.other_fsdp!r} is not a file")
    worker_args = (variants, args.rounds, args.warmup, args.profile, args.profile_steps, args.profile_lines, other)
    if args.backend == "gloo":
        results = run_distributed(_worker, 2, worker_args, backend="gloo", device_type="cpu")
        if results is None:  # a non-zero rank under torchrun
            return 0
    else:  # one process as rank 0 of 2; every collective returns at once without moving data
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
        try:
            results = [_worker(SimpleNamespace(rank=0, world_size=2), *worker_args)]
        finally:
            dist.destroy_process_group()
    import pandas as pd

    rows = []
    for v in variants:
        slowest = [max(r["times"][v][i] for r in results) * 1e3 for i in range(args.rounds)]
        cpu = [r["cpu"][v][i] * 1e3 for r in results for i in range(args.rounds)]
        rows.append(dict(variant=v, step_ms=statistics.median(slowest), min_ms=min(slowest),
                         p90_ms=sorted(slowest)[int(0.9 * (len(slowest) - 1))], cpu_ms=statistics.median(cpu)))
    df = pd.DataFrame(rows).set_index("variant")
    for v in variants:
        base = f"plain-{v.split('-')[1]}"
        if base in df.index and v != base:
            df.loc[v, "extra_ms"] = df.loc[v, "step_ms"] - df.loc[base, "step_ms"]
            df.loc[v, "ratio"] = df.loc[v, "step_ms"] / df.loc[base, "step_ms"]
            df.loc[v, "extra_cpu_ms"] = df.loc[v, "cpu_ms"] - df.loc[base, "cpu_ms"]
    where = "2 gloo ranks" if args.backend == "gloo" else "fake process group (2 ranks, 1 process)"
    print(f"{where}, xl structure ({MODEL}, batch {BATCH}), {args.rounds} rounds; step_ms: slowest rank per "
          "step, median over rounds; cpu_ms: the main thread's CPU time per step, median over ranks and rounds")
    print(df.to_markdown(floatfmt=".2f"))
    if results[0]["profile"]:
        print(results[0]["profile"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
