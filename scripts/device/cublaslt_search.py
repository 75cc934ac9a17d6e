"""Does searching cuBLASLt's algorithms beat ``torch.mm`` at the step's GEMM shapes? (issue 19)

``torch.mm`` runs the first algorithm cuBLAS's heuristic ranks. cuBLASLt can return a ranked list instead
(``cublasLtMatmulAlgoGetHeuristic``), and timing every entry and keeping the fastest is what autotuners do
(PyTorch's TunableOp for hipBLASLt; on CUDA builds of torch 2.11 it only wraps the default). This times, per shape
of the xl block (``step_gemm_shapes.shapes``, in the layouts the step gives cuBLAS), ``torch.mm`` under the step's
setting (no workspace) against every candidate cuBLASLt returns with no workspace and with 32 MiB, checks each
candidate's output against ``torch.mm``'s, and re-times the fastest against ``torch.mm`` in alternating rounds
(all in CUDA graphs: the GPU host's launch time exceeds a 1,600-wide product's); ``--sustained`` also times the two
at the power cap, where a training step runs its products. Session 51 built the custom op that calls the picks, and
the step measured no faster (``experiments/tuned_gemm/``).

    CUBLAS_WORKSPACE_CONFIG=:0:0 python scripts/device/cublaslt_search.py [--preset xl --context-length 2048] \
        [--count 64] [--only "q/k/v/o" ...] [--sustained 3] > $OUT/lt.txt

cuBLASLt is reached through ``ctypes`` on the library torch already loaded (``/proc/self/maps``); the enums and
the heuristic result's layout are cuBLASLt's public ones (``cublasLt.h``).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_gemm_shapes import operands, shapes

from cs336_systems.configs import get_preset

CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_COMPUTE_32F = 68
OP_N, OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
CONFIG_ATTRS = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6,
                "inner": 7, "cluster": 8}


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _load_lt() -> ctypes.CDLL:
    a = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, a)  # loads cuBLAS, and with it cuBLASLt
    torch.cuda.synchronize()
    with open("/proc/self/maps") as maps:
        paths = [line.split()[-1] for line in maps if "libcublasLt.so" in line]
    if not paths:
        raise RuntimeError("libcublasLt is not loaded in this process")
    lt = ctypes.CDLL(paths[0])
    vp, sz, i32, u64, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
    for fn, argtypes in {
        "cublasLtCreate": [vp],
        "cublasLtMatmulDescCreate": [vp, i32, i32],
        "cublasLtMatrixLayoutCreate": [vp, i32, u64, u64, i64],
        "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatmulPreferenceCreate": [vp],
        "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatmulPreferenceDestroy": [vp],
        "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, vp, vp],
        "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp],
        "cublasLtMatmulAlgoConfigGetAttribute": [vp, i32, vp, sz, vp],
    }.items():
        getattr(lt, fn).argtypes, getattr(lt, fn).restype = argtypes, i32
    lt.cublasLtGetVersion.argtypes, lt.cublasLtGetVersion.restype = [], sz
    return lt


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} returned cuBLAS status {status}")


class LtProblem:
    """``c = a @ b`` (row-major torch views, c contiguous) as cuBLASLt's column-major ``c^T = b^T a^T``: the "A"
    operand is b's storage and "B" is a's; a row-major view with strides (cols, 1) is a column-major matrix read
    with op N, one with strides (1, rows) with op T."""

    def __init__(self, lt: ctypes.CDLL, handle, a: torch.Tensor, b: torch.Tensor):
        self.lt, self.handle, self.a, self.b = lt, handle, a, b
        m, k = a.shape
        n = b.shape[1]
        self.c = torch.empty(m, n, device=a.device, dtype=a.dtype)
        vp = ctypes.c_void_p
        self.desc = vp()
        _check(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "DescCreate")

        def layout(t: torch.Tensor, rows_if_n: int, cols_if_n: int):
            """(op, layout) of the column-major operand whose op(.) is (rows_if_n x cols_if_n) = t^T."""
            r, c_ = t.shape
            lay = vp()
            if t.stride() == (c_, 1):  # row-major (r, c) = column-major (c, r), ld c: op N gives t^T
                _check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lay), CUDA_R_16BF, rows_if_n, cols_if_n,
                                                     ctypes.c_int64(c_)), "LayoutCreate")
                return OP_N, lay
            if t.stride() == (1, r):  # a transposed view: column-major (r, c), ld r: op T gives t^T
                _check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lay), CUDA_R_16BF, cols_if_n, rows_if_n,
                                                     ctypes.c_int64(r)), "LayoutCreate")
                return OP_T, lay
            raise ValueError(f"operand strides {t.stride()} are neither row- nor column-major")

        op_a, self.la = layout(b, n, k)  # "A" = b^T: (n x k)
        op_b, self.lb = layout(a, k, m)  # "B" = a^T: (k x m)
        self.lc = vp()
        _check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(self.lc), CUDA_R_16BF, n, m, ctypes.c_int64(n)),
               "LayoutCreate")
        for attr, op in ((DESC_TRANSA, op_a), (DESC_TRANSB, op_b)):
            v = ctypes.c_int32(op)
            _check(lt.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), ctypes.c_size_t(4)),
                   "DescSetAttribute")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.ops = (op_a, op_b)

    def candidates(self, count: int, workspace: int) -> list[_Heuristic]:
        lt, vp = self.lt, ctypes.c_void_p
        pref = vp()
        _check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(workspace)
        _check(lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                       ctypes.c_size_t(8)), "PreferenceSetAttribute")
        results = (_Heuristic * count)()
        returned = ctypes.c_int(0)
        _check(lt.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, self.la, self.lb, self.lc, self.lc, pref,
                                                 count, results, ctypes.byref(returned)), "AlgoGetHeuristic")
        lt.cublasLtMatmulPreferenceDestroy(pref)
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def run(self, heuristic: _Heuristic, workspace: torch.Tensor | None) -> None:
        ws_ptr = ctypes.c_void_p(workspace.data_ptr() if workspace is not None else 0)
        ws_size = ctypes.c_size_t(workspace.numel() if workspace is not None else 0)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(self.lt.cublasLtMatmul(
            self.handle, self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(self.b.data_ptr()), self.la,
            ctypes.c_void_p(self.a.data_ptr()), self.lb, ctypes.byref(self.beta), ctypes.c_void_p(self.c.data_ptr()),
            self.lc, ctypes.c_void_p(self.c.data_ptr()), self.lc, ctypes.byref(heuristic.algo), ws_ptr, ws_size,
            stream), "Matmul")


def describe(lt: ctypes.CDLL, h: _Heuristic) -> str:
    parts = []
    for name, attr in CONFIG_ATTRS.items():
        buf, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
        if lt.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(h.algo), attr, ctypes.byref(buf), ctypes.c_size_t(4),
                                                   ctypes.byref(written)) == 0:
            parts.append(f"{name}={buf.value}")
    return " ".join(parts) + f" ws={h.workspace_size} waves={h.waves:.2f}"


def time_ms(fn, reps: int = 20, rounds: int = 5, replays: int = 5) -> float:
    """Milliseconds a call: ``reps`` calls captured in a CUDA graph (the GPU host's launch time, 20-100 us a
    ``torch.mm``, would otherwise be what is timed at the 1,600-wide shapes), median of ``rounds`` rounds of
    ``replays`` replays."""
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (reps * replays))
    return statistics.median(times)


def kernel_name(fn) -> str:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return ", ".join(n[:70] for n in names) or "?"


def sustained_ms(fn, seconds: float) -> float:
    """Milliseconds a call with the GPU at its power cap: a CUDA graph of 20 calls replayed for ``seconds``, the
    second half timed (the first lets clock and power settle)."""
    time_ms(fn, rounds=1)  # captures nothing lasting; warms the kernel
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds / 2:
        graph.replay()
        torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    replays, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds / 2:
        graph.replay()
        replays += 1
        if replays % 8 == 0:
            torch.cuda.synchronize()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / (20 * replays)


def search(lt: ctypes.CDLL, handle, workspace: torch.Tensor, shape: tuple, count: int, layers: int,
           sustained: float = 0.0) -> float:
    """Time one shape's candidates; print the fastest five and the pick against ``torch.mm``; return the
    milliseconds a step the pick saves (0 where it does not)."""
    name, m, n, k, layout, per_block = shape
    torch.manual_seed(0)
    a, b = operands(m, n, k, layout)
    ref = torch.mm(a, b)
    prob = LtProblem(lt, handle, a, b)

    def mm():
        return torch.mm(a, b)

    base = time_ms(mm)
    flops = 2 * m * n * k
    print(f"\n== {name}: {m} x {n} x {k} ({layout}; cuBLASLt ops {prob.ops}), {per_block} a block")
    print(f"  torch.mm {base:.4f} ms ({flops / base / 1e9:.0f} TFLOP/s)  [{kernel_name(mm)}]")
    timed = []
    for ws_bytes in (0, workspace.numel()):
        ws = workspace if ws_bytes else None
        cands = prob.candidates(count if not ws_bytes else min(count, 16), ws_bytes)
        first = None
        for i, h in enumerate(cands):
            if h.workspace_size > ws_bytes:
                continue
            try:
                prob.run(h, ws)
                torch.cuda.synchronize()
            except RuntimeError as err:
                print(f"  ws={ws_bytes >> 20} MiB #{i}: {err}")
                continue
            err = ((prob.c.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            if err > 1e-2:
                print(f"  ws={ws_bytes >> 20} MiB #{i}: wrong result (relative error {err:.2e}), skipped")
                continue
            t = time_ms(functools.partial(prob.run, h, ws))
            first = t if i == 0 else first
            timed.append((t, ws_bytes, i, h))
        print(f"  ws={ws_bytes >> 20} MiB: {len(cands)} candidates; the heuristic's first "
              + (f"{first:.4f} ms" if first is not None else "n/a"))
    timed.sort(key=lambda r: r[0])
    for t, ws_bytes, i, h in timed[:5]:
        print(f"  {t:.4f} ms ({flops / t / 1e9:.0f} TFLOP/s) ws={ws_bytes >> 20} MiB #{i}: {describe(lt, h)}")
    if not timed:
        return 0.0
    _, ws_bytes, _, best = timed[0]
    pick = functools.partial(prob.run, best, workspace if ws_bytes else None)
    pairs = [(time_ms(pick, rounds=3), time_ms(mm, rounds=3)) for _ in range(8)]  # alternating rounds
    ratios = [p / q for p, q in pairs]
    ratio = statistics.median(ratios)
    saved = (1 - ratio) * statistics.median(q for _, q in pairs) * per_block * layers
    print(f"  pick/torch.mm, 8 alternating rounds: median {ratio:.3f} (min {min(ratios):.3f}, max "
          f"{max(ratios):.3f}); {saved:+.2f} ms a step over {layers} blocks  [{kernel_name(pick)}]")
    if sustained > 0:  # at the power cap, where a training step runs its products
        capped = [(sustained_ms(pick, sustained), sustained_ms(mm, sustained)) for _ in range(2)]
        print("  at the power cap (" + ", ".join(f"pick {p:.4f} / torch.mm {q:.4f} ms" for p, q in capped)
              + f"): pick/torch.mm {statistics.mean(p / q for p, q in capped):.3f}")
    return max(saved, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="xl")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--count", type=int, default=64, help="candidates asked of the heuristic")
    parser.add_argument("--only", nargs="*", help="shape names (substring match)")
    parser.add_argument("--sustained", type=float, default=0.0,
                        help="also time the pick and torch.mm at the power cap, this many seconds each (twice)")
    args = parser.parse_args()

    cfg = get_preset(args.preset)
    lt = _load_lt()
    handle = ctypes.c_void_p()
    _check(lt.cublasLtCreate(ctypes.byref(handle)), "Create")
    workspace = torch.empty(32 << 20, device="cuda", dtype=torch.uint8)
    tokens = args.batch_size * args.context_length
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuBLASLt {lt.cublasLtGetVersion()}, "
          f"CUBLAS_WORKSPACE_CONFIG={os.environ.get('CUBLAS_WORKSPACE_CONFIG', '(unset)')}; {args.preset}, "
          f"{tokens} tokens; ms per product (CUDA graphs of 20 calls, median of 5 rounds of 5 replays)")
    total = 0.0
    for shape in shapes(tokens, cfg.d_model, cfg.d_ff, cfg.vocab_size):
        name, per_block = shape[0], shape[5]
        wanted = any(s in name for s in args.only) if args.only else per_block > 0
        if wanted:
            total += search(lt, handle, workspace, shape, args.count, cfg.num_layers, args.sustained)
    print(f"\nsum of the savings a step where the pick is faster: {total:.2f} ms")


if __name__ == "__main__":
    main()
