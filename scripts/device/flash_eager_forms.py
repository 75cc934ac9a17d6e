"""Which backward form an eager, host-bound attention call should take (issue 18's 512-token do_bench rows), on the GPU.

At each shape, interleaved round by round in one process on the same inputs, the adapters' ``FlashAttention2Triton``
with its backward as three kernels (D, the dK/dV + atomic-dQ kernel, dQ's conversion: five matmuls a tile pair, the
captured step's form) and as the single kernel (seven matmuls, one launch, no D or dQ accumulator), against SDPA's
cuDNN and flash backends pinned once: ``do_bench``'s median forward+backward, the kernels' GPU time (``kernel_ms``)
and the host's time to issue a do_bench iteration. Then what a CUDA allocation costs this host from Python, against
a view of one (the allocations a call could merge).

    python scripts/device/flash_eager_forms.py [--shapes xl_512 small_512 floor] [--rounds 7] [--profile]

``--profile``: then, at the first shape, ``cProfile`` of each form's issue loop (functions by own time) and how many
TMA descriptors each encoded.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import statistics

import torch
import triton
from flash_dobench_gap import issue_us, print_host_us  # this script's folder is on sys.path when it runs

import cs336_systems.attention._tuning as tuning
import cs336_systems.attention.flash_triton as ft
from cs336_systems.bench.flash import MODEL_SHAPES, _calls, kernel_ms, pinned, shape_inputs

_CONFIG_FOR = tuning.config_for
_ENCODES = [0]
_utils = triton.runtime.driver.active.utils
_fill = _utils.fill_tma_descriptor


def _counted_fill(*args):
    _ENCODES[0] += 1
    return _fill(*args)


_utils.fill_tma_descriptor = _counted_fill  # read by the launchers built after this


def _single_everywhere(*args, **kwargs):
    return dataclasses.replace(_CONFIG_FOR(*args, **kwargs), single_max_programs=1 << 20)


def _three_past_the_captured_bound(*args, **kwargs):
    return dataclasses.replace(_CONFIG_FOR(*args, **kwargs), eager_single_max_pairs=0)


def form(single: bool | None) -> None:
    """Route the Triton class's backward to the single kernel (True), to the captured calls' choice (False: the three
    kernels past ``single_max_programs``) or back to the config's own (None), and drop the cached plans."""
    ft._tuning.config_for = {True: _single_everywhere, False: _three_past_the_captured_bound}.get(single, _CONFIG_FOR)
    ft._PLANS.clear()


def allocation_costs(dev: torch.device, calls: int = 2000) -> None:
    """Host microseconds a call of a few ways to get (4, 25, 512, 64) bf16 outputs (median of 5 rounds)."""
    like = torch.empty(4, 25, 512, 64, device=dev, dtype=torch.bfloat16)
    ways = {
        "torch.empty x1": lambda: torch.empty(like.shape, device=dev, dtype=like.dtype),
        "new_empty x1": lambda: like.new_empty(like.shape),
        "new_empty x3": lambda: (like.new_empty(like.shape), like.new_empty(like.shape), like.new_empty(like.shape)),
        "one (3, ...) new_empty + unbind": lambda: like.new_empty((3, *like.shape)).unbind(0),
        "a view of a tensor": lambda: like.view(like.shape),
    }
    print_host_us(ways, calls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["xl_512", "small_512", "floor"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profile", action="store_true", help="cProfile each form's issue loop at the first shape")
    args = p.parse_args()
    dev = torch.device("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}")
    ways = ("three", "single", "sdpa_flash", "sdpa_cudnn")
    for name in args.shapes:
        s = MODEL_SHAPES[name]
        inputs = shape_inputs(s, dev)
        calls = {}
        for way in ways:
            impl = "triton" if way in ("three", "single") else way
            c, grads = _calls(impl, s, dev, False, "do", inputs)
            calls[way] = (c["forward_backward"], grads)
        bench = {w: [] for w in ways}
        for _ in range(args.rounds):
            for way in ways:
                fn, grads = calls[way]
                form(way == "single")
                with pinned(fn):
                    fn()
                    torch.cuda.synchronize()
                    bench[way].append(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grads) * 1e3)
        print(f"{name}: do_bench forward+backward us, median of {args.rounds} rounds (min-max); kernels us; issue us")
        for way in ways:
            fn, grads = calls[way]
            form(way == "single")
            with pinned(fn):
                kern = kernel_ms(fn, dev, grads) * 1e3
                issue = issue_us(fn, grads, flush)[0]
            b = bench[way]
            print(f"  {way:11s} {statistics.median(b):8.1f} ({min(b):7.1f}-{max(b):7.1f}) {kern:8.1f} {issue:8.1f}",
                  flush=True)
        form(None)
    for way in ("three", "single") if args.profile else ():
        s = MODEL_SHAPES[args.shapes[0]]
        form(way == "single")
        c, grads = _calls("triton", s, dev, False, "do", shape_inputs(s, dev))
        fn = c["forward_backward"]
        issue_us(fn, grads, flush, iters=50)
        _ENCODES[0] = 0
        prof = cProfile.Profile()
        prof.enable()
        issue_us(fn, grads, flush, iters=200, warmup=0)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print(f"== {args.shapes[0]}, {way}: {_ENCODES[0]} descriptors encoded in 200 iterations; cProfile")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000], flush=True)
    form(None)
    print("host cost of outputs, us a call:")
    allocation_costs(dev)


if __name__ == "__main__":
    main()
