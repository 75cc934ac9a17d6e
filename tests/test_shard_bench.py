"""shard-bench bookkeeping (CPU): nothing of one variant may outlive it and inflate the next one's
memory counters, and the report's correction of records taken before that was fixed.

The bug these guard against: ``_saved_activation_bytes`` returned the tensor itself from its pack
hook, which for saved outputs makes a reference cycle through C++ (node -> saved variable -> tensor
-> grad_fn) that ``gc`` cannot collect; the graph kept the activations and, through its
AccumulateGrad nodes, the parameters of ``none`` alive for the rest of the run (31.6 GiB on xl).
"""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch

import cs336_systems.bench.shard as sh
from cs336_basics.model import BasicsTransformerLM
from cs336_systems.configs import get_preset
from cs336_systems.parallel.ddp import LocalModule
from cs336_systems.parallel.process_group import spawn
from cs336_systems.report.sections.sharding import clean_memory, derive_leftover

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


def _worker(info, cfg, leaky):
    if leaky:
        sh._saved_activation_bytes = _leaky_activation_bytes
    return sh.shard_bench_worker(info, cfg)


@pytest.mark.parametrize("leaky", [False, True], ids=["fixed", "leaky-hook"])
def test_no_variant_outlives_itself(leaky):
    """End to end on 2 gloo ranks: with the fixed hook nothing of 'none' is alive when 'ddp' and
    'zero1' start; with the old hook the tracker sees 'none's parameters (so the check can fail)."""
    cfg = sh.ShardBenchConfig(**CFG, variants=("none", "ddp", "zero1"), precision="bf16")
    per_rank = spawn(_worker, 2, (cfg, leaky), timeout_s=120)
    rows = sh.summarize(cfg, per_rank, "gloo")
    assert [r["status"] for r in rows] == ["ok"] * 3
    after_none = rows[1]["retained_prev_gib"]
    if leaky:
        assert after_none > 0
    else:
        assert all(r["retained_prev_gib"] == 0.0 for r in rows), [r["retained_prev_gib"] for r in rows]
        assert not any("leftover_warning" in r for r in rows)
    for r in rows:  # the net twins exist and are raw - start (all zeros on CPU, but the keys are the contract)
        for key in sh.ABS_MEMORY_KEYS:
            assert r[sh.net_key(key)] == pytest.approx(r[key] - r["start_alloc_gib"], abs=1e-12)


def _legacy_run(leftover: float) -> list[dict]:
    """Rows as the old benchmark wrote them: every variant after 'none' carries ``leftover``."""
    prov = {"device": "NVIDIA H200", "date": "d"}
    base = {"none": (1.25, 9.5), "ddp": (1.25, 9.5), "zero1": (1.25, 7.0), "torch-zero": (2.0, 8.0),
            "fsdp": (0.75, 5.0), "torch-fsdp2": (0.5, 4.75)}
    rows = []
    for i, (v, (init, peak)) in enumerate(base.items()):
        extra = leftover if i > 0 else 0.0
        rows.append({"variant": v, "status": "ok", "provenance": prov, "params_gib": 0.5, "grads_gib": 0.5,
                     "saved_activations_gib": 0.25, "init_alloc_gib": init + extra, "init_peak_gib": init + extra,
                     "pre_step_alloc_gib": peak - 1 + extra, "pre_step_peak_gib": peak + extra,
                     "post_step_alloc_gib": peak - 1 + extra, "post_step_peak_gib": peak - 0.5 + extra})
    return rows


def test_report_derives_and_subtracts_the_legacy_leftover():
    raw = _legacy_run(3.375)
    assert derive_leftover(raw) == (3.375, {"ddp": 3.375, "zero1": 3.375})
    clean, corrected, note = clean_memory(raw)
    assert corrected and "3.375 GiB" in note
    assert clean[0]["init_alloc_gib"] == raw[0]["init_alloc_gib"]  # 'none' ran first: nothing to subtract
    for r, c in zip(raw[1:], clean[1:]):
        for key in sh.ABS_MEMORY_KEYS:
            assert c[key] == pytest.approx(r[key] - 3.375)
    assert clean[3]["init_alloc_gib"] == pytest.approx(2.0)  # torch-zero: its own buckets remain


def test_report_without_none_cannot_derive():
    raw = [r for r in _legacy_run(3.0) if r["variant"] != "none"]
    clean, corrected, note = clean_memory(raw)
    assert not corrected and clean == raw and "cannot be derived" in note


def test_report_uses_net_values_of_new_records():
    rows = [{**r, "start_alloc_gib": 0.125, "retained_prev_gib": 0.0,
             **{sh.net_key(k): r[k] - 0.125 for k in sh.ABS_MEMORY_KEYS}} for r in _legacy_run(0.125)]
    rows[0] = {**rows[0], **{sh.net_key(k): rows[0][k] for k in sh.ABS_MEMORY_KEYS}, "start_alloc_gib": 0.0}
    clean, corrected, _ = clean_memory(rows)
    assert not corrected
    assert [c["pre_step_peak_gib"] for c in clean] == [9.5, 9.5, 7.0, 8.0, 5.0, 4.75]
