"""Loss, softmax, optimizer, schedule, clipping and data loading against torch / closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cs336_basics.data import get_batch
from cs336_basics.nn_utils import clip_gradient, cross_entropy, log_softmax, softmax
from cs336_basics.optimizer import AdamW, get_cosine_lr


def test_softmax_and_log_softmax(seed):
    x = torch.randn(4, 7, 13, dtype=torch.float64) * 50
    torch.testing.assert_close(softmax(x, -1), torch.softmax(x, -1))
    torch.testing.assert_close(softmax(x, 1), torch.softmax(x, 1))
    torch.testing.assert_close(log_softmax(x, -1), torch.log_softmax(x, -1))


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_cross_entropy_matches_torch(seed, scale):
    logits = torch.randn(3, 9, 101, dtype=torch.float64) * scale
    targets = torch.randint(0, 101, (3, 9))
    ours = cross_entropy(logits, targets)
    assert torch.isfinite(ours)
    torch.testing.assert_close(ours, F.cross_entropy(logits.view(-1, 101), targets.view(-1)))
    # fp32 with large logits: still finite and close (relative tolerance of fp32 at this magnitude).
    ours32 = cross_entropy(logits.float(), targets)
    torch.testing.assert_close(
        ours32.double(), F.cross_entropy(logits.view(-1, 101), targets.view(-1)), rtol=1e-5, atol=1e-5 * scale
    )


def test_cross_entropy_bf16_upcasts(seed):
    logits = torch.randn(8, 50).bfloat16()
    targets = torch.randint(0, 50, (8,))
    loss = cross_entropy(logits, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(logits.float(), targets))


def test_cross_entropy_shape_mismatch():
    with pytest.raises(ValueError, match="do not match"):
        cross_entropy(torch.randn(3, 5), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch(seed, weight_decay):
    torch.manual_seed(seed)
    ours_model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    ref_model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    ref_model.load_state_dict(ours_model.state_dict())
    hp = dict(lr=1e-2, betas=(0.85, 0.97), eps=1e-7, weight_decay=weight_decay)
    ours, ref = AdamW(ours_model.parameters(), **hp), torch.optim.AdamW(ref_model.parameters(), **hp)
    for _ in range(10):
        x, y = torch.randn(6, 7, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
        for model, opt in ((ours_model, ours), (ref_model, ref)):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    for p, q in zip(ours_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


def test_adamw_rejects_bad_hyperparameters():
    p = [torch.nn.Parameter(torch.zeros(2))]
    for kwargs in (dict(lr=-1.0), dict(betas=(1.0, 0.9)), dict(eps=-1.0), dict(weight_decay=-0.1)):
        with pytest.raises(ValueError):
            AdamW(p, **kwargs)


def test_cosine_schedule():
    kw = dict(max_learning_rate=1.0, min_learning_rate=0.1, warmup_iters=10, cosine_cycle_iters=110)
    assert get_cosine_lr(0, **kw) == 0.0
    assert get_cosine_lr(5, **kw) == pytest.approx(0.5)
    assert get_cosine_lr(10, **kw) == pytest.approx(1.0)
    assert get_cosine_lr(60, **kw) == pytest.approx(0.1 + 0.5 * 0.9)
    assert get_cosine_lr(110, **kw) == pytest.approx(0.1)
    assert get_cosine_lr(500, **kw) == pytest.approx(0.1)


def test_clip_gradient(seed):
    params = [
        torch.nn.Parameter(torch.randn(5, 3)),
        torch.nn.Parameter(torch.randn(4)),
        torch.nn.Parameter(torch.randn(2)),
    ]
    grads = [torch.randn_like(p) * 10 for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    params[2].grad = None
    ref = [p.detach().clone().requires_grad_() for p in params[:2]]
    for r, g in zip(ref, grads):
        r.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(ref, 1.0)
    norm = clip_gradient(params, 1.0)
    assert norm.item() == pytest.approx(math.sqrt(sum(g.pow(2).sum().item() for g in grads[:2])), rel=1e-5)
    for p, r in zip(params[:2], ref):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-6)
    # Under the threshold: untouched.
    for p in params[:2]:
        p.grad = torch.full_like(p, 1e-3)
    clip_gradient(params, 1.0)
    assert torch.all(params[0].grad == 1e-3)


def test_get_batch_from_memmap(tmp_path):
    data = np.arange(1000, dtype=np.uint16)
    path = tmp_path / "tokens.bin"
    data.tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    x, y = get_batch(mm, batch_size=8, context_length=16, device="cpu")
    assert x.shape == y.shape == (8, 16) and x.dtype == torch.long
    assert torch.all(y == x + 1)  # consecutive tokens: targets are inputs shifted by one
    assert torch.all(torch.diff(x, dim=1) == 1)
    assert x.min() >= 0 and y.max() <= 999


def test_get_batch_errors():
    with pytest.raises(ValueError, match="too short"):
        get_batch(np.arange(10), 2, 10)
    with pytest.raises(ValueError, match="1-D"):
        get_batch(np.zeros((4, 4)), 2, 2)
