"""shard-bench bookkeeping (CPU): nothing of one variant may outlive it and inflate the next one's
memory counters; the timed steps
synchronise only at their ends, the memory steps between phases; ``rounds`` (the variant list run
several times in turn: pooled step times, per-round medians and ratios to ``none``, memory and profile
in round 1 only, OOM not retried); the CLI end to end (records, traces).

The bug these guard against: ``_saved_activation_bytes`` returned the tensor itself from its pack
hook, which for saved outputs makes a reference cycle through C++ (node -> saved variable -> tensor
-> grad_fn) that ``gc`` cannot collect; the graph kept the activations and, through its
AccumulateGrad nodes, the parameters of ``none`` alive for the rest of the run (31.6 GiB on xl).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import math
import statistics
import weakref

import pytest
import torch

import cs336_systems.bench.shard as sh
from cs336_basics.model import BasicsTransformerLM
from cs336_systems.commands import shard_bench
from cs336_systems.configs import get_preset
from cs336_systems.parallel.ddp import LocalModule
from cs336_systems.parallel.process_group import spawn

CFG = dict(preset="tiny", context_length=19, batch_size=3, warmup=1, steps=2, profile=(), device="cpu",
           world_size=2, timeout_s=120.0)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_count_frees_its_graph(precision):
    torch.manual_seed(0)
    cfg = get_preset("tiny").replace(context_length=19)
    model = BasicsTransformerLM(**cfg.model_kwargs(), check_inputs=False)
    x = torch.randint(0, cfg.vocab_size, (3, 19))
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext
    refs = [weakref.ref(p) for p in model.parameters()]
    counts = [sh._saved_activation_bytes(LocalModule(model), x, autocast) for _ in range(2)]
    assert counts[0] > 0 and counts[0] == counts[1]
    del model
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive == 0, f"{alive}/{len(refs)} parameters kept alive by the activation-counting forward's graph"


def test_residue_counts_what_is_still_alive():
    res = sh._Residue()
    assert res.alive_bytes() == 0
    a, b = torch.zeros(10), torch.zeros(3, dtype=torch.float64)
    res.track("x", [a, b])
    assert res.variant == "x" and res.alive_bytes() == 10 * 4 + 3 * 8
    del a
    gc.collect()
    assert res.alive_bytes() == 3 * 8


def _leaky_activation_bytes(wrapped, x, autocast):
    """The pre-fix pack hook (returns the tensor itself): leaks the graph."""
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), autocast():
        out = wrapped(x)
    del out
    return 1


def _counter(calls: dict):
    """``counted(name)``: ``sh._Step.<name>`` wrapped to count its calls in ``calls[name]``."""

    def counted(name):
        method = getattr(sh._Step, name)

        def wrapper(self, *a, **k):
            calls[name] += 1
            return method(self, *a, **k)
        return wrapper
    return counted


def _worker(info, cfg, leaky):
    if leaky:
        sh._saved_activation_bytes = _leaky_activation_bytes
    calls = {"timed": 0, "measured": 0}

    counted = _counter(calls)

    sh._Step.timed, sh._Step.measured = counted("timed"), counted("measured")  # this spawned process only
    return sh.shard_bench_worker(info, cfg), calls


@pytest.mark.parametrize("leaky", [False, True], ids=["fixed", "leaky-hook"])
def test_no_variant_outlives_itself(leaky):
    """End to end on 2 gloo ranks: with the fixed hook nothing of 'none' is alive when 'ddp' and
    'zero1' start; with the old hook the tracker sees 'none's parameters (so the check can fail)."""
    cfg = sh.ShardBenchConfig(**CFG, variants=("none", "ddp", "zero1"), precision="bf16", memory_steps=3)
    out = spawn(_worker, 2, (cfg, leaky), timeout_s=120)
    rows = sh.summarize(cfg, [rank_rows for rank_rows, _ in out], "gloo")
    assert [r["status"] for r in rows] == ["ok"] * 3
    for _, calls in out:  # per variant: warmup + steps timed steps, then memory_steps memory steps
        assert calls == {"timed": 3 * (cfg.warmup + cfg.steps), "measured": 3 * cfg.memory_steps}, calls
    for r in rows:
        assert r["timing"] == "ends-synced-aligned" and r["memory_steps"] == 3 and len(r["losses_rank0"]) == cfg.steps
        assert r["rounds"] == 1 and len(r["round_step_ms"]) == 1
    for r in rows[1:]:  # one round: the pooled ratio is the round's ratio
        assert r["ratio_to_none"] == pytest.approx(r["step_ms"] / rows[0]["step_ms"])
        assert r["round_ratio_to_none"] == pytest.approx([r["ratio_to_none"]])
        assert r["ratio_to_none_round_median"] == pytest.approx(r["ratio_to_none"])
    after_none = rows[1]["retained_prev_gib"]
    if leaky:
        assert after_none > 0
    else:
        assert all(r["retained_prev_gib"] == 0.0 for r in rows), [r["retained_prev_gib"] for r in rows]
        assert not any("leftover_warning" in r for r in rows)
    for r in rows:  # the counters and their net twins exist; a CPU has no allocator: not measured (None), never 0
        for key in sh.ABS_MEMORY_KEYS:
            assert r[key] is None and r[sh.net_key(key)] is None and r["start_alloc_gib"] is None


class _LoggingMemory(sh._Memory):
    """A CPU ``_Memory`` that logs every synchronize and counter access (the calls a CUDA run makes)."""

    def __init__(self, log: list[str]):
        super().__init__(torch.device("cpu"))
        self.log = log

    def sync(self):
        self.log.append("sync")

    def reset_peak(self):
        self.log.append("reset_peak")

    def allocated(self):
        self.log.append("allocated")
        return 0.0

    def peak(self):
        self.log.append("peak")
        return 0.0


class _LoggingModel(torch.nn.Module):
    def __init__(self, log: list[str]):
        super().__init__()
        self.log = log
        self.emb = torch.nn.Embedding(7, 5)

    def on_train_batch_start(self):
        self.log.append("start")

    def forward(self, x):
        self.log.append("forward")
        out = self.emb(x)
        out.register_hook(lambda g: self.log.append("backward"))
        return out


class _LoggingOptimizer:
    def __init__(self, log: list[str], params):
        self.log, self.inner = log, torch.optim.SGD(params, lr=0.1)

    def step(self):
        self.log.append("opt_step")
        self.inner.step()

    def zero_grad(self, set_to_none=True):
        self.log.append("zero_grad")
        self.inner.zero_grad(set_to_none=set_to_none)


def _logging_step():
    log: list[str] = []
    model = _LoggingModel(log)
    x, y = torch.randint(0, 7, (2, 3)), torch.randint(0, 5, (2, 3))
    step = sh._Step(model, _LoggingOptimizer(log, model.parameters()), lambda: log.append("finish"), x, y,
                    contextlib.nullcontext, _LoggingMemory(log))
    return step, log


def test_timed_step_synchronises_only_at_its_ends():
    step, log = _logging_step()
    with torch.no_grad():  # the loss the step must report: before its update (fp32, same ops: tight)
        want = torch.nn.functional.cross_entropy(step.wrapped.emb(step.x).reshape(-1, 5), step.y.reshape(-1))
    seconds, loss = step.timed()
    assert log == ["sync", "start", "forward", "backward", "finish", "opt_step", "zero_grad", "sync"]
    assert seconds > 0 and loss == pytest.approx(want.item(), rel=1e-5)


def test_memory_step_synchronises_between_phases():
    step, log = _logging_step()
    record: dict = {}
    step.measured(record)
    phases = [e for e in log if e in ("forward", "backward", "finish", "opt_step", "zero_grad")]
    assert phases == ["forward", "backward", "finish", "opt_step", "zero_grad"]
    for before, after in (("forward", "backward"), ("finish", "opt_step"), ("opt_step", "zero_grad")):
        between = log[log.index(before) + 1:log.index(after)]
        assert "sync" in between and "allocated" in between, (before, after, between)
    assert log[-1] == "sync"
    assert set(record) == {"forward_saved_gib", "pre_step_alloc_gib", "pre_step_peak_gib", "post_step_alloc_gib",
                           "post_step_peak_gib"}


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    shard_bench.add_arguments(parser)
    return parser.parse_args(["--preset", "tiny", "--context-length", "19", "--batch-size", "3", "--warmup", "1",
                              "--steps", "2", "--device", "cpu", "--world-size", "2", "--timeout-s", "120",
                              "--no-save", *argv])


@pytest.mark.parametrize("argv, match", [
    (("--memory-steps", "0"), "memory_steps"),
    (("--rounds", "0"), "rounds"),
    (("--profile-cpu",), "trace_dir"),
    (("--profile-cpu", "--trace-dir", "x", "--variants", "none", "--profile", "fsdp"), "profiled"),
])
def test_cli_rejects_bad_settings(argv, match):
    with pytest.raises(ValueError, match=match):
        shard_bench.run(_cli(*argv))


def test_cli_profile_cpu_writes_a_trace_per_rank(tmp_path, monkeypatch):
    """The command end to end on 2 gloo ranks: records carry the timing method and sane memory keys;
    ``--profile-cpu`` makes every rank write its Chrome trace."""
    rows_seen: list[list[dict]] = []
    monkeypatch.setattr(shard_bench, "run_shard_bench", lambda cfg: rows_seen.append(sh.run_shard_bench(cfg))
                        or rows_seen[-1])
    args = _cli("--variants", "fsdp", "--profile", "fsdp", "--profile-cpu", "--trace-dir", str(tmp_path),
                "--memory-steps", "1", "--precision", "fp32")
    assert shard_bench.run(args) == 0
    ((fsdp,),) = rows_seen
    assert fsdp["status"] == "ok" and fsdp["variant"] == "fsdp"
    assert fsdp["timing"] == "ends-synced-aligned" and fsdp["memory_steps"] == 1 and fsdp["profile_cpu"] is True
    assert fsdp["step_ms"] > 0 and fsdp["step_min_ms"] <= fsdp["step_ms"] and len(fsdp["losses_rank0"]) == 2
    assert fsdp["losses_rank0"][0] == pytest.approx(math.log(512), rel=0.1)  # fresh init, tiny's vocab of 512
    # CPU: no allocator, so the counters were not measured: None (n/a in the table), never 0; every key and its
    # net twin stays in the record.
    assert fsdp["forward_saved_gib"] is None
    for key in sh.ABS_MEMORY_KEYS:
        assert fsdp[key] is None and fsdp[sh.net_key(key)] is None and fsdp[f"{key}_per_rank"] == [None, None]
    # Each rank holds about half of the fp32 weights; AdamW keeps two moments per parameter it steps.
    full_gib = fsdp["n_params"] * 4 / 2**30
    assert 0.45 * full_gib < fsdp["params_gib"] < 0.6 * full_gib
    assert fsdp["grads_gib"] == pytest.approx(fsdp["params_gib"])
    assert fsdp["optimizer_state_gib"] == pytest.approx(2 * fsdp["params_gib"])
    assert fsdp["comm_kernels"] > 0 and "timeline" in fsdp
    for rank in (0, 1):
        path = tmp_path / f"shard_trace_fsdp_fp32_rank{rank}.json.gz"
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        assert any(e.get("cat") == "cpu_op" for e in events), path
    assert fsdp["trace_file"] == "shard_trace_fsdp_fp32_rank0.json.gz"


def test_config_rejects_bad_rounds():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rounds"):
            sh.ShardBenchConfig(**CFG, rounds=bad)
    assert sh.ShardBenchConfig(**CFG).rounds == 1


def _rank_result(variant: str, rounds: list[list[float]]) -> dict:
    """What ``shard_bench_worker`` returns for one variant on one rank (only the keys summarize reads)."""
    return {"variant": variant, "status": "ok", "start_alloc_gib": 0.0, "leftover_gib": 0.0, "retained_prev_gib": 0.0,
            "round_leftover_gib": [0.0] * len(rounds), "round_retained_prev_gib": [0.0] * len(rounds),
            "step_s": [t for r in rounds for t in r], "round_step_s": rounds, "losses": [1.0] * len(rounds[0])}


def test_summarize_pools_rounds_and_ratios_per_round():
    """Host speed doubles between round 1 and 2 for every variant; fsdp is 1.2x none in round 1 and 1.1x
    in round 2. Per step the slowest rank counts (rank 1 has the slow steps of 'none' in round 1)."""
    none = [_rank_result("none", [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]),
            _rank_result("none", [[0.5, 1.5, 1.25], [1.0, 1.0, 2.0]])]  # slowest per step: [1, 1.5, 1.25], [2, 2, 2]
    fsdp = [_rank_result("fsdp", [[1.5, 1.5, 1.5], [2.2, 2.2, 2.2]]),
            _rank_result("fsdp", [[1.5, 1.5, 1.5], [2.2, 2.2, 2.2]])]
    cfg = sh.ShardBenchConfig(**CFG, variants=("none", "fsdp"), rounds=2)
    rows = sh.summarize(cfg, [[none[0], fsdp[0]], [none[1], fsdp[1]]], "gloo")
    n, f = rows
    assert n["rounds"] == f["rounds"] == 2
    assert n["round_step_ms"] == pytest.approx([1250.0, 2000.0])
    assert f["round_step_ms"] == pytest.approx([1500.0, 2200.0])
    assert n["step_ms"] == pytest.approx(1750.0)  # median of [1, 1.5, 1.25, 2, 2, 2] s
    assert n["step_min_ms"] == pytest.approx(1000.0)
    assert f["step_ms"] == pytest.approx(1850.0)
    assert not any(k in n for k in ("ratio_to_none", "round_ratio_to_none", "ratio_to_none_round_median"))
    assert f["ratio_to_none"] == pytest.approx(1850.0 / 1750.0)
    assert f["round_ratio_to_none"] == pytest.approx([1.2, 1.1])
    assert f["ratio_to_none_round_median"] == pytest.approx(1.15)


def _rounds_worker(info, cfg, oom_at):
    """``shard_bench_worker`` with call counters, and an injected OOM at the build of
    (variant, round) for each entry of ``oom_at`` (on every rank, as a real OOM is agreed on)."""
    calls = {"timed": 0, "measured": 0, "build": {}}

    counted = _counter(calls)

    build = sh._build

    def failing_build(cfg, variant, device):
        calls["build"][variant] = calls["build"].get(variant, 0) + 1
        if (variant, calls["build"][variant]) in oom_at:
            raise torch.OutOfMemoryError(f"injected: {variant} out of memory")
        return build(cfg, variant, device)

    sh._Step.timed, sh._Step.measured = counted("timed"), counted("measured")  # this spawned process only
    sh._build = failing_build
    return sh.shard_bench_worker(info, cfg), calls


def test_rounds_pool_steps_measure_memory_once_and_skip_oom():
    """2 gloo ranks, 2 rounds of none, ddp, zero1, fsdp: zero1 runs out of memory in round 1 (not built
    again), ddp in round 2 (its record is OOM and names the round); none and fsdp get both rounds' steps,
    round 1's memory counters only, and fsdp its ratios to none."""
    cfg = sh.ShardBenchConfig(**CFG, variants=("none", "ddp", "zero1", "fsdp"), precision="bf16", memory_steps=2,
                              rounds=2)
    out = spawn(_rounds_worker, 2, (cfg, {("zero1", 1), ("ddp", 2)}), timeout_s=120)
    per_rank = [rank_rows for rank_rows, _ in out]
    for _, calls in out:
        assert calls["build"] == {"none": 2, "ddp": 2, "zero1": 1, "fsdp": 2}, calls
        # timed: none and fsdp twice, ddp once (round 1); memory steps: round 1 of none, ddp, fsdp only
        assert calls["timed"] == 5 * (cfg.warmup + cfg.steps) and calls["measured"] == 3 * cfg.memory_steps, calls
    for rank_rows in per_rank:
        none, ddp, zero1, fsdp = rank_rows
        for r in (none, fsdp):
            assert len(r["round_step_s"]) == 2 and all(len(ts) == cfg.steps for ts in r["round_step_s"])
            assert r["step_s"] == r["round_step_s"][0] + r["round_step_s"][1]
            assert len(r["losses"]) == cfg.steps and len(r["round_leftover_gib"]) == 2
        assert len(ddp["round_leftover_gib"]) == 2 and len(zero1["round_leftover_gib"]) == 1
    rows = sh.summarize(cfg, per_rank, "gloo")
    none, ddp, zero1, fsdp = rows
    assert [r["status"] for r in rows] == ["ok", "OOM", "OOM", "ok"]
    assert ddp["error"].startswith("round 2: injected") and zero1["error"].startswith("injected")
    for r in rows:
        assert r["rounds"] == 2 and r["timing"] == "ends-synced-aligned"
    for r in (ddp, zero1, none):
        assert not any(k in r for k in ("ratio_to_none", "round_ratio_to_none", "ratio_to_none_round_median"))
    for r in (none, fsdp):
        assert len(r["round_step_ms"]) == 2 and len(r["losses_rank0"]) == cfg.steps
        slowest = [max(ts) for ts in zip(*(rank[rows.index(r)]["step_s"] for rank in per_rank))]
        assert len(slowest) == 2 * cfg.steps and r["step_ms"] == pytest.approx(statistics.median(slowest) * 1e3)
        for k, ms in enumerate(r["round_step_ms"]):
            assert ms == pytest.approx(statistics.median(slowest[k * cfg.steps:(k + 1) * cfg.steps]) * 1e3)
        for key in (*sh.ABS_MEMORY_KEYS, *map(sh.net_key, sh.ABS_MEMORY_KEYS), "forward_saved_gib", "params_gib",
                    "grads_gib", "optimizer_state_gib", "saved_activations_gib"):
            assert key in r, key
        assert r["round_retained_prev_gib"] == [0.0, 0.0] and "leftover_warning" not in r
    assert fsdp["ratio_to_none"] == pytest.approx(fsdp["step_ms"] / none["step_ms"])
    assert fsdp["round_ratio_to_none"] == pytest.approx([f / n for f, n in zip(fsdp["round_step_ms"],
                                                                                none["round_step_ms"])])
    assert fsdp["ratio_to_none_round_median"] == pytest.approx(statistics.median(fsdp["round_ratio_to_none"]))
    # each rank holds about half of the fp32 weights under fsdp (round 1's breakdown)
    assert 0.45 * none["params_gib"] < fsdp["params_gib"] < 0.6 * none["params_gib"]


# -- pair_with_none: every variant but none timed in pairs with a plain single-GPU partner -----------------------

def _pair_worker(info, cfg):
    """``shard_bench_worker`` logging, in order: builds, releases, the plain partner's build, timed steps of the
    variant ('V') and of the partner ('P'), memory steps ('M'). zero1's partner runs out of memory (injected);
    fsdp's first partner is kept alive on purpose (a leak the retained check must see)."""
    log: list[str] = []
    leaked: list = []
    build, build_partner, release = sh._build, sh._build_partner, sh._Memory.release
    timed, measured = sh._Step.timed, sh._Step.measured

    def logged_build(cfg, variant, device):
        log.append(f"build:{variant}")
        return build(cfg, variant, device)

    def logged_build_partner(cfg, device):
        current = next(e for e in reversed(log) if e.startswith("build:")).removeprefix("build:")
        log.append("partner")
        if current == "zero1":
            raise torch.OutOfMemoryError("injected: partner out of memory")
        partner = build_partner(cfg, device)
        partner[0]._is_partner = True
        if current == "fsdp" and not leaked:
            leaked.append(partner)
        return partner

    def logged_timed(self):
        log.append("P" if getattr(self.wrapped, "_is_partner", False) else "V")
        return timed(self)

    def logged_measured(self, *a, **k):
        log.append("M")
        return measured(self, *a, **k)

    def logged_release(self):
        log.append("release")
        return release(self)

    sh._build, sh._build_partner, sh._Memory.release = logged_build, logged_build_partner, logged_release
    sh._Step.timed, sh._Step.measured = logged_timed, logged_measured  # this spawned process only
    return sh.shard_bench_worker(info, cfg), log


def _expected_pair_log(cfg) -> list[str]:
    """What one rank must do: per run, build, warm up, (paired) timed steps, partner dropped (a release) before
    the memory steps (round 1 only), a release before and after every run; zero1 stops at its partner's OOM."""
    w, s, m = cfg.warmup, cfg.steps, cfg.memory_steps
    out: list[str] = []
    for r in range(cfg.rounds):
        for variant in cfg.variants:
            if variant == "zero1" and r > 0:  # out of memory in round 1: not run again
                continue
            out += ["release", f"build:{variant}", *["V"] * w]
            if variant == "zero1":
                out += ["partner", "release"]
                continue
            if variant == "none":
                out += ["V"] * s
            else:
                out += ["partner", "build:none", *["P"] * w, *["V", "P"] * s, "release"]
            out += ["M"] * (m if r == 0 else 0) + ["release"]
    return out


def test_pair_with_none_pairs_steps_and_keeps_the_partner_out_of_memory_counters():
    """2 gloo ranks, 2 rounds of none, ddp, zero1, fsdp with pair_with_none: the call order puts the partner
    after the variant's warmup and drops it before the memory steps; ddp and fsdp get one pair ratio per timed
    step (pooled over rounds) computed from the slowest rank of each side; the partner is the plain model
    (its losses are none's); zero1's partner OOM makes zero1's record OOM, naming the partner."""
    cfg = sh.ShardBenchConfig(**{**CFG, "steps": 3}, variants=("none", "ddp", "zero1", "fsdp"), precision="bf16",
                              memory_steps=2, rounds=2, pair_with_none=True)
    out = spawn(_pair_worker, 2, (cfg,), timeout_s=120)
    for _, log in out:
        assert log == _expected_pair_log(cfg), log
    per_rank = [rank_rows for rank_rows, _ in out]
    rows = sh.summarize(cfg, per_rank, "gloo")
    none, ddp, zero1, fsdp = rows
    assert [r["status"] for r in rows] == ["ok", "ok", "OOM", "ok"]
    assert zero1["error"] == "building the plain partner (pair_with_none): injected: partner out of memory"
    assert all(r["pair_with_none"] is True for r in rows)
    assert not any(k in none for k in ("pair_ratios", "pair_ratio", "pair_ratio_ci95", "partner_step_ms"))
    for r in (ddp, fsdp):
        i = rows.index(r)
        variant = [max(ts) for ts in zip(*(rank[i]["step_s"] for rank in per_rank))]
        partner = [statistics.fmean(ts) for ts in zip(*(rank[i]["pair_partner_step_s"] for rank in per_rank))]
        assert len(r["pair_ratios"]) == len(partner) == cfg.rounds * cfg.steps
        assert r["pair_ratios"] == pytest.approx([v / p for v, p in zip(variant, partner)])
        assert r["pair_ratio"] == statistics.median(r["pair_ratios"])
        lo, hi = r["pair_ratio_ci95"]
        assert lo <= r["pair_ratio"] <= hi
        assert r["partner_step_ms"] == pytest.approx(statistics.median(partner) * 1e3)
        assert r["ratio_to_none"] == pytest.approx(r["step_ms"] / none["step_ms"])  # unpaired ratios stay
        # The partner is built and fed as 'none' is: same init, data, warmup count, so the same losses (fp32
        # master weights, same CPU kernels in the same order: equal up to rounding at most).
        assert r["pair_partner_losses_rank0"] == pytest.approx(none["losses_rank0"], rel=1e-6)
        for key in (*sh.ABS_MEMORY_KEYS, *map(sh.net_key, sh.ABS_MEMORY_KEYS), "forward_saved_gib",
                    "params_gib", "grads_gib", "optimizer_state_gib", "pair_partner_retained_gib"):
            assert key in r, key
    # Nothing of ddp's partner outlived it; fsdp's leaked partner is seen: its fp32 weights + two AdamW moments.
    assert ddp["pair_partner_retained_gib"] == 0.0
    assert fsdp["pair_partner_retained_gib"] == pytest.approx(3 * none["params_gib"])


def test_summarize_pairs_slowest_rank_per_step_pooled_over_rounds():
    """Pair i = slowest rank's variant step i / the ranks' mean partner step i, rounds pooled in order."""
    def result(variant, rounds, partner=None):
        r = _rank_result(variant, rounds)
        if partner is not None:
            r.update(pair_partner_step_s=partner, pair_partner_losses=[1.0] * len(rounds[0]),
                     pair_partner_retained_gib=0.0)
        return r

    none = [result("none", [[1.0, 1.0], [1.0, 1.0]])] * 2
    fsdp = [result("fsdp", [[1.5, 1.5], [2.2, 2.2]], [1.0, 1.5, 2.0, 2.0]),
            result("fsdp", [[1.2, 1.8], [2.2, 2.0]], [1.25, 1.0, 1.0, 2.2])]
    # variant, slowest rank: [1.5, 1.8, 2.2, 2.2]; partner, mean of the ranks: [1.125, 1.25, 1.5, 2.1]
    cfg = sh.ShardBenchConfig(**CFG, variants=("none", "fsdp"), rounds=2, pair_with_none=True)
    n, f = sh.summarize(cfg, [[none[0], fsdp[0]], [none[1], fsdp[1]]], "gloo")
    ratios = [1.5 / 1.125, 1.8 / 1.25, 2.2 / 1.5, 2.2 / 2.1]
    assert f["pair_ratios"] == pytest.approx(ratios)
    assert f["pair_ratio"] == pytest.approx((ratios[0] + ratios[1]) / 2)
    assert f["partner_step_ms"] == pytest.approx(1375.0)
    lo, hi = f["pair_ratio_ci95"]
    assert min(ratios) <= lo <= f["pair_ratio"] <= hi <= max(ratios)
    assert "pair_ratio" not in n and f["pair_with_none"] is True


def test_pair_with_none_settings():
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="pair_with_none"):
            sh.ShardBenchConfig(**CFG, pair_with_none=bad)
    with pytest.raises(ValueError, match="pair_with_none"):
        sh.ShardBenchConfig(**CFG, variants=("none",), pair_with_none=True)
    assert sh.ShardBenchConfig(**CFG).pair_with_none is False
    assert sh.ShardBenchConfig(**CFG, variants=("fsdp",), pair_with_none=True).pair_with_none  # none not needed


def test_cli_passes_pair_with_none(monkeypatch):
    seen = []
    monkeypatch.setattr(shard_bench, "run_shard_bench", lambda cfg: seen.append(cfg))  # None: as on rank > 0
    assert shard_bench.run(_cli("--variants", "none", "fsdp", "--pair-with-none")) == 0
    assert shard_bench.run(_cli("--variants", "none", "fsdp")) == 0
    assert [c.pair_with_none for c in seen] == [True, False]


def _plain_worker(info, cfg):
    return sh.shard_bench_worker(info, cfg)


@pytest.mark.slow
def test_compiled_blocks_and_fused_adamw_train_as_eager():
    """Every wrapper and its PyTorch peer with compiled blocks and fused AdamW (issue 22's configuration) on 2 gloo
    ranks: the same losses as eager foreach AdamW, step for step (fp32; the second loss is after one update)."""
    variants = ("ddp", "torch-ddp", "zero1", "torch-zero", "fsdp", "torch-fsdp2")
    rows = {}
    for compiled in (False, True):
        cfg = sh.ShardBenchConfig(**CFG, variants=variants, precision="fp32", memory_steps=1, compile=compiled,
                                  optimizer="fused" if compiled else "foreach")
        rows[compiled] = sh.summarize(cfg, spawn(_plain_worker, 2, (cfg,), timeout_s=300), "gloo")
    for eager, compiled in zip(rows[False], rows[True], strict=True):
        assert compiled["status"] == "ok" and compiled["compile"] and compiled["optimizer"] == "fused"
        assert compiled["retained_prev_gib"] == 0.0  # compiled blocks do not keep the previous variant alive
        assert compiled["losses_rank0"] == pytest.approx(eager["losses_rank0"], rel=1e-4), compiled["variant"]


def test_cli_passes_compile_and_optimizer(monkeypatch):
    seen = []
    monkeypatch.setattr(shard_bench, "run_shard_bench", lambda cfg: seen.append(cfg))
    assert shard_bench.run(_cli("--compile", "--optimizer", "fused")) == 0
    assert shard_bench.run(_cli()) == 0
    assert [(c.compile, c.optimizer) for c in seen] == [(True, "fused"), (False, "foreach")]
    with pytest.raises(ValueError, match="unknown optimizer"):
        sh.ShardBenchConfig(**CFG, optimizer="adam8bit")
