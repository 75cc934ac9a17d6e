"""``flash_attention``'s features (grouped-query heads, sliding windows, packed documents) against an fp64
reference built with an explicit boolean mask.

CPU: the Triton kernels run in Triton's interpreter (enabled before import when there is no CUDA device) on
fp32 inputs with 16 x 16 tiles (and other tile shapes through the launchers), so lengths of a few dozen cross
several tiles and every kind of tile (skipped, masked, unmasked) occurs. The only error is fp32 rounding over
sums of at most a few hundred O(1) terms: 1e-4 is ample and far below any masking mistake (which moves a
softmax weight of order 1/N).

GPU (``-m gpu``): bf16 at larger sizes, our error against the fp64 reference at most twice PyTorch's own bf16
error (SDPA with ``enable_gqa`` and the same explicit mask, in bf16) plus the dtype's rounding step.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are decorated (import of flash_triton)

from cs336_systems.attention import flash_attention
from cs336_systems.attention._tuning import FlashConfig, KernelConfig
from cs336_systems.attention.flash_triton import FlashAttention2Triton, flash_backward, flash_forward

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("O", "L", "dQ", "dK", "dV")
BACKWARDS = ("atomic", "deterministic", "single")  # the fused five-matmul kernel, the atomic-free pair, one kernel


def reference_mask(n_q, n_k, is_causal=False, window=None, doc_ids=None, device=DEVICE):
    """True where query i may attend key j: (1, 1, Nq, Nk), or (B, 1, N, N) with doc_ids."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    mask = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    if is_causal:
        mask &= j <= i
    if window is not None:
        mask &= (j >= i - window[0]) & (j <= i + window[1])
    mask = mask[None, None]
    if doc_ids is not None:
        mask = mask & (doc_ids[:, None, :, None] == doc_ids[:, None, None, :])
    return mask


def reference(q, k, v, mask, scale=None, dtype=torch.float64):
    """(O, L) of masked attention in ``dtype``, k/v heads repeated for their query-head group; a row that sees
    no key gets O = 0 and L = -inf (and no gradient)."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    seen = mask.any(-1, keepdim=True)
    p = torch.softmax(torch.where(seen, s, 0.0), dim=-1)  # rows that see nothing: no NaN in the graph
    return torch.where(seen, p @ v, 0.0), lse


def run_reference(q, k, v, do, mask, scale=None, dtype=torch.float64):
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    o, lse = reference(q, k, v, mask, scale, dtype)
    o.backward(do.to(dtype))
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def run_ours(q, k, v, do, is_causal=False, **kwargs):
    """(O, L, dQ, dK, dV) of flash_attention; L read from the saved tensors."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = flash_attention(q, k, v, is_causal, **kwargs)
    lse = o.grad_fn.saved_tensors[0]
    assert lse.shape == q.shape[:-1]
    o.backward(do)
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def packed_ids(batch, lengths, device=DEVICE):
    """doc_ids of sequences packed from documents of the given lengths (one list per batch row, or one for all)."""
    rows = lengths if isinstance(lengths[0], list | tuple) else [lengths] * batch
    return torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in rows]).to(device)


def make_inputs(b, hq, hkv, n_q, n_k, d, dtype=torch.float32):
    q = torch.randn(b, hq, n_q, d, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(b, hkv, n_k, d, device=DEVICE, dtype=dtype) for _ in range(2))
    return q, k, v, torch.randn_like(q)


def assert_matches(ours, ref, rows=slice(None), what=""):
    """Each of O, L, dQ, dK, dV (restricted to ``rows`` along the sequence) within fp32 rounding of the fp64
    reference; L may be -inf (rows that see no key) and must then be -inf in both."""
    for name, a, b in zip(NAMES, ours, ref, strict=True):
        assert a.shape == b.shape, f"{what}{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
        a, b = a.double(), b
        if name == "L":
            a, b = a[..., rows], b[..., rows]
        else:
            a, b = a[..., rows, :], b[..., rows, :]
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{what}{n}: {m}")


# (batch, Hq, Hkv, Nq, Nk, d, causal, window, docs): docs is None, a list of document lengths, or "unsorted"
CASES = {
    "mqa_group4_causal": (1, 4, 1, 37, 37, 16, True, None, None),
    "gqa_odd_d_nq_ne_nk": (1, 4, 2, 33, 50, 24, False, None, None),
    "gqa_nk_lt_nq_causal": (1, 2, 1, 50, 29, 16, True, None, None),
    "window_causal_small": (1, 1, 1, 61, 61, 16, True, (5, 0), None),  # narrower than a tile
    "window_causal_wide_gqa": (1, 2, 1, 70, 70, 16, True, (37, 0), None),
    "window_longer_than_seq": (1, 1, 1, 40, 40, 16, True, (500, 3), None),
    "window_two_sided": (1, 2, 1, 53, 53, 32, False, (3, 7), None),
    "window_two_sided_wide": (1, 1, 1, 64, 64, 16, False, (20, 17), None),
    "window_right_only": (1, 1, 1, 50, 50, 16, False, (100, 0), None),
    "window_nq_gt_nk_empty_rows": (1, 2, 1, 60, 21, 16, False, (4, 2), None),
    "window_causal_nq_ne_nk": (1, 1, 1, 30, 47, 16, True, (9, 0), None),
    "docs_packed_causal": (1, 2, 2, 61, 61, 16, True, None, [5, 20, 1, 35]),
    "docs_packed_bidirectional": (1, 1, 1, 48, 48, 16, False, None, [16, 16, 3, 13]),
    "docs_per_row_lengths": (2, 1, 1, 40, 40, 16, True, None, [[40], [7, 9, 24]]),
    "docs_unsorted": (2, 1, 1, 39, 39, 16, True, None, "unsorted"),
    "docs_unsorted_window": (1, 2, 1, 35, 35, 16, False, (6, 4), "unsorted"),
    "docs_window_gqa": (2, 2, 1, 49, 49, 16, True, (10, 0), [22, 2, 25]),
    "docs_window_two_sided": (1, 1, 1, 45, 45, 16, False, (8, 3), [11, 20, 14]),
}


def _case_inputs(case):
    b, hq, hkv, n_q, n_k, d, causal, window, docs = CASES[case]
    q, k, v, do = make_inputs(b, hq, hkv, n_q, n_k, d)
    if docs is None:
        doc_ids = None
    elif docs == "unsorted":
        doc_ids = torch.randint(0, 3, (b, n_q), device=DEVICE)
    else:
        doc_ids = packed_ids(b, docs)
    return q, k, v, do, causal, window, doc_ids


@pytest.mark.parametrize("case", list(CASES))
def test_features_match_fp64_reference(case, seed):
    """The default (atomic dQ) backward; the deterministic one runs in test_kernel_forms_and_tile_shapes."""
    q, k, v, do, causal, window, doc_ids = _case_inputs(case)
    ours = run_ours(q, k, v, do, causal, window=window, doc_ids=doc_ids)
    ref = run_reference(q, k, v, do, reference_mask(q.shape[-2], k.shape[-2], causal, window, doc_ids))
    assert_matches(ours, ref)


def test_rows_that_see_no_key_get_zero_output_and_minus_inf_l(seed):
    q, k, v, do = make_inputs(1, 2, 1, 40, 10, 16)
    o, lse, dq, dk, dv = run_ours(q, k, v, do, window=(3, 0))
    empty = torch.arange(40) > 12  # i - 3 > 9: past the last key
    assert torch.equal(o[..., empty, :], torch.zeros_like(o[..., empty, :]))
    assert torch.isneginf(lse[..., empty]).all() and torch.isfinite(lse[..., ~empty]).all()
    assert torch.equal(dq[..., empty, :], torch.zeros_like(dq[..., empty, :]))
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()


# (label, q/k/v shapes, causal, window, doc lengths, rows checked): NaN is written into K and V rows that no
# checked query may see through any tile it loads; a kernel that loaded such a tile would spread the NaN (a
# masked score is -inf, but its probability 0 times a NaN value is NaN).
SKIP_CASES = {
    # 16-row tiles: queries >= 32 see keys >= 16 only, and their key tiles start at 16
    "window": ((1, 2, 2, 64, 64, 16), True, (16, 0), None, slice(32, None), slice(0, 16)),
    # documents [0, 32) and [32, 64): nothing of the second document is loaded for the first
    "docs": ((1, 2, 1, 64, 64, 16), True, None, [32, 32], slice(0, 32), slice(32, 64)),
    # queries see keys i .. i + 3 < 19 of 64: key tiles from 32 on are never needed
    "window_nk_gt_nq": ((1, 2, 2, 16, 64, 16), False, (0, 3), None, slice(None), slice(32, 64)),
}


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("case", list(SKIP_CASES))
def test_tiles_without_visible_pairs_are_never_loaded(case, backward, seed):
    (b, hq, hkv, n_q, n_k, d), causal, window, docs, rows, poisoned = SKIP_CASES[case]
    q, k, v, do = make_inputs(b, hq, hkv, n_q, n_k, d)
    doc_ids = None if docs is None else packed_ids(b, docs)
    mask = reference_mask(n_q, n_k, causal, window, doc_ids)
    ref = run_reference(q, k, v, do, mask)
    k[..., poisoned, :] = float("nan")
    v[..., poisoned, :] = float("nan")
    cfg = KernelConfig(16, 16, 1, 1)
    ours = _run_launchers(q, k, v, do, causal, window, doc_ids, FlashConfig(cfg, cfg, cfg, cfg), backward)
    checked = ours[:3]  # O, L, dQ of the checked query rows
    for name, a in zip(NAMES, checked):
        part = a[..., rows] if name == "L" else a[..., rows, :]
        assert torch.isfinite(part).all(), f"{name}: a poisoned key tile was loaded"
    assert_matches((*checked, ref[3], ref[4]), ref, rows)
    keys = torch.ones(n_k, dtype=torch.bool)
    keys[poisoned] = False
    seen_by_checked = mask[..., rows, :].any(-2).flatten(0, -2).any(0) & keys
    # dK, dV of unpoisoned keys that only checked queries see
    only_checked = seen_by_checked & ~mask[..., _complement(rows, n_q), :].any(-2).flatten(0, -2).any(0)
    for name, a, r in zip(NAMES[3:], ours[3:], ref[3:]):
        torch.testing.assert_close(a[..., only_checked, :].double(), r[..., only_checked, :], rtol=1e-4, atol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")


def _complement(rows: slice, n: int) -> torch.Tensor:
    keep = torch.ones(n, dtype=torch.bool)
    keep[rows] = False
    return keep


def _run_launchers(q, k, v, do, causal, window, doc_ids, config, backward):
    """Our forward and the named backward (``BACKWARDS``) through the launchers."""
    config = dataclasses.replace(config, single_max_programs=1 << 20 if backward == "single" else 0)
    o, lse = flash_forward(q, k, v, causal, config, window=window, doc_ids=doc_ids)
    grads = flash_backward(q, k, v, o, lse, do, causal, config, window=window, doc_ids=doc_ids,
                           deterministic=backward == "deterministic")
    return (o, lse, *grads)


# Tile shapes that differ between the passes, and the tensor-descriptor form, on the feature cases
FORM_CASES = ["gqa_odd_d_nq_ne_nk", "window_two_sided_wide", "window_nq_gt_nk_empty_rows", "docs_window_two_sided",
              "docs_unsorted_window"]


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("case", FORM_CASES)
def test_kernel_forms_and_tile_shapes(case, tma, seed):
    if DEVICE == "cuda":
        pytest.skip("the GPU tests cover the kernel forms on CUDA")
    q, k, v, do, causal, window, doc_ids = _case_inputs(case)
    kc, kn = KernelConfig(32, 16, 1, 1, tma=tma), KernelConfig(16, 32, 1, 1, tma=tma)
    cfg = FlashConfig(kc, kn, kn, kc)
    ref = run_reference(q, k, v, do, reference_mask(q.shape[-2], k.shape[-2], causal, window, doc_ids))
    for backward in BACKWARDS:
        ours = _run_launchers(q, k, v, do, causal, window, doc_ids, cfg, backward)
        assert_matches(ours, ref, what=f"{backward} ")


def test_scale_and_non_contiguous_inputs(seed):
    b, hq, hkv, n, d = 2, 4, 2, 33, 16
    q = torch.randn(b, n, hq, d, device=DEVICE).transpose(1, 2)  # (B, N, H, d) -> (B, H, N, d)
    k, v = (torch.randn(b, n, hkv, d, device=DEVICE).transpose(1, 2) for _ in range(2))
    do = torch.randn(b, hq, d, n, device=DEVICE).transpose(-1, -2)
    doc_ids = packed_ids(b, [10, 23]).t().contiguous().t()  # same values, non-contiguous storage
    ours = run_ours(q, k, v, do, True, window=(6, 0), doc_ids=doc_ids, scale=0.3)
    ref = run_reference(q, k, v, do, reference_mask(n, n, True, (6, 0), doc_ids), scale=0.3)
    assert_matches(ours, ref)


def test_plain_call_equals_flash_attention2_triton(seed):
    """Without features, flash_attention runs the course class's kernels: the same bits."""
    q, k, v, do = make_inputs(2, 3, 3, 41, 41, 16)
    ours = run_ours(q, k, v, do, True)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    o = FlashAttention2Triton.apply(qq, kk, vv, True)
    lse = o.grad_fn.saved_tensors[0]
    o.backward(do)
    for a, b in zip(ours, (o, lse, qq.grad, kk.grad, vv.grad)):
        assert torch.equal(a, b)


def test_deterministic_backward_is_bitwise_reproducible_with_features(seed):
    q, k, v, do, causal, window, doc_ids = _case_inputs("docs_window_gqa")
    first = run_ours(q, k, v, do, causal, window=window, doc_ids=doc_ids, deterministic=True)
    second = run_ours(q, k, v, do, causal, window=window, doc_ids=doc_ids, deterministic=True)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), name


def test_doc_ids_changed_in_place_are_seen(seed):
    """The document spans are cached per doc_ids tensor: an in-place change must not reuse stale ones."""
    q, k, v, _ = make_inputs(1, 2, 2, 40, 40, 16)
    doc_ids = packed_ids(1, [20, 20])
    flash_attention(q, k, v, True, doc_ids=doc_ids)
    doc_ids[:, 5:] += 1  # now [5, 15, 20]
    o = flash_attention(q, k, v, True, doc_ids=doc_ids)
    ref, _ = reference(q, k, v, reference_mask(40, 40, True, None, doc_ids))
    torch.testing.assert_close(o.double(), ref, rtol=1e-4, atol=1e-4)
    with torch.inference_mode():  # inference tensors have no version counter: not cached, still right
        ids = doc_ids.clone()
        torch.testing.assert_close(flash_attention(q, k, v, True, doc_ids=ids).double(), ref, rtol=1e-4, atol=1e-4)


def test_traceable_by_torch_compile_with_features(seed):
    """Dynamo traces flash_attention (spans as torch ops, kernels behind the custom ops) in one graph."""
    q, k, v, do, _, _, doc_ids = _case_inputs("docs_window_gqa")
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))

    def fn(q, k, v, doc_ids):
        return flash_attention(q, k, v, True, window=(10, 0), doc_ids=doc_ids)

    o = torch.compile(fn, backend="aot_eager", fullgraph=True)(qq, kk, vv, doc_ids)
    o.backward(do)
    ref = run_reference(q, k, v, do, reference_mask(q.shape[-2], k.shape[-2], True, (10, 0), doc_ids))
    for name, a, r in zip(("O", "dQ", "dK", "dV"), (o, qq.grad, kk.grad, vv.grad), (ref[0], *ref[2:])):
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_backends_take_the_protocol_keywords(seed):
    from cs336_basics.attention import get_attention_backend

    q, k, v, _ = make_inputs(2, 4, 2, 30, 30, 16)
    doc_ids = packed_ids(2, [12, 18])
    ref, _ = reference(q, k, v, reference_mask(30, 30, True, (7, 0), doc_ids))
    out = get_attention_backend("flash_triton")(q, k, v, True, window=(7, 0), doc_ids=doc_ids)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    # flash_torch: grouped heads by expanding k and v; windows and documents refused
    flash_torch = get_attention_backend("flash_torch")
    ref_gqa, _ = reference(q, k, v, reference_mask(30, 30, True))
    torch.testing.assert_close(flash_torch(q, k, v, True).double(), ref_gqa, rtol=1e-4, atol=1e-4)
    for extra in (dict(window=(7, 0)), dict(doc_ids=doc_ids)):
        with pytest.raises(ValueError, match="flash_torch"):
            flash_torch(q, k, v, True, **extra)


def test_flash_auto_passes_features_through_on_cpu(seed):
    """Off CUDA flash_auto is SDPA: grouped heads, windows and documents through cs336_basics' sdpa backend."""
    from cs336_basics import attention as basics

    if not hasattr(basics, "supports_attention_extras") or not basics.supports_attention_extras(basics.sdpa_attention):
        pytest.skip("cs336_basics' sdpa backend without the window/doc_ids keywords (issue 21, model part)")
    if DEVICE == "cuda":
        pytest.skip("CPU path")
    from cs336_systems.attention.auto import flash_auto_attention

    q, k, v, _ = make_inputs(2, 4, 1, 30, 30, 16)
    doc_ids = packed_ids(2, [9, 21])
    ref, _ = reference(q, k, v, reference_mask(30, 30, True, (7, 0), doc_ids))
    out = flash_auto_attention(q, k, v, True, window=(7, 0), doc_ids=doc_ids)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


def _bad_calls():
    q = torch.randn(2, 4, 8, 16, device=DEVICE)
    kv3 = torch.randn(2, 3, 8, 16, device=DEVICE)
    ids = torch.zeros(2, 8, dtype=torch.long, device=DEVICE)
    return {
        "multiple of key/value heads": ((q, kv3, kv3), {}),
        "same number of heads": ((q, q[:, :2], q[:, :1]), {}),
        "non-negative": ((q, q, q), dict(window=(-1, 0))),
        "two non-negative ints": ((q, q, q), dict(window=(3,))),
        "(left, right)": ((q, q, q), dict(window=(2.0, 1))),
        "None or (left, right)": ((q, q, q), dict(window=(True, 1))),
        "integer dtype": ((q, q, q), dict(doc_ids=ids.float())),
        "doc_ids must have an integer": ((q, q, q), dict(doc_ids=ids.bool())),
        "shape (batch, N)": ((q, q, q), dict(doc_ids=ids[:, :7])),
        "as many queries as keys": ((q, q[..., :6, :], q[..., :6, :]), dict(doc_ids=ids)),
        "integer torch.Tensor": ((q, q, q), dict(doc_ids=[0] * 8)),
        "positive finite": ((q, q, q), dict(scale=0.0)),
        "scale must be": ((q, q, q), dict(scale=float("nan"))),
        "deterministic must be a bool": ((q, q, q), dict(deterministic=1)),
        "head dims differ": ((q, q[..., :8].contiguous(), q), {}),
        "share a dtype": ((q, q.double(), q.double()), {}),
    }


@pytest.mark.parametrize("problem", list(_bad_calls()))
def test_bad_calls_raise_value_error(problem):
    args, kwargs = _bad_calls()[problem]
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        flash_attention(*args, **kwargs)


def test_non_bool_is_causal_and_course_class_without_groups():
    q = torch.randn(1, 4, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="is_causal must be a bool"):
        flash_attention(q, q, q, "no")
    with pytest.raises(ValueError, match="leading"):  # the course's class keeps refusing grouped heads
        FlashAttention2Triton.apply(q, q[:, :2], q[:, :2], True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device and a CPU tensor")
@pytest.mark.gpu
def test_doc_ids_on_another_device_raise_value_error():
    q = torch.randn(1, 2, 8, 16, device="cuda")
    with pytest.raises(ValueError, match="one device"):
        flash_attention(q, q, q, doc_ids=torch.zeros(1, 8, dtype=torch.long))


# --------------------------------------------------------------------------------------------- GPU
def _rounding_atol(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The dtype's rounding step at the data's magnitude (flash-attention's atol)."""
    return 2 * ((ref + 0.3 - 0.3).to(dtype).double() - ref).abs().max().item() + 1e-6


def _sdpa_peer(q, k, v, do, mask):
    """PyTorch's bf16 attention with the same mask: SDPA with enable_gqa and an explicit boolean mask."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    o.backward(do)
    return o.detach(), None, q.grad, k.grad, v.grad


def _assert_within_twice_peer(ours, ref, peer, dtype, what=""):
    for i, name in enumerate(NAMES):
        got = ours[i].double()
        assert torch.isfinite(got).all(), f"{what}{name} has NaN/Inf"
        err = (got - ref[i]).abs().max().item()
        if peer[i] is None:  # L: fp32 in ours, absent from the peer
            assert err <= 1e-2, f"{what}L error {err}"
            continue
        bound = 2 * (peer[i].double() - ref[i]).abs().max().item() + _rounding_atol(ref[i], dtype)
        assert err <= bound, f"{what}{name}: error {err:.3g} > bound {bound:.3g}"


def _uneven_lengths(n: int, docs: int, seed: int = 0) -> list[int]:
    """``docs`` document lengths summing to n, uneven (drawn once from a fixed generator)."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(n - 1, generator=g)[: docs - 1] + 1
    bounds = [0, *sorted(cuts.tolist()), n]
    return [b - a for a, b in itertools.pairwise(bounds)]


# (batch, Hq, Hkv, N, d, causal, window, number of packed documents): the three benchmark shapes at
# reduced size, then odd shapes
GPU_CASES = {
    "bench_gqa_32_8": (1, 32, 8, 2048, 128, True, None, 0),
    "bench_window": (1, 4, 4, 8192, 128, True, (1024, 0), 0),
    "bench_docs": (2, 4, 4, 2048, 64, True, None, 8),
    "mqa_odd": (2, 6, 1, 1000, 64, False, None, 0),
    "window_two_sided_odd": (1, 4, 2, 1500, 96, False, (200, 77), 0),
    "window_small": (2, 4, 4, 777, 64, True, (40, 0), 0),
    "docs_window_gqa": (2, 8, 2, 1333, 128, True, (300, 0), 5),
    "docs_bidirectional": (1, 4, 4, 1024, 64, False, None, 3),
    # short sequences: the single-kernel backward by default
    "single_gqa_docs": (3, 12, 4, 500, 64, True, None, 3),
    "single_window_d128": (2, 8, 8, 384, 128, True, (100, 0), 0),
}


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_bf16_within_twice_sdpa_error(case, deterministic, seed):
    b, hq, hkv, n, d, causal, window, docs = GPU_CASES[case]
    dtype = torch.bfloat16
    q, k, v, do = make_inputs(b, hq, hkv, n, n, d, dtype)
    doc_ids = packed_ids(b, _uneven_lengths(n, docs)) if docs else None
    mask = reference_mask(n, n, causal, window, doc_ids)
    ref = run_reference(q, k, v, do, mask)
    peer = _sdpa_peer(q, k, v, do, mask)
    ours = run_ours(q, k, v, do, causal, window=window, doc_ids=doc_ids, deterministic=deterministic)
    _assert_within_twice_peer(ours, ref, peer, dtype)


@pytest.mark.gpu
def test_gpu_kernel_forms_with_features(seed):
    """Both addressing forms (block pointers, TMA) and the three backwards with every feature at once."""
    dtype = torch.bfloat16
    q, k, v, do = make_inputs(2, 8, 2, 1100, 1100, 64, dtype)
    doc_ids = packed_ids(2, _uneven_lengths(1100, 4))
    mask = reference_mask(1100, 1100, True, (250, 0), doc_ids)
    ref = run_reference(q, k, v, do, mask)
    peer = _sdpa_peer(q, k, v, do, mask)
    for tma in (False, True):
        a, b = KernelConfig(64, 64, 4, 3, tma=tma), KernelConfig(32, 64, 4, 3, tma=tma)
        cfg = FlashConfig(a, b, b, KernelConfig(64, 32, 4, 3, tma=tma))
        for backward in BACKWARDS:
            ours = _run_launchers(q, k, v, do, True, (250, 0), doc_ids, cfg, backward)
            _assert_within_twice_peer(ours, ref, peer, dtype, what=f"tma={tma} {backward}: ")


@pytest.mark.gpu
def test_gpu_deterministic_with_features_is_bitwise_reproducible(seed):
    q, k, v, do = make_inputs(2, 16, 4, 2048, 2048, 128, torch.bfloat16)
    doc_ids = packed_ids(2, _uneven_lengths(2048, 6))
    first = run_ours(q, k, v, do, True, window=(512, 0), doc_ids=doc_ids, deterministic=True)
    second = run_ours(q, k, v, do, True, window=(512, 0), doc_ids=doc_ids, deterministic=True)
    for name, a, b in zip(NAMES, first, second):
        assert torch.equal(a, b), name


@pytest.mark.gpu
def test_gpu_compiled_flash_attention_with_features(seed):
    dtype = torch.bfloat16
    q, k, v, do = make_inputs(2, 8, 2, 1024, 1024, 64, dtype)
    doc_ids = packed_ids(2, _uneven_lengths(1024, 3))
    mask = reference_mask(1024, 1024, True, (128, 0), doc_ids)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    fn = torch.compile(lambda q, k, v, ids: flash_attention(q, k, v, True, window=(128, 0), doc_ids=ids))
    o = fn(qq, kk, vv, doc_ids)
    o.backward(do)
    ref = run_reference(q, k, v, do, mask)
    peer = _sdpa_peer(q, k, v, do, mask)
    ours = (o.detach(), ref[1], qq.grad, kk.grad, vv.grad)  # L lives inside the compiled graph: not checked here
    _assert_within_twice_peer(ours, ref, peer, dtype)
