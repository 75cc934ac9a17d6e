"""The adapters' attention class at this commit against an earlier commit's, on the host-bound rows (issue 18).

At each shape, interleaved round by round in one process on the same inputs: ``FlashAttention2Triton`` as committed
here ("new") and as of ``--base`` ("old", its ``flash_triton.py`` from git, loaded beside this one with its custom
ops renamed), against SDPA's cuDNN and flash backends pinned once.
Per round, ``do_bench``'s median forward+backward and forward alone (L2 flushed before each call, as
``flash-bench``); then the kernels' GPU time and the host's time to issue a do_bench iteration, and each round's ratio
to the fastest peer of the same round (the host drifts between rounds). Last, what a few ways of allocating a call's
outputs cost this host. ``--stubbed``: the same ways with every launch stubbed out, the host's dispatch alone, beside
a bare Function with the same allocations (on the CPU too, where no kernel could run). ``--bare``: that bare
Function in the do_bench rounds too, where it launches nothing: its time is the floor of any ``autograd.Function``
with these outputs on this host, against which the peers' whole calls are read.

    python scripts/device/flash_host_ab.py --base 0ec142f [--shapes xl_512 small_512 floor] [--rounds 9]
    python scripts/device/flash_host_ab.py --base 0ec142f --stubbed --device cpu
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
from flash_dobench_gap import issue_us, print_host_us  # this script's folder is on sys.path when it runs

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


@functools.cache
def _strides(shape: tuple) -> tuple:
    return torch.empty(shape, device="meta").stride()


class _Bare(torch.autograd.Function):
    """The interface's floor with our outputs: O and L, then dQ, dK and dV allocated as the new path does, no
    planning and no launch."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        o = torch.empty_like(q)
        rows = tuple(q.shape[:-1])
        lse = torch.empty_strided(rows, _strides(rows), dtype=torch.float32, device=q.device)
        ctx.save_for_backward(lse, q, k, v, o)
        return o

    @staticmethod
    def backward(ctx, do):
        _, q, k, v, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


def stubbed(base, dev: torch.device, shapes: list[str], rounds: int, calls: int = 2000) -> None:
    """Host microseconds of forward+backward and of the forward alone with every launch stubbed out (the dispatch
    alone: Python, the autograd engine, the allocations), ways interleaved round by round; median (min-max)."""
    for module in (ft, base):
        module._Launch.__call__ = lambda self, grid, pointers, scalars: None
        module._check_runnable = lambda t: None
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ways = {"new": ft.FlashAttention2Triton.apply, "old": base.FlashAttention2Triton.apply, "bare": _Bare.apply}
    for name in shapes:
        s = MODEL_SHAPES[name]
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        q, k, v = (torch.randn(s.batch, s.heads, s.seq_len, s.head_dim, device=dev, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        do = torch.randn_like(q)
        times = {(w, m): [] for w in ways for m in ("forward_backward", "forward")}
        for _ in range(rounds):
            for way, fn in ways.items():
                fn(q, k, v, s.causal).backward(do)  # plans the layout outside the timing
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    q.grad = k.grad = v.grad = None
                    fn(q, k, v, s.causal).backward(do)
                sync()
                times[way, "forward_backward"].append((time.perf_counter() - t0) / calls * 1e6)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(q, k, v, s.causal)
                sync()
                times[way, "forward"].append((time.perf_counter() - t0) / calls * 1e6)
        print(f"{name} ({dev.type}, launches stubbed): host us a call, median (min-max) of {rounds} rounds of {calls}")
        for way in ways:
            fb, f = times[way, "forward_backward"], times[way, "forward"]
            print(f"  {way:7s} forward+backward {statistics.median(fb):7.1f} ({min(fb):.1f}-{max(fb):.1f})  "
                  f"forward {statistics.median(f):7.1f} ({min(f):.1f}-{max(f):.1f})", flush=True)


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
    print_host_us(ways, calls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the earlier commit to compare with")
    p.add_argument("--shapes", nargs="*", default=["xl_512", "small_512", "floor"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--stubbed", action="store_true", help="time the dispatch alone, launches stubbed out (then the "
                   "allocations); runs on the CPU too, without TRITON_INTERPRET")
    p.add_argument("--device", default="cuda")
    p.add_argument("--bare", action="store_true", help="also time the bare Function (no launches) with do_bench")
    args = p.parse_args()
    dev = torch.device(args.device)
    if args.stubbed:
        with tempfile.TemporaryDirectory() as folder:
            stubbed(load_base(args.base, folder), dev, args.shapes, args.rounds)
        print(f"host cost of outputs ({dev.type}), us a call:")
        allocation_costs(dev)
        return
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)
    with tempfile.TemporaryDirectory() as folder:
        base = load_base(args.base, folder)
        print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}; "
              f"new = this checkout, old = {args.base}")
        ways = ("new", "old", *(("bare",) if args.bare else ()), *PEERS)
        for name in args.shapes:
            s = MODEL_SHAPES[name]
            inputs = shape_inputs(s, dev)
            calls = {"new": calls_of(ft.FlashAttention2Triton, s, dev, inputs),
                     "old": calls_of(base.FlashAttention2Triton, s, dev, inputs)}
            if args.bare:
                calls["bare"] = calls_of(_Bare, s, dev, inputs)
            for peer in PEERS:
                calls[peer] = _calls(peer, s, dev, False, "do", inputs)
            bench = {(w, m): [] for w in ways for m in ("forward", "forward_backward")}
            for _ in range(args.rounds):
                for mode in ("forward_backward", "forward"):
                    for way in ways:
                        c, grads = calls[way]
                        fn = c[mode]
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
                with pinned(fn):
                    kern = kernel_ms(fn, dev, grads) * 1e3 if way != "bare" else 0.0  # it launches nothing
                    med, p90 = issue_us(fn, grads, flush)
                print(f"  {way:11s} {kern:8.1f} {med:8.1f} {p90:8.1f}", flush=True)
    print("host cost of outputs, us a call:")
    allocation_costs(dev)


if __name__ == "__main__":
    main()
