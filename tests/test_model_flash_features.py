"""The model on our Triton kernel (``attention_backend="flash_triton"``) with grouped-query heads, a sliding
window and packed documents, against the same model on the reference backend (issue 21).

These run once ``flash_triton`` takes ``window=`` / ``doc_ids=`` (``cs336_systems.attention.flash_attention``);
until then they are skipped with that reason. CPU: Triton's interpreter on fp32 weights, where the kernel and the
reference differ only by fp32 rounding in different summation orders (~1e-6 relative on O(1) values through two
blocks): tolerance 1e-4. GPU: bf16 autocast judged by the flash-attention rule, our error against the fp32
reference at most twice that of SDPA in the same precision plus one bf16 step at the data's magnitude.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the Triton kernels are decorated (first import)

from cs336_basics.attention import get_attention_backend, supports_attention_extras
from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy

TAKES_EXTRAS = supports_attention_extras(get_attention_backend("flash_triton"))
pytestmark = pytest.mark.skipif(not TAKES_EXTRAS, reason="flash_triton does not take window= / doc_ids= yet")

# head dim 16: the kernel's smallest
TINY = dict(vocab_size=41, context_length=64, d_model=64, num_layers=2, num_heads=4, d_ff=48)
EXTRAS = [dict(num_kv_heads=2), dict(num_kv_heads=1, attention_window=5), dict(attention_window=40),
          dict(num_kv_heads=2, attention_window=7)]


def doc_ids_of(B: int, T: int, gen: torch.Generator, device) -> torch.Tensor:
    """Uneven documents: cuts at three random positions and before the last token."""
    ids = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        for c in {*torch.randperm(T - 1, generator=gen)[:3].add(1).tolist(), T - 1}:
            ids[b, c:] += 1
    return ids.to(device)


def loss_and_grads(model, x, y, doc, autocast=contextlib.nullcontext):
    model.zero_grad(set_to_none=True)
    with autocast():
        logits = model(x, doc_ids=doc)
        loss = cross_entropy(logits, y)
    loss.backward()
    return logits.detach().float(), [p.grad.float() for p in model.parameters()]


@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("docs", [False, True])
def test_flash_triton_model_matches_reference_on_cpu(seed, extra, docs):
    if torch.cuda.is_available():
        pytest.skip("the interpreter test; the GPU has its own")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ours = BasicsTransformerLM(**TINY, attention_backend="flash_triton", **extra)
    torch.manual_seed(seed)
    ref = BasicsTransformerLM(**TINY, attention_backend="reference", **extra)
    x, y = torch.randint(0, 41, (2, 19)), torch.randint(0, 41, (2, 19))  # odd length, below any tile
    doc = doc_ids_of(2, 19, gen, "cpu") if docs else None
    out, grads = loss_and_grads(ours, x, y, doc)
    out_ref, grads_ref = loss_and_grads(ref, x, y, doc)
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("extra", EXTRAS)
def test_flash_triton_model_bf16_on_gpu(seed, extra):
    gen = torch.Generator().manual_seed(seed)
    cfg = dict(TINY, context_length=1024, d_model=256, num_heads=4)  # head dim 64
    models = {}
    for backend in ("flash_triton", "sdpa", "reference"):
        torch.manual_seed(seed)
        models[backend] = BasicsTransformerLM(**cfg, attention_backend=backend, device="cuda", **extra)
    x, y = torch.randint(0, 41, (2, 777), device="cuda"), torch.randint(0, 41, (2, 777), device="cuda")
    doc = doc_ids_of(2, 777, gen, "cuda")
    exact, exact_grads = loss_and_grads(models["reference"], x, y, doc)  # fp32
    results = {}
    for backend in ("flash_triton", "sdpa"):
        results[backend] = loss_and_grads(models[backend], x, y, doc,
                                          lambda: torch.autocast("cuda", dtype=torch.bfloat16))
    step = 2**-8 * exact.abs().max()
    assert (results["flash_triton"][0] - exact).abs().max() <= 2 * (results["sdpa"][0] - exact).abs().max() + step
    for g, s, r in zip(results["flash_triton"][1], results["sdpa"][1], exact_grads, strict=True):
        assert (g - r).abs().max() <= 2 * (s - r).abs().max() + 2**-8 * r.abs().max()
