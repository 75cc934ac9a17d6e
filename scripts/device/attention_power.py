"""Power and SM clock while one attention kernel runs back to back: ours and SDPA cuDNN's forward (or
forward+backward), alternating in one process, with ``nvidia-smi`` sampling every 20 ms, so that a kernel that
takes as many cycles as its peer but runs at a lower clock shows whether it draws more power (session 41).

    python scripts/device/attention_power.py --shape xl_2048 [--backward] [--seconds 4] [--rounds 3]
        [--tiles 64,64,4,3,p 64,64,4,3,p,pack0 128,128,4,3,ws,p,lazy8]

``--tiles`` adds our forward at forced Gluon tiles (BLOCK_M, BLOCK_N, warps, stages, then ``ws`` for the
warp-specialised form, ``p`` for persistent programs, ``pack`` for P's packed conversions, ``leanl`` for l's
per-thread parts and reciprocal (either form) and ``lazy4`` or ``lazy8`` for the rescales skipped past that
threshold (warp-specialised), ``pack0``, ``leanl0`` and ``lazy0`` for each off; without a flag, what the planner passes;
``fwd_variant_ab.py``'s launcher), forward only. Prints per
implementation and round: calls a second, median power (W), median SM clock (MHz), and energy a call (mJ = power /
calls a second). The calls are ``flash-bench --sustained-seconds``'s (``bench.flash.sustained_ms``); the session-41
logs (8e44651, 6429360) ran a loop of their own that left q, k and v's gradients accumulating across
forward+backward calls.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time

import torch

from cs336_systems.attention._tuning import KernelConfig
from cs336_systems.bench.flash import MODEL_SHAPES, attention_fn, pinned, shape_inputs, sustained_ms

WARMUP_S = 1.0  # each span's untimed start (its samples left out too): the clock settles on this kernel


# the forwards' switches: flag -> (constexpr, value); without one, what the planner passes
_SWITCHES = {"pack": ("PACK_P", True), "pack0": ("PACK_P", False), "leanl": ("LEAN_L", True),
             "leanl0": ("LEAN_L", False), "lazy0": ("LAZY_RESCALE", 0), "lazy4": ("LAZY_RESCALE", 4),
             "lazy8": ("LAZY_RESCALE", 8)}
# which form takes each switch: pack the one-warpgroup forward's, lazy the warp-specialised one's, leanl both's
_ONE_WG_SWITCHES = {"pack", "pack0", "leanl", "leanl0"}
_WS_SWITCHES = {"leanl", "leanl0", "lazy0", "lazy4", "lazy8"}
_TILE_FORM = "BLOCK_M,BLOCK_N,WARPS,STAGES[,ws][,p][,pack|,pack0][,leanl|,leanl0][,lazy0|,lazy4|,lazy8]"


def _tile(spec: str) -> tuple[KernelConfig, dict]:
    """``BLOCK_M,BLOCK_N,WARPS,STAGES[,ws][,p][,pack|,pack0][,leanl|,leanl0][,lazy0|,lazy4|,lazy8]`` as the forward's
    Gluon tile (TMA on) and the constexprs the launch sets (``_SWITCHES``): ``pack``, P rounded in packed pairs,
    ``PACK_P`` (one-warpgroup tiles); ``leanl``, l in per-thread parts and one reciprocal a row, ``LEAN_L`` (either
    form); ``lazy4``, ``lazy8``, O's rescale skipped where m did not move past that threshold, ``LAZY_RESCALE``
    (warp-specialised tiles); a trailing 0 turns the switch off."""
    parts = spec.split(",")
    flags = set(parts[4:])
    if len(parts) < 4 or not all(x.isdigit() for x in parts[:4]) or flags - {"ws", "p", *_SWITCHES}:
        raise argparse.ArgumentTypeError(f"a tile is {_TILE_FORM}, got {spec!r}")
    if flags & (_SWITCHES.keys() - (_WS_SWITCHES if "ws" in flags else _ONE_WG_SWITCHES)):
        raise argparse.ArgumentTypeError(f"pack is for one-warpgroup tiles and lazy for warp-specialised (ws) ones, "
                                         f"got {spec!r}")
    names = [_SWITCHES[flag][0] for flag in flags & _SWITCHES.keys()]
    if len(names) > len(set(names)):
        raise argparse.ArgumentTypeError(f"one setting a switch at most, got {spec!r}")
    try:
        return KernelConfig(*map(int, parts[:4]), True, "ws" in flags, "p" in flags), dict(
            _SWITCHES[flag] for flag in sorted(flags & _SWITCHES.keys()))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="xl_2048", choices=list(MODEL_SHAPES))
    p.add_argument("--impl", nargs="*", default=["triton", "sdpa_cudnn"])
    p.add_argument("--backward", action="store_true")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tiles", nargs="*", type=_tile, default=[], help="our forward at these Gluon tiles as well")
    args = p.parse_args()
    if args.tiles and args.backward:
        p.error("--tiles times forwards only")
    s = MODEL_SHAPES[args.shape]
    dev = torch.device("cuda")
    q, k, v, do = shape_inputs(s, dev)

    def through(fn):
        """A zero-argument call of ``fn`` on this shape's inputs (and its backward)."""
        def call():
            o = fn(q, k, v, s.causal)
            if args.backward:
                o.backward(do)
        call.sdpa_backend = getattr(fn, "sdpa_backend", None)  # pinned once a span, as flash-bench does
        return call

    grads = [q, k, v] if args.backward else None  # reset before each call, as flash-bench does
    calls = {impl: through(attention_fn(impl, s, dev)) for impl in args.impl}
    if args.tiles:
        from fwd_variant_ab import runner  # this script's folder is on sys.path

        qd, kd, vd = (t.detach() for t in (q, k, v))
        for t, extra in args.tiles:
            calls[f"{t.block_m}x{t.block_n}/w{t.num_warps}/s{t.num_stages}" + "/ws" * t.warp_specialize
                  + "/p" * t.persistent + "".join(f"/{flag}" for flag, setting in _SWITCHES.items()
                                                  if setting in extra.items())] = runner(
                      qd, kd, vd, s.causal, t, extra)[0]
    names = list(calls)
    # samples go to a file: a pipe read only at the end fills after about 30 s and stalls nvidia-smi
    with tempfile.TemporaryFile("w+") as log:
        smi = subprocess.Popen(["stdbuf", "-oL", "nvidia-smi", "--query-gpu=timestamp,power.draw,clocks.sm",
                                "--format=csv,noheader,nounits", "-lms", "20"], stdout=log, text=True)
        spans = []
        for r in range(args.rounds):
            for impl in (names if r % 2 == 0 else names[::-1]):
                t0 = time.time() + WARMUP_S
                with pinned(calls[impl]):
                    ms = sustained_ms(calls[impl], dev, grads, args.seconds, warmup_s=WARMUP_S)
                spans.append((r, impl, 1e3 / ms, t0, time.time()))
        time.sleep(0.5)
        smi.terminate()  # line-buffered output (stdbuf): the last span's samples are not lost with the process
        smi.wait()
        log.seek(0)
        text = log.read()
    samples = []
    for line in text.splitlines():
        stamp, watts, mhz = (x.strip() for x in line.split(","))
        t = time.mktime(time.strptime(stamp.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + stamp.split(".")[1])
        samples.append((t, float(watts), float(mhz)))
    print(f"{args.shape} {'forward+backward' if args.backward else 'forward'}")
    for r, impl, rate, t0, t1 in spans:
        inside = [(w, c) for t, w, c in samples if t0 + 0.1 <= t <= t1 - 0.1]
        if not inside:
            print(f"round {r} {impl:<20} no samples")
            continue
        watts, mhz = statistics.median(w for w, _ in inside), statistics.median(c for _, c in inside)
        print(f"round {r} {impl:<20} {rate:8.1f} calls/s  {watts:6.1f} W  {mhz:6.0f} MHz  "
              f"{1e3 * watts / rate:7.3f} mJ a call  ({len(inside)} samples)", flush=True)


if __name__ == "__main__":
    main()
