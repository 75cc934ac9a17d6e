"""A/B of the Gluon kernels' TMA descriptors built on the host (``flash_triton._HOST_DESCRIPTORS``, the default)
against descriptors built in each program, through the public call, one process, same inputs.

    python scripts/device/host_desc_ab.py [--shapes xl_512 small_512 ...] [--rounds 7]

Per shape and mode (forward, forward+backward): the kernels' GPU time (``bench.flash.kernel_ms``) of both forms and of
cuDNN's SDPA, in interleaved rounds, and the host's wall time per call of both forms (what the host-bound rows of
``flash-bench`` time). O, dK and dV must match bit for bit (same arithmetic; dQ is summed by atomics, so its
difference is printed). Writes ``host_desc_ab.json`` under ``$OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from cs336_systems.attention import flash_triton as ft
from cs336_systems.bench.flash import MODEL_SHAPES, _calls, kernel_ms, shape_inputs

FORMS = {"device_desc": False, "host_desc": True}


def use(form: str) -> None:
    """Plan the next calls with ``form``'s descriptors (plans are per layout, so they are rebuilt)."""
    ft._HOST_DESCRIPTORS = FORMS[form]
    ft._PLANS.clear()


def grads(fns: dict, inputs: tuple) -> list[torch.Tensor]:
    q, k, v, _ = inputs
    for t in (q, k, v):
        t.grad = None
    fns["forward_backward"]()
    o = fns["forward"]()
    return [o.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()]


def host_us(fn, calls: int = 50) -> float:
    """Wall microseconds per call, the GPU synchronised once after ``calls`` calls (the host sets the pace of small
    calls)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def ab_shape(name: str, n_rounds: int, dev: torch.device) -> dict:
    s = MODEL_SHAPES[name]
    torch.manual_seed(0)
    inputs = shape_inputs(s, dev)
    ours, reset = _calls("triton", s, dev, False, "do", inputs)
    cudnn, _ = _calls("sdpa_cudnn", s, dev, False, "do", inputs)
    results = {}
    for form in FORMS:
        use(form)
        results[form] = grads(ours, inputs)
    diff = [float((a.float() - b.float()).abs().max()) for a, b in zip(results["device_desc"], results["host_desc"])]
    row = {"shape": name, "o_dk_dv_bitwise_equal": diff[0] == diff[2] == diff[3] == 0.0, "dq_max_abs_diff": diff[1]}
    rounds = {}
    for mode in ("forward", "forward_backward"):
        fns = {"device_desc": ours[mode], "host_desc": ours[mode], "cudnn": cudnn[mode]}
        for r in range(n_rounds):
            for key in list(fns)[r % 3:] + list(fns)[:r % 3]:
                if key in FORMS:
                    use(key)
                rounds.setdefault(f"{mode}_{key}_ms", []).append(kernel_ms(fns[key], dev, reset))
                if key in FORMS and s.seq_len <= 512:
                    rounds.setdefault(f"{mode}_{key}_host_us", []).append(host_us(fns[key]))
    row.update({k: statistics.median(v) for k, v in rounds.items()})
    for mode in ("forward", "forward_backward"):
        row[f"{mode}_host_over_device"] = row[f"{mode}_host_desc_ms"] / row[f"{mode}_device_desc_ms"]
        row[f"{mode}_device_over_cudnn"] = row[f"{mode}_device_desc_ms"] / row[f"{mode}_cudnn_ms"]
        row[f"{mode}_host_over_cudnn"] = row[f"{mode}_host_desc_ms"] / row[f"{mode}_cudnn_ms"]
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    use("host_desc")
    return {**row, "rounds": rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["xl_512", "small_512", "xl_2048", "lb2025", "noncausal_2k",
                                                   "d128_4k"])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    dev = torch.device("cuda")
    out = [ab_shape(name, args.rounds, dev) for name in args.shapes]
    with open(os.path.join(os.environ.get("OUT", "."), "host_desc_ab.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
