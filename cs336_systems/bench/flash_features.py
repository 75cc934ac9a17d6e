"""Attention features (issue 21): grouped-query heads, a sliding window, packed documents. Ours
(``cs336_systems.attention.flash_attention``) against PyTorch's peers at the issue's three shapes.

Every implementation of a shape runs in one process on the same inputs (drawn once, seed 0), forward and
forward+backward (``o.backward(do)``), timed by ``triton.testing.do_bench`` (median); on a CPU (the tests)
by the host clock between synchronisations. What is visible is decided by one predicate (:func:`mask_mod`),
from which FlexAttention's block mask, SDPA's dense boolean mask and the count of visible (query, key)
pairs are all built, so every peer computes the same attention; each row records its largest difference
from ours (``max_abs_diff``, ``diff_against``).

Window convention (the issue's): ``window=(left, right)`` lets query i see keys j with
i - left <= j <= i + right, positions top-left aligned as ``is_causal`` is. "A window of 4,096, causal" is
``(4096, 0)``: keys i-4096..i, 4,097 of them.

Implementations (``impl``) and their role:
- ``triton`` (role ``ours``);
- ``flex``: ``torch.compile(flex_attention)``, compiled afresh per shape, with a block mask built from the
  predicate (``enable_gqa`` for grouped heads); on a CPU eager and forward only (no CPU backward);
- ``sdpa_<backend>`` (cudnn, flash, efficient, math): ``F.scaled_dot_product_attention(is_causal=...)``
  pinned to one backend, ``enable_gqa`` for grouped heads. On a shape with a window or documents this is
  plain causal attention: role ``reference`` (what the mask saves), not a peer;
- ``sdpa_<backend>_mask``: the same with an explicit dense boolean mask, (N, N) or (B, 1, N, N) with
  documents.
Building a block mask or a dense mask is not timed (``mask_build_ms`` records it apart). The ratio
"ours / fastest peer" uses role ``peer`` only. A configuration a backend refuses is recorded with its
error, an out-of-memory one as ``OOM``; the run goes on.

FLOPs count visible pairs only (:func:`feature_flops`): the flash-attention convention (4 * d per
(query, key) pair and head for the forward's two matmuls, x2.5 for the backward, x3.5 for both) with the
pairs counted instead of assumed (a causal mask's N(N+1)/2 rather than N^2/2).
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cs336_systems.bench.e2e import is_oom
from cs336_systems.bench.flash import DTYPES, pinned, sdpa_on, strict_compile, versus_peers
from cs336_systems.bench.harness import timed

SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math")
FEATURE_IMPLS = ("triton", "flex", *(f"sdpa_{b}" for b in SDPA_BACKENDS), *(f"sdpa_{b}_mask" for b in SDPA_BACKENDS))
MODES = ("forward", "forward_backward")
DOC_SEED = 0  # the packed documents' lengths: drawn once from torch.Generator().manual_seed(DOC_SEED)
INPUT_SEED = 0
# Rows of the predicate evaluated at once when counting visible pairs or building a dense mask.
_MASK_CHUNK = 1024


@dataclass(frozen=True)
class FeatureShape:
    """One attention configuration: q (batch, q_heads, seq_len, head_dim), k and v with kv_heads;
    ``window`` (left, right) or None; ``n_docs`` packed documents per sequence or None."""

    batch: int
    q_heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    causal: bool = True
    window: tuple[int, int] | None = None
    n_docs: int | None = None
    dtype: str = "bf16"

    def __post_init__(self):
        for name in ("batch", "q_heads", "kv_heads", "seq_len", "head_dim"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"FeatureShape.{name} must be a positive int, got {getattr(self, name)!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.window is not None and (len(self.window) != 2 or min(self.window) < 0):
            raise ValueError(f"window must be (left, right) with non-negative sides or None, got {self.window!r}")
        if self.n_docs is not None and not 1 <= self.n_docs <= self.seq_len:
            raise ValueError(f"n_docs must be in 1..seq_len ({self.seq_len}) or None, got {self.n_docs!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def masked(self) -> bool:
        """Whether more than ``is_causal`` decides what is visible."""
        return self.window is not None or self.n_docs is not None


# The targets (bf16, causal).
FEATURE_SHAPES = {
    "gqa": FeatureShape(2, 32, 8, 8192, 128),
    "window": FeatureShape(1, 16, 16, 32768, 128, window=(4096, 0)),
    "docs": FeatureShape(4, 16, 16, 8192, 64, n_docs=8),
}


def doc_lengths(batch: int, seq_len: int, n_docs: int, seed: int = DOC_SEED) -> list[list[int]]:
    """Per sequence, ``n_docs`` uneven lengths summing to ``seq_len``: n_docs - 1 distinct cut points
    drawn uniformly (each document at least one token). Deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        cuts = sorted((torch.randperm(seq_len - 1, generator=g)[: n_docs - 1] + 1).tolist())
        bounds = [0, *cuts, seq_len]
        out.append([b - a for a, b in itertools.pairwise(bounds)])
    return out


def doc_ids_of(lengths: list[list[int]], device: torch.device | str) -> torch.Tensor:
    """(batch, seq_len) int32 document index of every position."""
    rows = [torch.repeat_interleave(torch.arange(len(ls)), torch.tensor(ls)) for ls in lengths]
    return torch.stack(rows).to(device=device, dtype=torch.int32)


def mask_mod(causal: bool, window: tuple[int, int] | None, doc_ids: torch.Tensor | None) -> Callable:
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool``: the pairs ours computes. Written in tensor
    operations only, so it also evaluates on broadcast index tensors (dense masks, pair counts)."""

    def visible(b, h, q_idx, kv_idx):
        keep = q_idx >= 0
        if causal:
            keep = keep & (kv_idx <= q_idx)
        if window is not None:
            keep = keep & (kv_idx >= q_idx - window[0]) & (kv_idx <= q_idx + window[1])
        if doc_ids is not None:
            keep = keep & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])
        return keep

    return visible


def _mask_rows(fn: Callable, batch: int, n: int, device, start: int, stop: int) -> torch.Tensor:
    """(batch, stop - start, n) bool: rows start..stop of the dense mask of every sequence."""
    b = torch.arange(batch, device=device)[:, None, None]
    q = torch.arange(start, stop, device=device)[None, :, None]
    kv = torch.arange(n, device=device)[None, None, :]
    return fn(b, None, q, kv).expand(batch, stop - start, n)


def dense_mask(fn: Callable, batch: int, n: int, device) -> torch.Tensor:
    """SDPA's boolean mask (True = attend), (batch, 1, n, n); pass batch=1 for one mask shared by the batch."""
    out = torch.empty(batch, 1, n, n, dtype=torch.bool, device=device)
    for s in range(0, n, _MASK_CHUNK):
        out[:, 0, s:s + _MASK_CHUNK] = _mask_rows(fn, batch, n, device, s, min(n, s + _MASK_CHUNK))
    return out


def visible_pairs(fn: Callable, batch: int, n: int, device) -> int:
    """Visible (query, key) pairs summed over the batch (one head)."""
    return sum(int(_mask_rows(fn, batch, n, device, s, min(n, s + _MASK_CHUNK)).sum())
               for s in range(0, n, _MASK_CHUNK))


def feature_flops(pairs: int, q_heads: int, head_dim: int, mode: str) -> float:
    """Matmul FLOPs over ``pairs`` visible pairs (summed over the batch) per head: 2 * d for QK^T and 2 * d
    for PV per pair (forward), x2.5 for the backward's five matmuls, x3.5 for both."""
    return 4.0 * pairs * q_heads * head_dim * {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}[mode]


def role_of(impl: str, shape: FeatureShape) -> str:
    if impl == "triton":
        return "ours"
    if impl.startswith("sdpa_") and not impl.endswith("_mask") and shape.masked:
        return "reference"
    return "peer"


def default_impls(shape: FeatureShape, device: torch.device) -> list[str]:
    """Ours, FlexAttention, and SDPA where it applies: on CUDA its backends with ``is_causal`` (peers for
    grouped heads; the causal reference on a masked shape: cuDNN and flash) and, on a masked shape, with a
    dense mask (efficient and cuDNN: the backends that take a mask); on a CPU the math backend."""
    if device.type != "cuda":
        return ["triton", "flex", "sdpa_math", *(["sdpa_math_mask"] if shape.masked else [])]
    if not shape.masked:
        return ["triton", "flex", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient"]
    return ["triton", "flex", "sdpa_efficient_mask", "sdpa_cudnn_mask", "sdpa_cudnn", "sdpa_flash"]


def _sdpa_fn(backend: str, shape: FeatureShape, mask: torch.Tensor | None) -> Callable:
    from torch.nn.attention import SDPBackend

    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    # enable_gqa only where the heads differ: some backends refuse the flag itself.
    gqa = {"enable_gqa": True} if shape.q_heads != shape.kv_heads else {}

    def fn(q, k, v):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, **gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **gqa)

    return sdpa_on(chosen, fn)  # the backend pinned once around each timing (_measure), not per call


def _flex_fn(shape: FeatureShape, visible: Callable, per_batch: bool, device: torch.device, compiled: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    block_mask = create_block_mask(visible, B=shape.batch if per_batch else None, H=None, Q_LEN=shape.seq_len,
                                   KV_LEN=shape.seq_len, device=device)
    attend = flex_attention
    if compiled:
        # A fresh dynamo cache per shape: past its recompile limit dynamo runs flex_attention eagerly (see
        # bench.flash._flex), and the timed calls run under strict_compile, which makes that an error.
        torch._dynamo.reset()
        attend = torch.compile(flex_attention, dynamic=False)
    gqa = {"enable_gqa": True} if shape.q_heads != shape.kv_heads else {}

    def fn(q, k, v):
        return attend(q, k, v, block_mask=block_mask, **gqa)

    return fn


def _ours_fn(shape: FeatureShape, doc_ids: torch.Tensor | None) -> Callable:
    from cs336_systems.attention import flash_attention  # lands with issue 21's kernel

    def fn(q, k, v):
        return flash_attention(q, k, v, shape.causal, window=shape.window, doc_ids=doc_ids)

    return fn


def _median_ms(fn: Callable, device: torch.device, warmup_ms: float, rep_ms: float, grads: list,
               cpu_reps: int) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, return_mode="median")
    fn()  # warm-up
    times = []
    for _ in range(cpu_reps):
        for x in grads:
            x.grad = None
        times.append(timed(fn, device)[0])
    return 1e3 * statistics.median(times)


def _describe_mask(impl: str, shape: FeatureShape, mask_bytes: int | None) -> str:
    """How an implementation is told what is visible (a column of the report)."""
    if impl == "triton":
        given = [name for name, on in (("is_causal", shape.causal), ("window", shape.window is not None),
                                       ("doc_ids", shape.n_docs is not None),
                                       ("grouped kv heads", shape.q_heads != shape.kv_heads)) if on]
        return "native: " + (", ".join(given) or "none")
    if impl == "flex":
        return "block mask from the predicate"
    if mask_bytes is not None:
        size = f"{mask_bytes / 2**30:.2f} GiB" if mask_bytes >= 2**30 else f"{mask_bytes / 2**20:.3g} MiB"
        return f"dense bool mask ({size})"
    plain = "is_causal" if shape.causal else "none"
    return f"{plain} only (no window, no documents)" if shape.masked else plain


def _build(impl: str, shape: FeatureShape, visible: Callable, doc_ids: torch.Tensor | None, device: torch.device,
           compile_flex: bool) -> tuple[Callable, float | None, torch.Tensor | None]:
    """(fn(q, k, v) -> o, milliseconds spent building its mask or None, its dense mask or None)."""
    if impl == "triton":
        return _ours_fn(shape, doc_ids), None, None
    if impl == "flex":
        t, fn = timed(lambda: _flex_fn(shape, visible, doc_ids is not None, device, compile_flex), device)
        return fn, 1e3 * t, None
    backend = impl.removeprefix("sdpa_").removesuffix("_mask")
    if not impl.endswith("_mask"):
        return _sdpa_fn(backend, shape, None), None, None
    mask_batch = shape.batch if doc_ids is not None else 1
    t, mask = timed(lambda: dense_mask(visible, mask_batch, shape.seq_len, device), device)
    return _sdpa_fn(backend, shape, mask), 1e3 * t, mask


@dataclass
class _Setup:
    """What every implementation of one shape shares: inputs, the predicate, and ours' output."""

    shape: FeatureShape
    device: torch.device
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    doc_ids: torch.Tensor | None
    visible: Callable
    compile_flex: bool
    first_out: torch.Tensor | None = None
    first_impl: str | None = None


def _measure(row: dict, impl: str, s: _Setup, warmup_ms: float, rep_ms: float, cpu_reps: int) -> None:
    """Fill ``row`` with ``impl``'s timings (and its difference from the first output), or its failure."""
    modes = ("forward",) if impl == "flex" and s.device.type != "cuda" else MODES
    if modes != MODES:
        row["note"] = "FlexAttention has no backward on a CPU: forward only"
    q, k, v = (s.q, s.k, s.v) if "forward_backward" in modes else (s.q.detach(), s.k.detach(), s.v.detach())
    caught: list[warnings.WarningMessage] = []
    try:
        with strict_compile() if impl == "flex" and s.compile_flex else contextlib.nullcontext():
            # A backend's reasons for refusing come as warnings (kept for the record), at the first call.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn, build_ms, mask = _build(impl, s.shape, s.visible, s.doc_ids, s.device, s.compile_flex)
                out = fn(q, k, v).detach()  # also the compile: outside the timing
            if build_ms is not None:
                row["mask_build_ms"] = build_ms
            row["mask"] = _describe_mask(impl, s.shape, mask.numel() if mask is not None else None)
            if row["role"] != "reference":
                if s.first_out is None:
                    s.first_out, s.first_impl = out, impl
                else:
                    row["max_abs_diff"] = (out.float() - s.first_out.float()).abs().max().item()
                    row["diff_against"] = s.first_impl
            del out

            def fwd_bwd():
                fn(q, k, v).backward(s.do)

            with pinned(fn):
                row["forward_ms"] = _median_ms(lambda: fn(q, k, v), s.device, warmup_ms, rep_ms, [], cpu_reps)
                if "forward_backward" in modes:
                    row["forward_backward_ms"] = _median_ms(fwd_bwd, s.device, warmup_ms, rep_ms, [q, k, v],
                                                            cpu_reps)
        for mode in modes:
            flops = feature_flops(row["visible_pairs"], s.shape.q_heads, s.shape.head_dim, mode)
            row[f"{mode}_tflops"] = flops / (row[f"{mode}_ms"] * 1e-3) / 1e12
        row["status"] = "ok"
    except Exception as err:  # a backend that refuses this configuration, or an OOM: recorded, the run goes on
        if is_oom(err):
            row["status"] = "OOM"
        else:
            first_line = str(err).splitlines()[0][:160] if str(err) else ""
            row["status"] = f"error: {type(err).__name__}: {first_line}"
            reasons = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
            if reasons:  # SDPA says in warnings why each backend was not used
                row["error"] = " | ".join(dict.fromkeys(reasons))[:600]
    finally:
        for x in (s.q, s.k, s.v):
            x.grad = None
        if s.device.type == "cuda":
            torch.cuda.empty_cache()


def run_shape(config: str, shape: FeatureShape, device: torch.device | str, impls: Sequence[str] | None = None,
              warmup_ms: float = 100.0, rep_ms: float = 300.0, compile_flex: bool | None = None,
              cpu_reps: int = 3, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Time ``impls`` (default :func:`default_impls`) at one shape on the same inputs: one record per
    implementation (``on_row`` sees each as it is measured). Ours runs first: the others' outputs are
    compared with its forward output (or with the first that ran, without ours)."""
    device = torch.device(device)
    impls = list(impls) if impls is not None else default_impls(shape, device)
    unknown = [i for i in impls if i not in FEATURE_IMPLS]
    if unknown:
        raise ValueError(f"unknown implementation {unknown[0]!r}; choose from {', '.join(FEATURE_IMPLS)}")
    impls.sort(key=lambda i: i != "triton")
    compile_flex = device.type == "cuda" if compile_flex is None else compile_flex
    dtype = DTYPES[shape.dtype]

    lengths = doc_lengths(shape.batch, shape.seq_len, shape.n_docs) if shape.n_docs else None
    doc_ids = doc_ids_of(lengths, device) if lengths else None
    visible = mask_mod(shape.causal, shape.window, doc_ids)
    mask_batch = shape.batch if doc_ids is not None else 1
    pairs = visible_pairs(visible, mask_batch, shape.seq_len, device) * (shape.batch // mask_batch)
    causal_pairs = shape.batch * (shape.seq_len * (shape.seq_len + 1) // 2 if shape.causal else shape.seq_len**2)

    g = torch.Generator(device=device).manual_seed(INPUT_SEED)
    q = torch.randn(shape.batch, shape.q_heads, shape.seq_len, shape.head_dim, generator=g, device=device, dtype=dtype)
    k, v = (torch.randn(shape.batch, shape.kv_heads, shape.seq_len, shape.head_dim, generator=g, device=device,
                        dtype=dtype) for _ in range(2))
    do = torch.randn(q.shape, generator=g, device=device, dtype=dtype)
    setup = _Setup(shape, device, q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do, doc_ids, visible,
                   compile_flex)

    base = {"config": config, "dtype": shape.dtype, "batch": shape.batch, "q_heads": shape.q_heads,
            "kv_heads": shape.kv_heads, "seq_len": shape.seq_len, "head_dim": shape.head_dim, "causal": shape.causal,
            "window_left": shape.window[0] if shape.window else None,
            "window_right": shape.window[1] if shape.window else None, "n_docs": shape.n_docs,
            "doc_lengths": lengths, "doc_seed": DOC_SEED if lengths else None}
    rows = []
    for impl in impls:
        role = role_of(impl, shape)
        row_pairs = causal_pairs if role == "reference" else pairs
        row = {**base, "impl": impl, "role": role, "visible_pairs": row_pairs,
               "visible_fraction": row_pairs / (shape.batch * shape.seq_len**2)}
        if impl == "flex":
            row["flex_compile"] = "fresh per shape" if compile_flex else "eager"
        _measure(row, impl, setup, warmup_ms, rep_ms, cpu_reps)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def versus_fastest_peer(rows: list[dict]) -> list[dict]:
    """Per config: ours and the fastest peer of the same rows, per mode, and the ratio ours / peer (reference
    rows are not peers)."""
    return versus_peers(rows, MODES, is_ours=lambda r: r["role"] == "ours", is_peer=lambda r: r["role"] == "peer")
