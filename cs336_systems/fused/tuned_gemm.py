"""Matrix products through cuBLASLt with the algorithm timed fastest for each shape (``--gemm tuned``; CUDA).

``torch.mm`` runs the algorithm that cuBLAS's heuristic ranks first. At the xl block's 1,600-column products that
pick is not the fastest: another of the heuristic's candidates runs the q/k/v/o forward 7% and its input gradient
11% faster, and the feed-forward's input gradient (K = 6,400) 7% faster (H100, CUDA graphs, alternating rounds:
``scripts/device/cublaslt_search.py``, ``results/logs/h100-s51/``). Autotuners such as PyTorch's TunableOp (which
does this for hipBLASLt; on CUDA builds of torch 2.11 it wraps only the default) time the candidates once per shape
and keep the fastest. This does the same: the first call of a shape (device, dtype, sizes, operand layouts,
accumulate or not) asks cuBLASLt's heuristic for its candidates with no workspace (as the step runs cuBLAS,
``fast.apply_cublas_workspace``), checks each one's result against ``torch.mm``'s, times them and ``torch.mm``
itself in CUDA graphs, and keeps the fastest (``torch.mm`` where none beats it). Calls under a CUDA graph capture
use a shape's pick if it has one, else ``torch.mm``: a capture cannot time anything.

``tuned_mm`` is a ``torch.library`` custom op (``torch.compile`` keeps it as a call, a captured step replays it);
``tuned_linear`` is ``cs336_basics.model.Linear``'s ``x W^T`` with its two backward products through it, and
``use_tuned_linear(model)`` installs it on a model's ``Linear`` modules; the fused feed-forward's input gradient
takes it through ``swiglu_ffn(..., tuned_gemm=True)``. Off CUDA, and for dtypes other than
bf16 and fp16, the op is ``torch.mm``. cuBLASLt is reached through ``ctypes`` on the library PyTorch loaded; the
enums and structures are those of its public header (``cublasLt.h``).
"""

from __future__ import annotations

import ctypes
import math
import statistics
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cs336_basics.model import Linear
from cs336_systems.fused import install_kernel

_CUDA_R_16F, _CUDA_R_32F, _CUDA_R_16BF = 2, 0, 14
_CUBLAS_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_PREF_MAX_WORKSPACE_BYTES = 1
_DTYPES = {torch.bfloat16: _CUDA_R_16BF, torch.float16: _CUDA_R_16F}
CANDIDATES = 16  # asked of the heuristic (it returned 8 at every xl shape on an H100)
ROTATING_MAX = 16  # operand copies at most while timing (small products need many to fill 3x the L2 cache)
# a candidate's result against torch.mm's, relative to the largest |entry|: both round one fp32 sum per entry to 16
# bits (2^-8 of it for bf16), summed in different orders; a wrong algorithm is off by O(1)
_TOLERANCE = 2.0**-6


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_lib: ctypes.CDLL | None = None
_handles: dict[int, ctypes.c_void_p] = {}
_plans: dict[tuple, _Plan | None] = {}  # None: torch.mm measured fastest


def _library() -> ctypes.CDLL:
    """The cuBLASLt that PyTorch's cuBLAS loaded into this process, with its functions' C signatures."""
    global _lib
    if _lib is not None:
        return _lib
    a = torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, a)  # loads cuBLAS, and cuBLASLt with it
    try:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "libcublasLt.so" in line]
    except OSError:
        paths = []
    errors = []
    for path in [*paths, "libcublasLt.so.13", "libcublasLt.so.12"]:
        try:
            lib = ctypes.CDLL(path)
            break
        except OSError as err:
            errors.append(str(err))
    else:
        raise RuntimeError(f"tuned GEMMs need cuBLASLt, which could not be loaded: {'; '.join(errors)}")
    vp, sz, i32, u64, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
    for name, argtypes in {
        "cublasLtCreate": [vp],
        "cublasLtMatmulDescCreate": [vp, i32, i32],
        "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatrixLayoutCreate": [vp, i32, u64, u64, i64],
        "cublasLtMatmulPreferenceCreate": [vp],
        "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatmulPreferenceDestroy": [vp],
        "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, vp, vp],
        "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, i32
    _lib = lib
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} returned status {status}")


def _handle(device: torch.device) -> ctypes.c_void_p:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _handles:
        handle = ctypes.c_void_p()
        with torch.cuda.device(index):
            _check(_library().cublasLtCreate(ctypes.byref(handle)), "Create")
        _handles[index] = handle
    return _handles[index]


def _layout(t: Tensor) -> str | None:
    """'n' for a row-major 2-D view (strides (cols, 1)), 't' for a column-major one (strides (1, rows)), else None
    (size-1 dimensions count as either)."""
    rows, cols = t.shape
    s0, s1 = t.stride()
    if (s1 == 1 or cols == 1) and (s0 == cols or rows == 1):
        return "n"
    if (s0 == 1 or rows == 1) and (s1 == rows or cols == 1):
        return "t"
    return None


@dataclass
class _Plan:
    """One shape's cuBLASLt problem: ``c (m, n) = a (m, k) @ b (k, n)`` as the column-major ``c^T = b^T a^T`` (the
    "A" operand is b's storage, "B" is a's; a row-major view is read with op N, a column-major one with op T), and
    the algorithm to run it with."""

    desc: ctypes.c_void_p
    layout_a: ctypes.c_void_p
    layout_b: ctypes.c_void_p
    layout_c: ctypes.c_void_p
    algo: _Algo | None = None

    @classmethod
    def build(cls, dtype: torch.dtype, m: int, n: int, k: int, a_layout: str, b_layout: str) -> _Plan:
        lib, vp = _library(), ctypes.c_void_p
        desc = vp()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _CUBLAS_COMPUTE_32F, _CUDA_R_32F), "MatmulDescCreate")

        def layout(rows: int, cols: int) -> ctypes.c_void_p:
            lay = vp()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), _DTYPES[dtype], rows, cols, rows),
                   "MatrixLayoutCreate")
            return lay

        # "A" = b^T (n x k): b row-major is column-major (n x k), op N; b column-major is (k x n), op T
        op_a, lay_a = (_OP_N, layout(n, k)) if b_layout == "n" else (_OP_T, layout(k, n))
        # "B" = a^T (k x m): a row-major is column-major (k x m), op N; a column-major is (m x k), op T
        op_b, lay_b = (_OP_N, layout(k, m)) if a_layout == "n" else (_OP_T, layout(m, k))
        for attr, op in ((_DESC_TRANSA, op_a), (_DESC_TRANSB, op_b)):
            value = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), 4), "MatmulDescSetAttribute")
        return cls(desc, lay_a, lay_b, layout(n, m))

    def candidates(self, handle: ctypes.c_void_p, count: int) -> list[_Algo]:
        """The heuristic's ranked algorithms that need no workspace; none where it supports no algorithm for the
        problem (cuBLASLt wants 16-byte aligned leading dimensions, for one: torch.mm's cuBLAS takes any)."""
        lib, pref = _library(), ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "MatmulPreferenceCreate")
        try:
            none = ctypes.c_uint64(0)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(none), 8),
                   "MatmulPreferenceSetAttribute")
            results, returned = (_Heuristic * count)(), ctypes.c_int(0)
            if lib.cublasLtMatmulAlgoGetHeuristic(handle, self.desc, self.layout_a, self.layout_b, self.layout_c,
                                                  self.layout_c, pref, count, results, ctypes.byref(returned)) != 0:
                return []
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        return [_Algo.from_buffer_copy(results[i].algo) for i in range(returned.value)
                if results[i].state == 0 and results[i].workspace_size == 0]

    def run(self, handle: ctypes.c_void_p, algo: _Algo, a: Tensor, b: Tensor, out: Tensor, accumulate: bool) -> None:
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(1.0 if accumulate else 0.0)
        stream = torch.cuda.current_stream(out.device).cuda_stream
        _check(_library().cublasLtMatmul(
            handle, self.desc, ctypes.byref(alpha), b.data_ptr(), self.layout_a, a.data_ptr(), self.layout_b,
            ctypes.byref(beta), out.data_ptr(), self.layout_c, out.data_ptr(), self.layout_c, ctypes.byref(algo),
            None, 0, stream), "Matmul")


def _graph_ms(fn, calls: int, rounds: int = 3) -> float:
    """Milliseconds a call of ``fn(i)`` for i = 0 .. calls - 1, the calls captured in a CUDA graph (the host's
    launch time must not be what is timed), median of ``rounds`` replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def _torch_mm(a: Tensor, b: Tensor, out: Tensor, accumulate: bool) -> None:
    if accumulate:
        out.addmm_(a, b)
    else:
        torch.mm(a, b, out=out)


def _tune(key: tuple, a: Tensor, b: Tensor, out: Tensor, accumulate: bool) -> _Plan | None:
    """The fastest of ``torch.mm`` and the heuristic's candidates for this shape (``out`` keeps its value); None
    where ``torch.mm`` is it. Each is timed over rotating copies of the operands that together hold three times
    the GPU's L2 cache, so that the operands arrive from memory as in a training step, where the layers between
    two products evict them (timed on the same operands again and again, the 1,600 x 1,600 weight gradient's
    pick ran 76 us a call in the step against torch.mm's 63: session 51, ``results/logs/h100-s51/``)."""
    plan = _Plan.build(a.dtype, a.shape[0], b.shape[1], a.shape[1], key[5], key[6])
    handle = _handle(out.device)
    seed = out.clone() if accumulate else out.new_zeros(out.shape)
    ref = seed.clone()
    _torch_mm(a, b, ref, accumulate)
    scale = ref.abs().max().float().clamp_min(torch.finfo(torch.float32).tiny)
    l2 = torch.cuda.get_device_properties(out.device).L2_cache_size
    nbytes = (a.numel() + b.numel() + out.numel()) * out.element_size()
    copies = max(1, min(ROTATING_MAX, math.ceil(3 * l2 / nbytes)))
    sets = [(a.clone(), b.clone(), seed.clone()) for _ in range(copies)]  # clone keeps a transposed view's strides
    calls = max(10, copies)

    def timed(run) -> float:
        return _graph_ms(lambda i: run(*sets[i % copies]), calls)

    best_ms, best = timed(lambda x, y, o: _torch_mm(x, y, o, accumulate)), None
    for algo in plan.candidates(handle, CANDIDATES):
        trial = seed.clone()
        try:
            plan.run(handle, algo, a, b, trial, accumulate)
        except RuntimeError:  # an algorithm the heuristic offers but the problem rejects: not a candidate
            continue
        if not ((trial.float() - ref.float()).abs().max() / scale).item() <= _TOLERANCE:
            continue
        ms = timed(lambda x, y, o, algo=algo: plan.run(handle, algo, x, y, o, accumulate))
        if ms < best_ms:
            best_ms, best = ms, algo
    if best is None:
        return None
    plan.algo = best
    return plan


def _key(a: Tensor, b: Tensor, accumulate: bool) -> tuple | None:
    """The plan cache's key, or None where cuBLASLt is not used (off CUDA, other dtypes, empty or odd views)."""
    if a.device.type != "cuda" or a.dtype not in _DTYPES or b.dtype != a.dtype or 0 in (*a.shape, b.shape[1]):
        return None
    la, lb = _layout(a), _layout(b)
    if la is None or lb is None or a.data_ptr() % 256 or b.data_ptr() % 256:
        return None  # the heuristic's candidates assume 256-byte aligned operands (its preference's default)
    return (a.device.index, a.dtype, a.shape[0], b.shape[1], a.shape[1], la, lb, accumulate)


def matmul_into(a: Tensor, b: Tensor, out: Tensor, accumulate: bool = False) -> Tensor:
    """``out = a @ b`` (``out += a @ b`` with ``accumulate``) for 2-D ``a`` (m, k), ``b`` (k, n) and a contiguous
    ``out`` (m, n), by the algorithm tuned for this shape; returns ``out``."""
    key = _key(a, b, accumulate)
    if key is None or not out.is_contiguous() or out.data_ptr() % 256:
        _torch_mm(a, b, out, accumulate)
        return out
    if key not in _plans:
        if torch.cuda.is_current_stream_capturing():  # no timing under a capture: torch.mm, tuned at a later call
            _torch_mm(a, b, out, accumulate)
            return out
        _plans[key] = _tune(key, a, b, out, accumulate)
    plan = _plans[key]
    if plan is None:
        _torch_mm(a, b, out, accumulate)
    else:
        plan.run(_handle(out.device), plan.algo, a, b, out, accumulate)
    return out


def tuned_choices() -> dict[str, str]:
    """What tuning picked per shape so far, for records: ``"m x n x k (layouts)[ +=]"`` -> ``"cublaslt"`` or
    ``"torch.mm"``."""
    return {f"{m} x {n} x {k} ({la}{lb}){' +=' if acc else ''}": ("torch.mm" if plan is None else "cublaslt")
            for (_, _, m, n, k, la, lb, acc), plan in _plans.items()}


@torch.library.custom_op("cs336_systems::tuned_mm", mutates_args=())
def tuned_mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for 2-D operands by the algorithm tuned for the shape (:func:`matmul_into`)."""
    return matmul_into(a, b, a.new_empty(a.shape[0], b.shape[1]))


@tuned_mm.register_fake
def _(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


class _TunedLinear(torch.autograd.Function):
    """y = x W^T on 2-D x, its three products through ``tuned_mm``."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(x, w)
        return tuned_mm(x, w.T)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        dx = tuned_mm(dy, w) if ctx.needs_input_grad[0] else None
        dw = tuned_mm(dy.T, x) if ctx.needs_input_grad[1] else None
        return dx, dw


def tuned_linear(x: Tensor, w: Tensor) -> Tensor:
    """``Linear.forward``'s ``x @ W^T`` for x (..., d_in) and W (d_out, d_in). Under autocast both are cast to its
    dtype first, as the matmul would cast them."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        x, w = x.to(dtype), w.to(dtype)
    lead = x.shape[:-1]
    y = _TunedLinear.apply(x.reshape(-1, x.shape[-1]).contiguous(), w)
    return y.reshape(*lead, w.shape[0])


def use_tuned_linear(model: nn.Module) -> int:
    """Make every ``Linear`` in ``model`` compute with :func:`tuned_linear` (where tuning finds nothing faster than
    ``torch.mm``, that is what runs); returns how many it set."""
    return install_kernel(model, Linear, tuned_linear)
