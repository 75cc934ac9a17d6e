"""Why a do_bench row reads above its kernels (issue 18: the host-bound forward+backward rows), on the GPU.

At each shape, for ours (the adapters' ``FlashAttention2Triton``) and SDPA's cuDNN and flash backends, the way
``flash-bench`` calls them (``bench.flash._calls``, inputs shared): ``do_bench``'s median (L2 flushed before each
call), the kernels' GPU time per call (``kernel_ms``), and the host's time to issue one do_bench iteration (flush and
call, no synchronisation: median and 90th percentile over 200 iterations, after 20 unmeasured). Where the host's
issue time exceeds the GPU's time per iteration, the GPU waits on the host and do_bench times the host.

    python scripts/device/flash_dobench_gap.py [--shapes d128_4k xl_512 floor] [--profile] > $OUT/gap.txt

``--profile``: then ``cProfile`` of ours' issue loop at each shape, the functions by own time. ``--rounds N``: then
N interleaved rounds of the implementations at each shape, as ``flash-bench`` times them, each with its do_bench
median, its issue time and (ours) how many TMA descriptors the launches encoded in the round: a row whose rounds
split between the kernels' time and far above it, with the encodes, is re-encoding descriptors, not waiting on
the host's state.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
import triton
import triton.runtime

from cs336_systems.bench.flash import MODEL_SHAPES, _calls, _interleaved, kernel_ms, pinned, shape_inputs


def issue_us(fn, grads, flush, iters: int = 200, warmup: int = 20) -> tuple[float, float]:
    """Host microseconds to issue one do_bench iteration (grads reset, flush, call): median and 90th percentile."""
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        for t in grads:
            t.grad = None
        flush.zero_()
        fn()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e6)
        if i % 50 == 49:  # keep the queue short enough that the host never blocks on it
            torch.cuda.synchronize()
    times.sort()
    return statistics.median(times), times[int(0.9 * len(times))]


def print_host_us(ways: dict, calls: int = 2000, rounds: int = 5) -> None:
    """Host microseconds a call of each of ``ways`` (name: a function of no arguments), median of ``rounds``."""
    for name, way in ways.items():
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                way()
            times.append((time.perf_counter() - t0) / calls * 1e6)
        print(f"  {name:34s} {statistics.median(times):7.2f} us", flush=True)


def count_encodes() -> list[int]:
    """A one-element counter of the TMA descriptors encoded on the host from now on (``fill_tma_descriptor``)."""
    utils = triton.runtime.driver.active.utils
    encode, count = utils.fill_tma_descriptor, [0]

    def counted(*args):
        count[0] += 1
        return encode(*args)

    utils.fill_tma_descriptor = counted
    return count


def rounds_of(name: str, impls: list[str], rounds: int, dev, flush, encodes: list[int], rep_ms: float = 200.0):
    """``rounds`` rounds of ``impls`` at shape ``name``, in an order rotated by one a round (``flash-bench``'s
    interleaving): per round and implementation do_bench's median (us), the issue time (median / p90, us) and the
    descriptors encoded during the round's do_bench."""
    s = MODEL_SHAPES[name]
    inputs = shape_inputs(s, dev)
    live = {}
    for impl in impls:
        calls, grads = _calls(impl, s, dev, False, "random", inputs)
        with pinned(calls["forward"]):
            triton.testing.do_bench(calls["forward_backward"], warmup=25, rep=25, grad_to_none=grads)
        live[impl] = (calls["forward_backward"], calls["forward"], grads)
    print(f"== {name}: {rounds} interleaved rounds, do_bench forward+backward us / issue us (med, p90) / encodes")
    cells: dict[int, list[str]] = {}
    for r, impl in _interleaved(live, rounds):
        fn, fwd, grads = live[impl]
        with pinned(fwd):
            before = encodes[0]
            ms = triton.testing.do_bench(fn, warmup=10, rep=rep_ms, grad_to_none=grads)
            encoded = encodes[0] - before
            med, p90 = issue_us(fn, grads, flush, iters=100, warmup=5)
        cells.setdefault(r, []).append(f"{impl} {ms * 1e3:7.1f} / {med:6.1f} {p90:6.1f} / {encoded}")
    for r, row in cells.items():
        print(f"  round {r}: " + " | ".join(row), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["d128_4k", "xl_512", "floor"])
    p.add_argument("--impls", nargs="*", default=["triton", "sdpa_cudnn", "sdpa_flash"])
    p.add_argument("--profile", action="store_true", help="cProfile ours' issue loop at each shape")
    p.add_argument("--rounds", type=int, default=0, help="interleaved rounds with descriptor encodes counted")
    args = p.parse_args()
    dev = torch.device("cuda")
    encodes = count_encodes()  # before any launcher of ours is built: each captures the encoder then
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)
    flush_ms = triton.testing.do_bench(lambda: flush.zero_(), warmup=25, rep=100)
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}; "
          f"flush {flush_ms * 1e3:.1f} us")
    print(f"{'shape':10s} {'impl':11s} {'do_bench us':>11s} {'kernels us':>10s} {'issue us (med/p90)':>19s}")
    for name in args.shapes:
        s = MODEL_SHAPES[name]
        inputs = shape_inputs(s, dev)
        for impl in args.impls:
            calls, grads = _calls(impl, s, dev, False, "do", inputs)
            fn = calls["forward_backward"]
            with pinned(fn):  # an SDPA peer's backend set once, as flash-bench does
                fn()
                torch.cuda.synchronize()
                bench = triton.testing.do_bench(fn, warmup=25, rep=200, grad_to_none=grads)
                kern = kernel_ms(fn, dev, grads)
                med, p90 = issue_us(fn, grads, flush)
            print(f"{name:10s} {impl:11s} {bench * 1e3:11.1f} {kern * 1e3:10.1f} {med:9.1f} / {p90:7.1f}",
                  flush=True)
    for name in args.shapes if args.rounds else ():
        rounds_of(name, args.impls, args.rounds, dev, flush, encodes)
    for name in args.shapes if args.profile else ():
        s = MODEL_SHAPES[name]
        calls, grads = _calls("triton", s, dev, False, "do", shape_inputs(s, dev))
        issue_us(calls["forward_backward"], grads, flush, iters=50)
        prof = cProfile.Profile()
        prof.enable()
        issue_us(calls["forward_backward"], grads, flush, iters=200, warmup=0)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print(f"== {name}: cProfile of 200 iterations of ours\n{text.getvalue()}", flush=True)


if __name__ == "__main__":
    main()
