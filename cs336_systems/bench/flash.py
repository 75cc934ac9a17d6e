"""FlashAttention-2 benchmarks (flash_benchmarking and the leaderboard configuration).

Every implementation is timed with ``triton.testing.do_bench`` (median of CUDA-event timings) on fresh
random inputs, causal, for the forward, the backward (of a retained graph) and forward+backward.
FLOPs follow the flash-attention convention (``attention_flops``: 4 * B * H * N^2 * d, halved when
causal, x2.5 for the backward). An out-of-memory configuration is recorded as ``OOM``; an
implementation skipped for a size is recorded with the reason.

``kernel_time=True`` (issue 18's shapes) also records ``{mode}_kernel_ms``: the GPU time of the call's kernels
under ``torch.profiler``, per call, L2 flushed before each as ``do_bench`` does. Where the host sets the pace (the
512-token shapes: a call's launches take longer than its kernels) ``do_bench`` measures the host, whose speed moves
by 2x between runs; the kernel time is what the same call costs inside a CUDA graph or a compiled model that hides
the host. Issue 18's shapes (``time_interleaved``) are also timed in interleaved rounds on one set of inputs, so that
a drifting host slows every implementation alike and the ratios of the host-bound rows mean something.

Implementations (peers):
- ``triton``: ours (``FlashAttention2Triton``);
- ``torch_tiled``: our tiled PyTorch version (forward eager, backward compiled chunks);
- ``naive``: ``cs336_basics.model.scaled_dot_product_attention`` with a causal mask (materialises P);
- ``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient``: ``F.scaled_dot_product_attention`` pinned to one
  backend with ``sdpa_kernel``, once around each timing (``pinned``), not per call;
- ``flex``: ``torch.compile(flex_attention)`` with a causal block mask.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from cs336_systems.attention._common import attention_flops
from cs336_systems.attention.auto import auto_tables
from cs336_systems.bench.e2e import is_oom

IMPLEMENTATIONS = ("triton", "torch_tiled", "naive", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
MODES = ("forward", "backward", "forward_backward")

# Sizes past which a peer is not run (recorded as skipped): time, not memory, is the limit there.
MAX_SEQ = {"torch_tiled": 16384}
# In the sweep, FlexAttention (a compile per shape) only where it is a relevant peer: bf16, d >= 64.
FLEX_SWEEP = {"dtypes": ("bf16",), "min_head_dim": 64, "min_seq": 1024}
# Elements of the score matrix past which the naive peer is not tried (it would need > ~60 GiB).
NAIVE_MAX_SCORES = 2**33


@dataclass(frozen=True)
class AttnShape:
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    dtype: str = "bf16"
    causal: bool = True

    def flops(self, mode: str) -> float:
        return attention_flops(self.batch * self.heads, self.seq_len, self.seq_len, self.head_dim, self.causal, mode)


_PINNED: list = [None]  # the SDPA backend that ``pinned`` holds for the timing under way (None: none)


def sdpa_on(backend, fn: Callable) -> Callable:
    """``fn`` (a call of ``F.scaled_dot_product_attention``) on one SDPA backend. Inside ``pinned`` (entered
    around a whole timing, as a user sets the backend once for a run) a call costs only SDPA's own host time;
    ``sdpa_kernel`` entered per call adds 15-20 us a call on a CPU, more on a GPU's host, which would handicap the
    peer wherever the host sets the pace. Called outside ``pinned``, it pins its backend for itself."""
    from torch.nn.attention import sdpa_kernel

    def call(*args, **kwargs):
        if _PINNED[0] is backend:
            return fn(*args, **kwargs)
        with sdpa_kernel(backend):
            return fn(*args, **kwargs)

    call.sdpa_backend = backend
    return call


@contextlib.contextmanager
def pinned(fn: Callable):
    """The SDPA backend of ``fn`` (one of ``sdpa_on``'s calls, or a closure carrying its ``sdpa_backend``) set for
    the block, so that its calls skip the per-call ``sdpa_kernel``; for anything else, nothing."""
    backend = getattr(fn, "sdpa_backend", None)
    if backend is None:
        yield
        return
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        previous, _PINNED[0] = _PINNED[0], backend
        try:
            yield
        finally:
            _PINNED[0] = previous


def _sdpa(backend_name: str):
    from torch.nn.attention import SDPBackend

    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[backend_name]

    def fn(q, k, v, is_causal):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    return sdpa_on(backend, fn)


def _flex(shape: AttnShape, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    block_mask = create_block_mask(causal, B=None, H=None, Q_LEN=shape.seq_len, KV_LEN=shape.seq_len,
                                   device=device) if shape.causal else None
    # Every torch.compile(flex_attention) shares dynamo's cache for flex_attention's code: past its
    # recompile limit (8 shapes) dynamo silently runs flex_attention *eagerly*, which materialises the
    # scores and is orders of magnitude slower. Start from an empty cache for each shape.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)

    def fn(q, k, v, is_causal):
        return compiled(q, k, v, block_mask=block_mask)

    return fn


def _naive(q, k, v, is_causal):
    from cs336_basics.model import scaled_dot_product_attention

    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril() if is_causal else None
    return scaled_dot_product_attention(q, k, v, mask)


def attention_fn(impl: str, shape: AttnShape, device: torch.device, compile_apply: bool = False) -> Callable:
    """fn(q, k, v, is_causal) -> o on (B, H, N, d) tensors."""
    if impl == "triton":
        from cs336_systems.attention.flash_triton import FlashAttention2Triton

        return torch.compile(FlashAttention2Triton.apply) if compile_apply else FlashAttention2Triton.apply
    if impl == "torch_tiled":
        from cs336_systems.attention.flash_torch import FlashAttention2Torch

        return FlashAttention2Torch.apply  # compiling it would unroll the tile loop: the backward is compiled
    if impl == "naive":
        return torch.compile(_naive) if compile_apply else _naive
    if impl.startswith("sdpa_"):
        fn = _sdpa(impl)
        return torch.compile(fn) if compile_apply else fn  # the wrapper keeps ``sdpa_backend`` (functools.wraps)
    if impl == "flex":
        return _flex(shape, device)
    raise ValueError(f"unknown implementation {impl!r}; choose from {', '.join(IMPLEMENTATIONS)}")


def skip_reason(impl: str, shape: AttnShape, sweep: bool = False) -> str | None:
    if sweep and impl == "torch_tiled" and shape.seq_len > 8192:
        return "skipped: seq_len > 8192 in the sweep (time budget)"
    if sweep and impl == "flex" and (shape.dtype not in FLEX_SWEEP["dtypes"] or shape.head_dim <
                                     FLEX_SWEEP["min_head_dim"] or shape.seq_len < FLEX_SWEEP["min_seq"]):
        return "skipped: compile time budget of the sweep (bf16, d >= 64, seq >= 1024 only)"
    if impl in MAX_SEQ and shape.seq_len > MAX_SEQ[impl]:
        return f"skipped: seq_len > {MAX_SEQ[impl]} (minutes per call)"
    if impl == "naive" and shape.batch * shape.heads * shape.seq_len**2 > NAIVE_MAX_SCORES:
        return "skipped: score matrix would not fit (OOM)"
    if impl in ("sdpa_flash", "sdpa_cudnn") and shape.dtype == "fp32":
        return "skipped: backend has no fp32 kernel"
    if impl == "sdpa_flash" and shape.head_dim > 256:
        return "skipped: head dim > 256"
    return None


def _rep_for(impl: str, rep_ms: float) -> float:
    return min(rep_ms, 200.0) if impl in ("naive", "torch_tiled") else rep_ms


def time_impl(impl: str, shape: AttnShape, device: torch.device, modes: tuple[str, ...] = MODES,
              warmup_ms: float = 25, rep_ms: float = 100, compile_apply: bool = False,
              backward_of: str = "random", sweep: bool = False, kernel_time: bool = False) -> dict:
    """One record: median ms and TFLOP/s per mode (and, ``kernel_time``, the kernels' GPU ms per call), or status
    OOM / skipped / error."""
    row, reason = _base_row(impl, shape, compile_apply, sweep)
    if reason:
        return {**row, "status": reason}
    with strict_compile() if impl == "flex" else contextlib.nullcontext():
        return _time_impl(row, impl, shape, device, modes, warmup_ms, rep_ms, compile_apply, backward_of,
                          kernel_time)


def _base_row(impl: str, shape: AttnShape, compile_apply: bool, sweep: bool = False) -> tuple[dict, str | None]:
    """A record's configuration fields, and why ``impl`` is not run at ``shape`` (None: it is)."""
    row = {"impl": impl, **asdict(shape), "compiled_apply": compile_apply}
    if impl == "flex":
        row["flex_compile"] = "fresh per shape"  # the report trusts flex timings only with this mark
    return row, skip_reason(impl, shape, sweep)


@contextlib.contextmanager
def strict_compile():
    """Hitting dynamo's recompile limit raises instead of falling back to eager, and compiled backwards
    keep their buffers (``do_bench`` calls backward repeatedly with ``retain_graph=True``)."""
    import torch._functorch.config

    with contextlib.ExitStack() as stack:
        if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
            stack.enter_context(torch._dynamo.config.patch(fail_on_recompile_limit_hit=True))
        if hasattr(torch._functorch.config, "donated_buffer"):
            stack.enter_context(torch._functorch.config.patch(donated_buffer=False))
        yield


_FLUSH_OP = "bitwise_not"  # the kernel that flushes L2 between profiled calls, told apart from the calls' own


def captured(device: torch.device):
    """Our autograd.Functions planned as in a CUDA graph or a compiled model (``flash_triton.captured_forms``), for
    kernel times: those are what ``flash_auto``'s table chooses from, while ``do_bench`` times the eager call, which
    up to about a wave takes the single-kernel backward for its host time."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from cs336_systems.attention.flash_triton import captured_forms

    return captured_forms()


def kernel_ms(fn: Callable[[], object], device: torch.device, grad_to_none: list[torch.Tensor],
              calls: int = 20, warmup: int = 3) -> float:
    """GPU milliseconds per call of ``fn``'s kernels (and memsets and copies) under ``torch.profiler``: each of
    ``calls`` calls (after ``warmup`` unprofiled ones) after an L2 flush (a 256 MB ``bitwise_not_``, left out of
    the sum) with the gradients of ``grad_to_none`` reset, as ``do_bench`` does. Host time between the kernels is
    not counted."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            for t in grad_to_none:
                t.grad = None
            flush.bitwise_not_()
            fn()
        torch.cuda.synchronize(device)
    gpu_us = sum(e.device_time for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA and _FLUSH_OP not in e.name.lower())
    return gpu_us / calls / 1e3


def sustained_ms(fn: Callable[[], object], device: torch.device, grad_to_none: list[torch.Tensor] | None,
                 seconds: float, warmup_s: float = 0.5) -> float:
    """Milliseconds a call while ``fn`` runs back to back for ``seconds`` (after ``warmup_s``), no L2 flush, a
    synchronisation every 20 calls, the gradients of ``grad_to_none`` reset before each call. Long enough, this is
    the GPU at its power cap, as in a training step, where the clock follows each kernel's energy a call; a short
    ``do_bench`` burst sees boost clocks instead, and the two ratios differ by several percent for attention
    (docs/flash_tuning_notes.md, session 41)."""
    def batch():
        for _ in range(20):
            for t in grad_to_none or ():
                t.grad = None
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        batch()
    n, t0 = 0, time.perf_counter()
    while n == 0 or time.perf_counter() - t0 < seconds:
        batch()
        n += 20
    return 1e3 * (time.perf_counter() - t0) / n


def _calls(impl: str, shape: AttnShape, device: torch.device, compile_apply: bool, backward_of: str,
           inputs: tuple[torch.Tensor, ...] | None = None) -> tuple[dict[str, Callable[[], object]], list]:
    """The timed calls of one implementation: ``{"forward": ..., "backward": ..., "forward_backward": ...}`` on
    ``inputs`` (q, k, v, dO; fresh random ones if None) and the tensors whose gradients each call resets. The
    backward is of one retained forward, built on first use."""
    fn = attention_fn(impl, shape, device, compile_apply)
    if inputs is None:
        inputs = shape_inputs(shape, device)
    q, k, v, do = inputs
    retained = []

    def fwd():
        return fn(q, k, v, shape.causal)

    def bwd():
        if not retained:
            retained.append(fwd())
        retained[0].backward(do, retain_graph=True)

    bwd.release = retained.clear

    def fwd_bwd():
        o = fn(q, k, v, shape.causal)
        if backward_of == "sum":  # the leaderboard's loss
            o.sum().backward()
        else:
            o.backward(do)

    for call in (fwd, bwd, fwd_bwd):  # ``pinned(call)`` around a timing sets an SDPA peer's backend once
        call.sdpa_backend = getattr(fn, "sdpa_backend", None)
    return {"forward": fwd, "backward": bwd, "forward_backward": fwd_bwd}, [q, k, v]


def shape_inputs(shape: AttnShape, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Fresh random q, k, v (requiring gradients) and dO of ``shape``."""
    dtype = DTYPES[shape.dtype]
    q, k, v = (torch.randn(shape.batch, shape.heads, shape.seq_len, shape.head_dim, device=device, dtype=dtype,
                           requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn_like(q)


def _failed(row: dict, err: Exception) -> dict:
    """``row`` marked OOM or with the error's first line (a peer that rejects this configuration)."""
    if is_oom(err):
        return {**row, "status": "OOM"}
    return {**row, "status": f"error: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"}


def _add_tflops(row: dict, shape: AttnShape, modes: tuple[str, ...]) -> None:
    for mode in modes:
        ms = row.get(f"{mode}_ms")
        if ms is not None:
            row[f"{mode}_tflops"] = shape.flops(mode) / (ms * 1e-3) / 1e12


def _time_impl(row: dict, impl: str, shape: AttnShape, device: torch.device, modes: tuple[str, ...],
               warmup_ms: float, rep_ms: float, compile_apply: bool, backward_of: str, kernel_time: bool) -> dict:
    from triton.testing import do_bench

    try:
        calls, grads = _calls(impl, shape, device, compile_apply, backward_of)
        rep, warm = _rep_for(impl, rep_ms), min(warmup_ms, _rep_for(impl, rep_ms))
        with pinned(calls["forward"]):
            for mode in modes:
                row[f"{mode}_ms"] = do_bench(calls[mode], warmup=warm, rep=rep, return_mode="median",
                                             grad_to_none=None if mode == "forward" else grads)
                if mode == "backward":
                    calls["backward"].release()  # the retained forward's memory, before forward+backward is timed
            if kernel_time:
                with captured(device):
                    for mode in modes:
                        if mode != "backward":
                            row[f"{mode}_kernel_ms"] = kernel_ms(calls[mode], device, grads)
        _add_tflops(row, shape, modes)
        row["status"] = "ok"
    except Exception as err:  # an OOM, or a peer that rejects this configuration: recorded, sweep goes on
        row = _failed(row, err)
    finally:
        torch.cuda.empty_cache()
    return row


def time_interleaved(impls: list[str], shape: AttnShape, device: torch.device,
                     modes: tuple[str, ...] = ("forward", "forward_backward"), rounds: int = 5,
                     warmup_ms: float = 100, rep_ms: float = 300, kernel_time: bool = False,
                     bench: Callable | None = None, kernel_timer: Callable | None = None,
                     sustained_s: float = 0.0, sustained_rounds: int = 2,
                     sustained_timer: Callable | None = None) -> list[dict]:
    """One record per implementation, all on the same inputs, timed in ``rounds`` interleaved rounds: each round
    runs every implementation's ``bench`` (``do_bench``, ``rep_ms / rounds`` each) in an order rotated by one per
    round, and ``{mode}_ms`` is the median of the rounds (each round's in ``{mode}_ms_rounds``). Where the host
    sets the pace its speed drifts by 2x within a run; interleaving makes every implementation see the same
    drift, so their ratio holds where back-to-back medians did not. ``kernel_time``: then as many interleaved
    rounds of ``kernel_timer`` (``kernel_ms``, 20 profiled calls an implementation in all), ``{mode}_kernel_ms``
    their median and ``{mode}_kernel_ms_rounds`` the rounds: the GPU's clocks drift with its power and temperature
    over a run, by a few percent at the long shapes, and timing one implementation's kernels after another's would
    put that drift into their ratio. ``sustained_s`` > 0: then ``sustained_rounds`` interleaved rounds of
    ``sustained_timer`` (``sustained_ms``, that many seconds a round and mode), ``{mode}_sustained_ms`` their median:
    the implementations at the GPU's power cap."""
    if rounds < 1 or sustained_rounds < 1:
        raise ValueError(f"time_interleaved: rounds and sustained_rounds must be >= 1, got {rounds} and "
                         f"{sustained_rounds}")
    if not sustained_s >= 0:  # also refuses nan
        raise ValueError(f"time_interleaved: sustained_s must be >= 0, got {sustained_s}")
    if bench is None:
        from triton.testing import do_bench as bench
    rows, live = {}, {}
    inputs = shape_inputs(shape, device)
    with strict_compile() if "flex" in impls else contextlib.nullcontext():
        for impl in impls:
            row, reason = _base_row(impl, shape, compile_apply=False)
            row["rounds"] = rounds
            if reason:
                rows[impl] = {**row, "status": reason}
                continue
            try:
                calls, grads = _calls(impl, shape, device, False, "random", inputs)
                with pinned(calls["forward"]):
                    for mode in modes:  # compile, autotune and first-launch work stay out of the rounds
                        bench(calls[mode], warmup=min(warmup_ms, rep_ms), rep=min(warmup_ms, rep_ms),
                              return_mode="median", grad_to_none=grads)
                rows[impl], live[impl] = row, (calls, grads)
            except Exception as err:
                rows[impl] = _failed(row, err)
        for _, impl in _interleaved(live, rounds):
            calls, grads = live[impl]
            try:
                with pinned(calls["forward"]):
                    for mode in modes:
                        ms = bench(calls[mode], warmup=min(25.0, rep_ms / rounds), rep=rep_ms / rounds,
                                   return_mode="median", grad_to_none=None if mode == "forward" else grads)
                        rows[impl].setdefault(f"{mode}_ms_rounds", []).append(ms)
            except Exception as err:
                rows[impl] = _failed(rows[impl], err)
                del live[impl]
        whole = [m for m in modes if m != "backward"]  # a backward alone is timed by do_bench only
        timed = whole if kernel_time else []
        timer = kernel_timer or kernel_ms
        per_round = -(-20 // rounds)
        for r, impl in _interleaved(live, rounds if timed else 0):
            calls, grads = live[impl]
            try:
                with pinned(calls["forward"]), captured(device):
                    for mode in timed:
                        ms = timer(calls[mode], device, grads, calls=per_round, warmup=3 if r == 0 else 1)
                        rows[impl].setdefault(f"{mode}_kernel_ms_rounds", []).append(ms)
            except Exception as err:
                rows[impl] = _failed(rows[impl], err)
                del live[impl]
        sustained = whole if sustained_s > 0 else []
        held = sustained_timer or sustained_ms
        for _, impl in _interleaved(live, sustained_rounds if sustained else 0):
            calls, grads = live[impl]
            try:
                with pinned(calls["forward"]):
                    for mode in sustained:
                        ms = held(calls[mode], device, None if mode == "forward" else grads, sustained_s)
                        rows[impl].setdefault(f"{mode}_sustained_ms_rounds", []).append(ms)
            except Exception as err:
                rows[impl] = _failed(rows[impl], err)
                del live[impl]
        for impl in live:
            row = rows[impl]
            try:
                for mode in modes:
                    row[f"{mode}_ms"] = statistics.median(row[f"{mode}_ms_rounds"])
                for mode in timed:
                    row[f"{mode}_kernel_ms"] = statistics.median(row[f"{mode}_kernel_ms_rounds"])
                for mode in sustained:
                    row[f"{mode}_sustained_ms"] = statistics.median(row[f"{mode}_sustained_ms_rounds"])
                _add_tflops(row, shape, modes)
                row["status"] = "ok"
            except Exception as err:
                rows[impl] = _failed(row, err)
    del live, inputs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return [rows[i] for i in impls]


def _interleaved(live: dict, rounds: int):
    """(round, implementation): every implementation of ``live`` once a round, in an order rotated by one per round;
    one removed from ``live`` meanwhile (it failed) is not visited again."""
    for r in range(rounds):
        order = list(live)
        shift = r % len(order) if order else 0
        for impl in order[shift:] + order[:shift]:
            if impl in live:
                yield r, impl


def sweep_shapes(seq_lens, head_dims, dtypes) -> list[AttnShape]:
    return [AttnShape(1, 1, n, d, dt) for dt in dtypes for d in head_dims for n in seq_lens]


# The leaderboard configuration (handout: 16 heads x 16,384 x d 64, bf16, causal, compiled apply,
# o.sum().backward()), plus the two others the issue sets targets for.
LEADERBOARD_SHAPES = {
    "leaderboard": AttnShape(1, 16, 16384, 64),
    "d128": AttnShape(1, 16, 4096, 128),
    "long": AttnShape(1, 1, 65536, 64),
}


# Issue 18's shapes (the attention of the models we train, the leaderboards, the per-call floor), timed
# eagerly (``o.backward(do)``) with every peer in the same process on the same inputs.
MODEL_SHAPES = {
    "lb2025": AttnShape(1, 16, 16384, 64),
    "lb2026": AttnShape(2, 32, 32768, 128),
    "d128_4k": AttnShape(1, 16, 4096, 128),
    "noncausal_2k": AttnShape(8, 16, 2048, 128, causal=False),
    "xl_2048": AttnShape(4, 25, 2048, 64),
    "xl_512": AttnShape(4, 25, 512, 64),
    "small_512": AttnShape(8, 12, 512, 64),
    "floor": AttnShape(1, 1, 128, 64),
}
PEERS = ("sdpa_cudnn", "sdpa_flash", "flex")


def versus_peers(rows: list[dict], modes: tuple[str, ...] = ("forward", "forward_backward"),
                 is_ours: Callable[[dict], bool] = lambda r: r["impl"] == "triton",
                 is_peer: Callable[[dict], bool] = lambda r: r["impl"] in PEERS) -> list[dict]:
    """Per config: ours and the fastest peer per mode (of the rows that ran) and the ratio ours / best."""
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        group = [r for r in rows if r["config"] == config and r.get("status") == "ok"]
        ours = next((r for r in group if is_ours(r)), None)
        row = {"config": config}
        for mode in modes:
            peers = [(r[f"{mode}_ms"], r["impl"]) for r in group if is_peer(r) and f"{mode}_ms" in r]
            if ours is None or not peers or f"{mode}_ms" not in ours:
                continue
            best_ms, best = min(peers)
            row.update({f"{mode}_ours_ms": ours[f"{mode}_ms"], f"{mode}_best_peer": best,
                        f"{mode}_best_ms": best_ms, f"{mode}_ratio": ours[f"{mode}_ms"] / best_ms})
        out.append(row)
    return out


def auto_table(rows: list[dict], device_name: str, records: str) -> dict:
    """The ``flash_auto`` backend's table: per measured shape, ours and the fastest SDPA backend, by name
    (forward+backward of the same run). The calls' kernel time where every row has it (``measure``
    "kernel_ms"): what a step pays inside the CUDA graph or compiled model that ``train`` runs on CUDA, and
    steady where ``do_bench`` times the host (the short shapes, whose do_bench medians move by 2x between runs);
    otherwise do_bench's medians ("do_bench_ms")."""
    shapes = []
    for config in dict.fromkeys(r["config"] for r in rows):
        group = {r["impl"]: r for r in rows if r["config"] == config and r.get("status") == "ok"}
        names = [i for i in ("triton", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient") if i in group]
        if "triton" not in names or len(names) == 1:
            continue
        kernel = all("forward_backward_kernel_ms" in group[i] for i in names)
        key = "forward_backward_kernel_ms" if kernel else "forward_backward_ms"
        sdpa_ms, backend = min((group[i][key], i) for i in names[1:])
        r = group["triton"]
        shapes.append({"config": config, "batch_heads": r["batch"] * r["heads"], "seq_len": r["seq_len"],
                       "head_dim": r["head_dim"], "dtype": str(DTYPES[r["dtype"]]).removeprefix("torch."),
                       "causal": r["causal"], "ours_ms": r[key], "sdpa_ms": sdpa_ms, "sdpa_backend": backend,
                       "measure": "kernel_ms" if kernel else "do_bench_ms"})
    return {"device": device_name, "records": records, "shapes": shapes}


def merge_auto_table(existing: dict | None, table: dict) -> dict:
    """The table file with ``table`` in it: ``existing`` (a table file in either format, or None) with the entry of
    ``table``'s GPU model replaced, or ``table`` appended, the other models' tables kept (each GPU model is
    measured on its own host). ValueError where ``existing`` is not a table file."""
    tables = [] if existing is None else auto_tables(existing)
    at = next((i for i, t in enumerate(tables) if t["device"] == table["device"]), len(tables))  # keeps its place
    others = [t for t in tables if t["device"] != table["device"]]
    return {"tables": [*others[:at], table, *others[at:]]}


def seq_lens_pow2(lo: int = 128, hi: int = 65536) -> list[int]:
    return [2**i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1)]
