"""The adapters' attention class at this commit against an earlier commit's, on the host-bound rows (issue 18).

At each shape, interleaved round by round in one process on the same inputs: ``FlashAttention2Triton`` as committed
here ("new"; "merged": with ``flash_triton._MERGED_GRADS``) and as of ``--base`` ("old", its ``flash_triton.py``
from git, loaded beside this one with its custom ops renamed), against SDPA's cuDNN and flash backends pinned once.
Per round, ``do_bench``'s median forward+backward and forward alone (L2 flushed before each call, as
``flash-bench``); then the kernels' GPU time and the host's time to issue a do_bench iteration, and each round's ratio
to the fastest peer of the same round (the host drifts between rounds). Last, what a few ways of allocating a call's
outputs cost this host.

    python scripts/device/flash_host_ab.py --base 0ec142f [--shapes xl_512 small_512 floor] [--rounds 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
from flash_dobench_gap import issue_us  # this script's folder is on sys.path when it runs

from cs336_systems.attention import flash_triton as ft
from cs336_systems.bench.flash import MODEL_SHAPES, _calls, kernel_ms, pinned, shape_inputs

PEERS = ("sdpa_cudnn", "sdpa_flash")


def load_base(rev: str, folder: str):
    """``flash_triton`` as of ``rev``, importable beside the committed one (a file of its own, since Triton reads
    its kernels' source; the custom ops and the backend renamed so that neither registration collides)."""
    src = subprocess.run(["git", "show", f"{rev}:cs336_systems/attention/flash_triton.py"], check=True,
                         capture_output=True, text=True).stdout
    src = src.replace('"cs336_systems::flash_', '"cs336_base::flash_').replace(
        '@register_attention_backend("flash_triton")', '@register_attention_backend("flash_triton_base")')
    path = Path(folder) / "flash_triton_base.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("flash_triton_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["flash_triton_base"] = module
    spec.loader.exec_module(module)
    return module


def calls_of(cls, shape, dev, inputs):
    """forward and forward+backward of ``cls.apply`` as ``bench.flash._calls`` makes them."""
    q, k, v, do = inputs

    def fwd():
        return cls.apply(q, k, v, shape.causal)

    def fwd_bwd():
        cls.apply(q, k, v, shape.causal).backward(do)

    return {"forward": fwd, "forward_backward": fwd_bwd}, [q, k, v]


def merged(way: str) -> None:
    """The committed planner with its gradients merged (way "merged") or not, its cached plans dropped on a change."""
    if (way == "merged") != ft._MERGED_GRADS:
        ft._MERGED_GRADS = way == "merged"
        ft._PLANS.clear()


def allocation_costs(dev: torch.device, calls: int = 2000) -> None:
    """Host microseconds a call of a few ways to get (4, 25, 512, 64) bf16 outputs (median of 5 rounds)."""
    like = torch.empty(4, 25, 512, 64, device=dev, dtype=torch.bfloat16)
    shape, rows = tuple(like.shape), tuple(like.shape[:-1])
    strides = (rows[1] * rows[2], rows[2], 1)
    ways = {
        "new_empty(Size) x1": lambda: like.new_empty(like.shape),
        "empty_like x1": lambda: torch.empty_like(like),
        "new_empty(tuple) fp32 x1": lambda: like.new_empty(rows, dtype=torch.float32),
        "empty_strided fp32 x1": lambda: torch.empty_strided(rows, strides, dtype=torch.float32, device=dev),
        "new_empty(Size) x3": lambda: (like.new_empty(like.shape), like.new_empty(like.shape),
                                       like.new_empty(like.shape)),
        "empty_like x3": lambda: (torch.empty_like(like), torch.empty_like(like), torch.empty_like(like)),
        "one (3, ...) new_empty + unbind": lambda: like.new_empty((3, *shape)).unbind(0),
    }
    for name, way in ways.items():
        rounds = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                way()
            rounds.append((time.perf_counter() - t0) / calls * 1e6)
        print(f"  {name:34s} {statistics.median(rounds):7.2f} us", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the earlier commit to compare with")
    p.add_argument("--shapes", nargs="*", default=["xl_512", "small_512", "floor"])
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    dev = torch.device("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)
    with tempfile.TemporaryDirectory() as folder:
        base = load_base(args.base, folder)
        print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}; "
              f"new = this checkout, old = {args.base}")
        ways = ("new", "merged", "old", *PEERS)  # merged: new with dQ, dK, dV as views of one allocation
        for name in args.shapes:
            s = MODEL_SHAPES[name]
            inputs = shape_inputs(s, dev)
            calls = {"new": calls_of(ft.FlashAttention2Triton, s, dev, inputs),
                     "merged": calls_of(ft.FlashAttention2Triton, s, dev, inputs),
                     "old": calls_of(base.FlashAttention2Triton, s, dev, inputs)}
            for peer in PEERS:
                calls[peer] = _calls(peer, s, dev, False, "do", inputs)
            bench = {(w, m): [] for w in ways for m in ("forward", "forward_backward")}
            for _ in range(args.rounds):
                for mode in ("forward_backward", "forward"):
                    for way in ways:
                        c, grads = calls[way]
                        fn = c[mode]
                        merged(way)
                        with pinned(fn):
                            fn()
                            torch.cuda.synchronize()
                            bench[way, mode].append(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                                            grad_to_none=grads) * 1e3)
            for mode in ("forward_backward", "forward"):
                print(f"{name} {mode}: do_bench us, median of {args.rounds} rounds (min-max); median of the rounds' "
                      "ratios to the round's fastest peer")
                best = [min(bench[peer, mode][r] for peer in PEERS) for r in range(args.rounds)]
                for way in ways:
                    b = bench[way, mode]
                    paired = statistics.median(x / y for x, y in zip(b, best, strict=True))
                    print(f"  {way:11s} {statistics.median(b):8.1f} ({min(b):7.1f}-{max(b):7.1f})  paired "
                          f"{paired:6.3f}", flush=True)
            print(f"{name}: kernels us, issue us (median, p90) of forward+backward")
            for way in ways:
                c, grads = calls[way]
                fn = c["forward_backward"]
                merged(way)
                with pinned(fn):
                    kern = kernel_ms(fn, dev, grads) * 1e3
                    med, p90 = issue_us(fn, grads, flush)
                print(f"  {way:11s} {kern:8.1f} {med:8.1f} {p90:8.1f}", flush=True)
    print("host cost of outputs, us a call:")
    allocation_costs(dev)


if __name__ == "__main__":
    main()
