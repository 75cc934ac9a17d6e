"""The sharding report sections read shard-bench records as recorded: net memory counters, and step ratios
from pairs when the records carry them (else from rounds)."""

from __future__ import annotations

import statistics

import pytest

from cs336_systems.records.schema import ABS_MEMORY_KEYS, net_key
from cs336_systems.report.sections.sharding import _ratio, clean_memory


def _run_with_leftover(leftover: float) -> list[dict]:
    """Rows whose every variant after 'none' carries ``leftover`` (as the earliest runs did)."""
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


def test_report_uses_net_values_of_new_records():
    rows = [{**r, "start_alloc_gib": 0.125, "retained_prev_gib": 0.0,
             **{net_key(k): r[k] - 0.125 for k in ABS_MEMORY_KEYS}} for r in _run_with_leftover(0.125)]
    rows[0] = {**rows[0], **{net_key(k): rows[0][k] for k in ABS_MEMORY_KEYS}, "start_alloc_gib": 0.0}
    clean, _ = clean_memory(rows)
    assert [c["pre_step_peak_gib"] for c in clean] == [9.5, 9.5, 7.0, 8.0, 5.0, 4.75]


def test_report_ratio_prefers_pairs():
    rows = {v: {"variant": v, "step_ms": ms, "round_step_ms": rounds} for v, ms, rounds in
            (("none", 300.0, [300.0, 330.0]), ("ddp", 360.0, [360.0, 390.0]), ("zero1", 390.0, [400.0, 400.0]),
             ("fsdp", 345.0, [330.0, 360.0]))}
    # Without pairs: the median of the per-round ratios.
    ratio, how = _ratio(rows["fsdp"], rows["none"])
    assert ratio == pytest.approx(statistics.median([1.1, 360.0 / 330.0])) and "rounds" in how
    pairs = {"ddp": [1.2, 1.25, 1.3], "zero1": [1.25, 1.3, 1.4], "fsdp": [1.05, 1.1, 1.2]}
    for v, ratios in pairs.items():
        rows[v].update(pair_ratios=ratios, pair_ratio=statistics.median(ratios), pair_ratio_ci95=[ratios[0],
                                                                                                  ratios[-1]])
    ratio, how = _ratio(rows["fsdp"], rows["none"])
    assert ratio == 1.1 and "3 pairs" in how and "plain single-GPU model" in how and "[1.050, 1.200]" in how
    ratio, how = _ratio(rows["zero1"], rows["ddp"])
    assert ratio == pytest.approx(1.3 / 1.25) and "ratio of the two paired ratios" in how
    del rows["ddp"]["pair_ratio"]  # only one side paired: back to the rounds
    ratio, how = _ratio(rows["zero1"], rows["ddp"])
    assert ratio == pytest.approx(statistics.median([400.0 / 360.0, 400.0 / 390.0])) and "rounds" in how


def test_compiled_peers_get_their_own_table_and_targets():
    from cs336_systems.report.sections.sharding import _compiled_peers, _latest_run

    class Ctx:
        def __init__(self):
            self.rows = []

        def versus(self, *args):
            self.rows.append(args)

    prov = {"device": "NVIDIA H200", "date": "2026-12-01T00:00:00Z"}
    steps = {"none": 100.0, "ddp": 104.0, "torch-ddp": 106.0, "zero1": 103.0, "torch-zero": 101.0, "fsdp": 110.0,
             "torch-fsdp2": 112.0}
    run = [{"variant": v, "status": "ok", "step_ms": ms, "provenance": prov, "compile": True, "optimizer": "fused",
            "preset": "xl", "context_length": 512, "precision": "bf16", "world_size": 2} for v, ms in steps.items()]
    ctx = Ctx()
    text = "\n".join(_compiled_peers(ctx, run))
    assert "context 512" in text and "| torch-fsdp2 |" in text
    verdicts = {what.split(" (")[0]: (ratio, goal) for _, what, _, _, ratio, goal in ctx.rows}
    assert verdicts["ddp vs torch-ddp, compiled blocks, fused AdamW"] == (pytest.approx(104 / 106), "<= 1.00x (met)")
    assert verdicts["zero1 vs torch-zero, compiled blocks, fused AdamW"][1] == "<= 1.00x (NOT met)"
    best = verdicts["best of ours"]
    assert best[0] == pytest.approx(1.03) and best[1] == "<= 1.05x (met)"
    assert _latest_run(run, "bf16", 2) == []  # never the accounting tables' run
