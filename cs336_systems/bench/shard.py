"""Memory and step time of optimizer-state sharding and FSDP against their PyTorch peers (handout
problems ``optimizer_state_sharding_accounting`` and ``fsdp_accounting``).

Variants (each built afresh on every rank, so its memory after construction is its own):
``none`` (plain model + AdamW: the single-GPU step), ``ddp`` (our bucketed DDP), ``torch-ddp`` (PyTorch
DDP), ``zero1`` (our DDP + ``ShardedOptimizer``), ``torch-zero`` (PyTorch DDP + ``ZeroRedundancyOptimizer``),
``fsdp`` (our FSDP), ``torch-fsdp2`` (``fully_shard`` per block and root); ``torch.optim.AdamW`` everywhere,
``foreach`` or ``fused`` (``optimizer``). ``compile`` compiles every Transformer block's forward before the
model is wrapped (regional compilation, as torchtitan does before FSDP2), so every wrapper's hooks stay
outside the compiled code and each variant and its PyTorch peer run the same compiled blocks.

Per variant: warm-up, timed steps synchronised only at their ends (``bench.harness``), then memory
steps synchronised between phases to read the allocator, then one profiled step. ``rounds`` repeats the
variant list and ``pair_with_none`` times each variant in pairs with a plain single-GPU model, so
host-speed drift cancels in the ratios. Memory counters are allocator values on GPUs and None on a CPU
(nothing to ask); ``*_net_gib`` subtract what was allocated when the variant started. Method and
history: docs/sharding.md ("Reproducing the measurements").
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_systems.bench import harness
from cs336_systems.bench.e2e import is_oom
from cs336_systems.bench.harness import median_ci95
from cs336_systems.configs import count_parameters, get_preset
from cs336_systems.parallel.process_group import DistInfo, run_distributed
from cs336_systems.parallel.strategies import WrapOptions, get_strategy
from cs336_systems.profiling.saved_tensors import saved_tensor_bytes
from cs336_systems.records.schema import ABS_MEMORY_KEYS, SHARD_PROBLEM, net_key

PROBLEM = SHARD_PROBLEM  # records of every variant (FSDP's too) live here
VARIANTS = ("none", "ddp", "torch-ddp", "zero1", "torch-zero", "fsdp", "torch-fsdp2")
PRECISIONS = ("fp32", "bf16")
OPTIMIZERS = ("foreach", "fused")  # torch.optim.AdamW's implementation in every variant
GIB = 2**30
LEFTOVER_WARN_GIB = 0.25  # more than this allocated (or retained) between variants is reported
TIMING = "ends-synced-aligned"  # the records' ``timing``: synchronised at a step's ends, ranks aligned before it
@dataclass(kw_only=True)
class ShardBenchConfig:
    preset: str = "xl"
    context_length: int = 512
    batch_size: int = 4  # per rank
    precision: str = "bf16"
    variants: tuple[str, ...] = VARIANTS
    world_size: int = 2
    warmup: int = 2
    steps: int = 5
    memory_steps: int = 2  # after the timed steps: synchronised per phase to read the memory counters
    rounds: int = 1  # the variant list runs this many times in turn; memory and profile in round 1 only
    pair_with_none: bool = False  # time every variant but none in pairs with a plain single-GPU partner
    profile: tuple[str, ...] = ("fsdp", "torch-fsdp2")
    profile_cpu: bool = False  # the profiled step records CPU activity too; every rank writes its trace
    trace_dir: str | None = None
    attention: str = "reference"
    device: str | None = None
    timeout_s: float = 900.0
    compile: bool = False  # torch.compile every Transformer block's forward (see the module docstring)
    optimizer: str = "foreach"  # OPTIMIZERS

    def __post_init__(self):
        get_preset(self.preset)
        if not isinstance(self.compile, bool):
            raise ValueError(f"shard-bench: compile must be a bool, got {self.compile!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"shard-bench: unknown optimizer {self.optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
        bad = [v for v in (*self.variants, *self.profile) if v not in VARIANTS]
        if bad:
            raise ValueError(f"shard-bench: unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"shard-bench: unknown precision {self.precision!r}; choose from {', '.join(PRECISIONS)}")
        harness.check_world_and_device("shard-bench", self.world_size, self.device, min_world=2)
        if self.warmup < 1 or self.steps < 2:
            raise ValueError(f"shard-bench: need warmup >= 1 and steps >= 2, got {self.warmup}, {self.steps}")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"shard-bench: need rounds >= 1 (an integer: how often the variant list runs), "
                             f"got {self.rounds!r}")
        if not isinstance(self.pair_with_none, bool):
            raise ValueError(f"shard-bench: pair_with_none must be a bool, got {self.pair_with_none!r}")
        if self.pair_with_none and not set(self.variants) - {"none"}:
            raise ValueError("shard-bench: pair_with_none is set but no variant other than 'none' is measured "
                             "(there is nothing to pair with the plain model)")
        if self.memory_steps < 1:
            raise ValueError(f"shard-bench: need memory_steps >= 1 (the memory counters come from those steps), "
                             f"got {self.memory_steps}")
        if self.profile_cpu and not self.trace_dir:
            raise ValueError("shard-bench: profile_cpu writes every rank's Chrome trace and needs trace_dir")
        if self.profile_cpu and not set(self.profile) & set(self.variants):
            raise ValueError(f"shard-bench: profile_cpu is set but none of the variants {list(self.variants)} is "
                             f"profiled (profile={list(self.profile)})")

    @property
    def device_type(self) -> str:
        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")


class _Memory:
    """CUDA allocator counters (GiB); None on a CPU, where there is no allocator to ask (not measured)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Collect garbage and hand cached blocks (and cuBLAS workspaces) back: what stays allocated
        after this is held by live tensors."""
        gc.collect()
        if self.cuda:
            self.sync()
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()
            self.sync()

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> float | None:
        return torch.cuda.memory_allocated(self.device) / GIB if self.cuda else None

    def peak(self) -> float | None:
        return torch.cuda.max_memory_allocated(self.device) / GIB if self.cuda else None


def _minus(a: float | None, b: float | None) -> float | None:
    """a - b, or None where either was not measured."""
    return None if a is None or b is None else a - b


# shard-bench variant -> parallel strategy (``ddp`` is the bucketed strategy at its default 25 MiB buckets)
VARIANT_STRATEGY = {"none": "none", "ddp": "bucketed", "torch-ddp": "torch-ddp", "zero1": "zero1",
                    "torch-zero": "torch-zero", "fsdp": "fsdp", "torch-fsdp2": "torch-fsdp2"}


def compile_blocks(model: torch.nn.Module) -> None:
    """Compile the forward of every Transformer block in place (module hooks, such as FSDP's gathers, stay eager
    around it; the parameters stay the same objects, so hooks on them are unaffected)."""
    from cs336_basics.model import TransformerBlock

    for block in model.modules():
        if isinstance(block, TransformerBlock):
            block.forward = torch.compile(block.forward)


def _build(cfg: ShardBenchConfig, variant: str, device: torch.device):
    """(step module, optimizer, finish(), model) for a variant, built by its parallel strategy."""
    model_cfg = get_preset(cfg.preset).replace(context_length=cfg.context_length)
    torch.manual_seed(0)
    model = BasicsTransformerLM(**model_cfg.model_kwargs(), attention_backend=cfg.attention, check_inputs=False,
                                device=device)
    if cfg.compile:
        compile_blocks(model)
    strategy = get_strategy(VARIANT_STRATEGY[variant])
    # Under bf16 the FSDP variants gather weights *and* reduce gradients in bf16 (FSDP2's default when
    # only param_dtype is set; half the traffic), as the recorded measurements were taken; zero1's BucketedDDP
    # leaves the casts to autocast, as its records were measured (no compute_dtype weight copies).
    dtype = torch.bfloat16 if cfg.precision == "bf16" else None
    wrapped = strategy.wrap(model, WrapOptions(compute_dtype=dtype if strategy.shards_gradients else None,
                                               reduce_dtype=dtype))
    opt = strategy.make_optimizer(model.parameters(), torch.optim.AdamW, lr=1e-5, weight_decay=0.1,
                                  **{cfg.optimizer: True})
    return wrapped, opt, wrapped.finish_gradient_synchronization, model


def _build_partner(cfg: ShardBenchConfig, device: torch.device):
    """The plain partner of ``pair_with_none``: built exactly as the ``none`` variant is (same seed, the
    pass-through ``LocalModule``, the same AdamW), so it steps as the single-GPU model does."""
    return _build(cfg, "none", device)


def _local_numel(t: torch.Tensor) -> int:
    return t.to_local().numel() if hasattr(t, "to_local") else t.numel()


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def _optimizer_state_tensors(opt) -> list[torch.Tensor]:
    local = getattr(opt, "local_optimizer", None) or getattr(opt, "optim", None) or opt
    return [v for st in local.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]


def _optimizer_state_bytes(opt) -> int:
    return sum(_local_bytes(v) for v in _optimizer_state_tensors(opt))


class _Residue:
    """Weak references to one variant's parameters and optimizer state, so the next variant can check
    that none of them outlived it (on any device)."""

    def __init__(self):
        self.variant: str | None = None
        self._refs: list[tuple[weakref.ref, int]] = []

    def track(self, variant: str, tensors) -> None:
        self.variant = variant
        self._refs = [(weakref.ref(t), _local_bytes(t)) for t in tensors]

    def alive_bytes(self) -> int:
        return sum(n for ref, n in self._refs if ref() is not None)


def _saved_activation_bytes(wrapped, x, autocast) -> int:
    """Bytes autograd saves for backward in one forward (distinct storages, parameters excluded)."""
    with autocast():
        return saved_tensor_bytes(wrapped, x, exclude=wrapped.parameters())


class _Step:
    """One training step of a built variant, run in the benchmark's two ways (``timed``, ``measured``)."""

    def __init__(self, wrapped, opt, finish, x: torch.Tensor, y: torch.Tensor, autocast, mem: _Memory):
        self.wrapped, self.opt, self.finish, self.x, self.y, self.autocast, self.mem = (
            wrapped, opt, finish, x, y, autocast, mem)

    def timed(self) -> tuple[float, float]:
        """(seconds, loss) of one step with a device synchronize at both ends and none inside, started on
        every rank at once (``harness.timed``)."""
        elapsed, loss = harness.timed(self._step, self.mem.device, sync=self.mem.sync)
        return elapsed, loss.item()  # after the synchronize: reading the loss waits for nothing

    def _step(self) -> torch.Tensor:
        self.wrapped.on_train_batch_start()
        with self.autocast():
            loss = cross_entropy(self.wrapped(self.x), self.y)
        loss.backward()
        self.finish()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def measured(self, record: dict | None = None) -> None:
        """One step synchronised between phases, with the allocator counters read into ``record``."""
        mem = self.mem
        self.wrapped.on_train_batch_start()
        mem.sync()
        mem.reset_peak()
        before_fwd = mem.allocated()
        with self.autocast():
            loss = cross_entropy(self.wrapped(self.x), self.y)
        mem.sync()
        after_fwd = mem.allocated()
        loss.backward()
        self.finish()
        mem.sync()
        pre_alloc, pre_peak = mem.allocated(), mem.peak()
        mem.reset_peak()
        self.opt.step()
        mem.sync()
        post_alloc, post_peak = mem.allocated(), mem.peak()
        self.opt.zero_grad(set_to_none=True)
        mem.sync()
        if record is not None:
            record.update(forward_saved_gib=_minus(after_fwd, before_fwd),
                          pre_step_alloc_gib=pre_alloc, pre_step_peak_gib=pre_peak,
                          post_step_alloc_gib=post_alloc, post_step_peak_gib=post_peak)


def _bench_variant(info: DistInfo, cfg: ShardBenchConfig, variant: str, residue: _Residue | None = None,
                   round_index: int = 0) -> dict:
    """One build and run of ``variant``. In round 0 all of it; in later rounds (``round_index`` > 0) only
    the warmup and timed steps (no memory counters, memory steps, tensor breakdown or profile)."""
    first = round_index == 0
    device = info.device
    mem = _Memory(device)
    residue = residue if residue is not None else _Residue()
    mem.release()
    mem.reset_peak()
    start = mem.allocated()
    # leftover = start - what should be resident between variants, which is nothing of ours: 0.
    row: dict = {"variant": variant, "start_alloc_gib": start, "leftover_gib": start,
                 "retained_prev_gib": residue.alive_bytes() / GIB}
    if max(row["leftover_gib"] or 0.0, row["retained_prev_gib"]) > LEFTOVER_WARN_GIB:
        where = f"rank {info.rank}" + ("" if first else f", round {round_index + 1}")
        allocated = "n/a" if start is None else f"{start:.2f}"
        row["leftover_warning"] = (
            f"shard-bench {where}: {allocated} GiB allocated and "
            f"{row['retained_prev_gib']:.2f} GiB of {residue.variant!r}'s parameters/optimizer state still alive "
            f"before {variant!r} starts; its absolute memory counters include that (see the *_net_gib values)")
        print(f"WARNING: {row['leftover_warning']}", file=sys.stderr, flush=True)
    wrapped = opt = model = finish = None
    partner = partner_step = None  # the plain partner (pair_with_none) while it exists
    stage = ""  # names the partner in an out-of-memory error raised while it exists
    try:
        wrapped, opt, finish, model = _build(cfg, variant, device)
        mem.sync()
        if first:
            row.update(init_alloc_gib=mem.allocated(), init_peak_gib=mem.peak())
        model_cfg = get_preset(cfg.preset)
        g = torch.Generator().manual_seed(1000 + info.rank)
        x, y = (torch.randint(0, model_cfg.vocab_size, (cfg.batch_size, cfg.context_length), generator=g).to(device)
                for _ in range(2))
        autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if cfg.precision == "bf16" \
            else contextlib.nullcontext
        step = _Step(wrapped, opt, finish, x, y, autocast, mem)
        for _ in range(cfg.warmup):
            step.timed()
        if cfg.pair_with_none and variant != "none":
            stage = "building the plain partner (pair_with_none)"
            partner = _build_partner(cfg, device)
            partner_step = _Step(*partner[:3], x, y, autocast, mem)
            stage = "warming up the plain partner (pair_with_none)"
            for _ in range(cfg.warmup):
                partner_step.timed()
            stage = "paired steps (the variant and its plain partner, pair_with_none, both resident)"
            timed, partner_timed = [], []
            for _ in range(cfg.steps):  # a step of the variant, then one of the plain model: same conditions
                timed.append(step.timed())
                partner_timed.append(partner_step.timed())
            stage = ""
            row["pair_partner_step_s"] = [t for t, _ in partner_timed]
            row["pair_partner_losses"] = [loss for _, loss in partner_timed]
            partner_left = _Residue()
            partner_left.track("pair partner", [*partner[3].parameters(), *_optimizer_state_tensors(partner[1])])
            partner = partner_step = None  # gone before the memory steps: no counter may see it
            mem.release()
            row["pair_partner_retained_gib"] = partner_left.alive_bytes() / GIB
            if row["pair_partner_retained_gib"] > LEFTOVER_WARN_GIB:
                warning = (f"shard-bench rank {info.rank}" + ("" if first else f", round {round_index + 1}")
                           + f": {row['pair_partner_retained_gib']:.2f} GiB of the plain partner's parameters/"
                           f"optimizer state still alive after it was dropped; {variant!r}'s memory counters "
                           "include that")
                row["leftover_warning"] = "; ".join(w for w in (row.get("leftover_warning"), warning) if w)
                print(f"WARNING: {warning}", file=sys.stderr, flush=True)
        else:
            timed = [step.timed() for _ in range(cfg.steps)]
        row["step_s"] = [t for t, _ in timed]
        row["losses"] = [loss for _, loss in timed]  # same init and data in every variant: a cross-check
        if first:  # memory steps, tensor breakdown and profile: round 1 only
            samples: list[dict] = [{} for _ in range(cfg.memory_steps)]
            for sample in samples:
                step.measured(sample)
            for key in samples[0]:
                row[key] = _largest(s[key] for s in samples)
            # What this rank holds, from the tensors themselves (bytes -> GiB).
            params = list(model.parameters())
            row.update(
                local_param_numel=sum(_local_numel(p) for p in params),
                params_gib=sum(_local_bytes(p) for p in params) / GIB,
                grads_gib=sum(_local_bytes(p) for p in params if p.requires_grad) / GIB,  # fp32 grads, param-shaped
                optimizer_state_gib=_optimizer_state_bytes(opt) / GIB,
            )
            if variant == "none":
                row["saved_activations_gib"] = _saved_activation_bytes(wrapped, x, autocast) / GIB
            if variant in cfg.profile:
                trace = Path(cfg.trace_dir) / f"shard_trace_{variant}_{cfg.precision}_rank{info.rank}.json.gz" \
                    if cfg.trace_dir and (info.rank == 0 or cfg.profile_cpu) else None
                row.update(harness.profile_comm(step.measured, device, cpu_activity=cfg.profile_cpu,
                                                trace_path=trace, keep_timeline=True))
                if trace is not None:
                    row["trace_file"] = trace.name
        row["status"] = "ok"
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        message = str(err).splitlines()[0][:200]
        row.update(status="OOM", error=f"{stage}: {message}" if stage else message)
    finally:
        if partner is not None:
            partner[0].close()
        partner = partner_step = None
        if model is not None:
            residue.track(variant, [*model.parameters(), *(_optimizer_state_tensors(opt) if opt is not None else [])])
        if wrapped is not None:
            wrapped.close()
        # Drop every reference (``finish`` is a bound method of ``wrapped``) before the next variant.
        wrapped = opt = model = finish = None
        mem.release()
    for key in ABS_MEMORY_KEYS:
        if key in row:
            row[net_key(key)] = _minus(row[key], start)
    # A rank that ran out of memory must not leave the others waiting in a collective.
    statuses: list = [None] * info.world_size
    dist.all_gather_object(statuses, row["status"])
    if "OOM" in statuses and row["status"] == "ok":
        row.update(status="OOM", error="another rank ran out of memory")
    return row


def shard_bench_worker(info: DistInfo, cfg: ShardBenchConfig) -> list[dict]:
    """One dict per entry of ``cfg.variants``: round 1's run, with the timed steps of later rounds appended
    to ``step_s`` and listed per round in ``round_step_s``. Every rank skips the same runs (the status is
    agreed on by all ranks in ``_bench_variant``), so no rank waits alone in a collective."""
    residue = _Residue()
    merged: list[dict | None] = [None] * len(cfg.variants)
    bar = tqdm(total=cfg.rounds * len(cfg.variants), desc="shard-bench", unit="run", disable=info.rank != 0)
    for r in range(cfg.rounds):
        for i, variant in enumerate(cfg.variants):
            bar.set_postfix_str(f"round {r + 1}/{cfg.rounds} {variant}")
            prev = merged[i]
            if prev is not None and prev["status"] != "ok":  # out of memory before: not tried again
                bar.update()
                continue
            run = _bench_variant(info, cfg, variant, residue, round_index=r)
            bar.update()
            if prev is None:
                run["round_step_s"] = [run["step_s"]] if run["status"] == "ok" else []
                for key in ("leftover_gib", "retained_prev_gib"):
                    run[f"round_{key}"] = [run[key]]
                merged[i] = run
                continue
            for key in ("leftover_gib", "retained_prev_gib"):
                prev[f"round_{key}"].append(run[key])
            if run.get("leftover_warning"):
                prev["leftover_warning"] = "; ".join(w for w in (prev.get("leftover_warning"),
                                                                 run["leftover_warning"]) if w)
            if run["status"] != "ok":
                prev.update(status="OOM", error=f"round {r + 1}: {run['error']}")
                continue
            prev["step_s"] = prev["step_s"] + run["step_s"]
            prev["round_step_s"].append(run["step_s"])
            if "pair_partner_step_s" in run:  # pairs pooled over rounds, in the order of step_s
                prev["pair_partner_step_s"] = prev["pair_partner_step_s"] + run["pair_partner_step_s"]
                prev["pair_partner_retained_gib"] = max(prev["pair_partner_retained_gib"],
                                                        run["pair_partner_retained_gib"])
    bar.close()
    return merged


def summarize(cfg: ShardBenchConfig, per_rank: list[list[dict]], backend: str) -> list[dict]:
    """One record per variant: slowest-rank step time, per-rank memory (the largest rank's), breakdown."""
    model_cfg = get_preset(cfg.preset).replace(context_length=cfg.context_length)
    base = {k: v for k, v in asdict(cfg).items() if k not in ("variants", "profile", "trace_dir", "timeout_s")}
    rows = []
    for results in zip(*per_rank):
        r0 = results[0]
        row = {**base, "backend": backend, "variant": r0["variant"], "status": r0["status"],
               "n_params": count_parameters(model_cfg), "timing": TIMING}
        for key in ("start_alloc_gib", "leftover_gib", "retained_prev_gib"):
            row[key] = _largest(r[key] for r in results)
            row[f"{key}_per_rank"] = [r[key] for r in results]
        for key in ("round_leftover_gib", "round_retained_prev_gib"):  # per round, the largest rank's
            if key in r0:
                row[key] = [_largest(vals) for vals in zip(*(r[key] for r in results))]
        warnings = [r["leftover_warning"] for r in results if r.get("leftover_warning")]
        if warnings:
            row["leftover_warning"] = "; ".join(warnings)
        if any(r["status"] != "ok" for r in results):
            row.update(status="OOM", error=next(r.get("error") for r in results if r["status"] != "ok"))
            rows.append(row)
            continue
        # Slowest rank per step, then pooled over every round's steps (and the median of each round).
        step = [max(ts) for ts in zip(*(r["step_s"] for r in results))]
        per_round = [r.get("round_step_s") or [r["step_s"]] for r in results]  # [rank][round][step]
        round_ms = [statistics.median(max(ts) for ts in zip(*(rank[k] for rank in per_round))) * 1e3
                    for k in range(len(per_round[0]))]
        row.update(step_ms=statistics.median(step) * 1e3, step_std_ms=statistics.stdev(step) * 1e3,
                   step_min_ms=min(step) * 1e3, round_step_ms=round_ms, losses_rank0=r0["losses"])
        if "pair_partner_step_s" in r0:  # pair i: slowest rank's step i of the variant / partner's mean over ranks
            partner = [statistics.fmean(ts) for ts in zip(*(r["pair_partner_step_s"] for r in results))]
            ratios = [v / p for v, p in zip(step, partner, strict=True)]
            row.update(pair_ratios=ratios, pair_ratio=statistics.median(ratios),
                       pair_ratio_ci95=list(median_ci95(ratios)), partner_step_ms=statistics.median(partner) * 1e3,
                       pair_partner_losses_rank0=r0["pair_partner_losses"])
        for key in r0:
            if (key.endswith("_gib") or key in ("local_param_numel",)) and key not in row:
                row[key] = _largest(r[key] for r in results)
                row[f"{key}_per_rank"] = [r[key] for r in results]
        for key in ("comm_kernel_ms", "compute_kernel_ms", "comm_hidden_ms", "allgather_kernel_ms",
                    "allgather_kernels", "comm_kernels", "compute_idle_ms", "timeline", "trace_file"):
            if key in r0:
                row[key] = r0[key]
        rows.append(row)
    acts = next((r.get("saved_activations_gib") for r in rows if r.get("saved_activations_gib")), None)
    for row in rows:
        if row["status"] == "ok" and acts is not None:
            row["saved_activations_gib"] = acts  # same forward for every variant
    _add_ratios_to_none(rows)
    return rows


def _largest(values) -> float | None:
    """The largest rank's value, or None where a rank did not measure it (a CPU has no allocator)."""
    values = list(values)
    return None if any(v is None for v in values) else max(values)


def _add_ratios_to_none(rows: list[dict]) -> None:
    """Step time of every measured variant other than ``none`` relative to ``none`` (the first ``none``
    record with status ok): of the pooled medians, per round, and the median of the per-round ratios."""
    none = next((r for r in rows if r["variant"] == "none" and r["status"] == "ok"), None)
    if none is None:
        return
    for row in rows:
        if row["variant"] == "none" or row["status"] != "ok":
            continue
        per_round = [v / n for v, n in zip(row["round_step_ms"], none["round_step_ms"], strict=True)]
        row.update(ratio_to_none=row["step_ms"] / none["step_ms"], round_ratio_to_none=per_round,
                   ratio_to_none_round_median=statistics.median(per_round))


def run_shard_bench(cfg: ShardBenchConfig) -> list[dict] | None:
    """Under torchrun (one group of ``cfg.world_size``) or spawned local processes; rows on rank 0."""
    per_rank = run_distributed(shard_bench_worker, cfg.world_size, (cfg,), device_type=cfg.device_type,
                               timeout_s=cfg.timeout_s)
    if per_rank is None:
        return None
    return summarize(cfg, per_rank, "nccl" if cfg.device_type == "cuda" else "gloo")
