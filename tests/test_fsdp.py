"""FSDP against non-parallel training (CPU, gloo, 2 and 3 ranks).

Reference. Rank r trains on micro-batch r; FSDP sums the ranks' weight gradients (reduce-scatter)
and replicated ones (all-reduce), then divides by the world size. The non-parallel reference runs
the same micro-batches one after another on one model, accumulating ``.grad`` in rank order, and
divides by the world size: the same operations, so with deterministic algorithms fp32 training must
match *bitwise*. That holds when the order of the cross-rank sum cannot matter: two ranks (a + b is
commutative) with different data, or three ranks with the same data on every rank (every order
sums g + g + g as 2g + g, 2g being exact). The optimizer is our AdamW, stepping fp32 shards.

fp16 compute: FSDP casts shards to fp16 before gathering and sums gradients in fp16; the reference
casts the same weights to fp16 inside a single-process forward and sums the per-rank gradients in
fp32. The only difference is one fp16 rounding of each summed gradient (relative 2^-11) and what it
changes downstream; with SGD at lr 0.1 and gradients O(0.1) that moves a weight by ~1e-6 per step,
far below the 1e-4 tolerance over 8 steps, while a wrong shard mapping or a missing reduction moves
weights by ~1e-2. (Adam would hide such errors: its update size is ~lr whatever the gradient.)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from cs336_basics.model import BasicsTransformerLM, Embedding, Linear, RMSNorm
from cs336_basics.optimizer import AdamW
from cs336_systems.parallel.fsdp import FSDP
from cs336_systems.parallel.process_group import spawn

VOCAB, T, BATCH, STEPS = 37, 7, 3, 6


class ToyNet(nn.Module):
    """Our and torch's Embedding and Linear, RMSNorm; no weight size divides by 2 or 3 (7, 13, 29, 37)."""

    def __init__(self):
        super().__init__()
        self.tok = Embedding(VOCAB, 13)
        self.pos = nn.Embedding(T, 13)
        self.norm1 = RMSNorm(13)
        self.up = Linear(13, 29)
        self.down = nn.Linear(29, 13, bias=True)
        self.norm2 = RMSNorm(13)
        self.head = Linear(13, VOCAB)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[-1]))
        x = x + self.down(torch.relu(self.up(self.norm1(x))))
        return self.head(self.norm2(x))


def _make_model(kind: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "toy":
        return ToyNet()
    # Sizes 37*10, 10*10, 10*22: none divides by 3 (with 2 ranks no LM size can be odd: heads need even dims).
    return BasicsTransformerLM(vocab_size=VOCAB, context_length=T, d_model=10, num_layers=2, num_heads=5,
                               d_ff=22)


def _batches(seed: int, world_size: int, same_data: bool):
    gen = torch.Generator().manual_seed(seed + 7)
    out = []
    for _ in range(STEPS):
        per_rank = [(torch.randint(0, VOCAB, (BATCH, T), generator=gen),
                     torch.randint(0, VOCAB, (BATCH, T), generator=gen)) for _ in range(world_size)]
        out.append([per_rank[0]] * world_size if same_data else per_rank)
    return out


def _loss(logits, y):
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def _fp16_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """The reference's mixed precision: the weights FSDP shards, and nn.Linear biases, cast to fp16."""
    sharded = (Linear, Embedding, nn.Linear, nn.Embedding)
    cast = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, sharded)}
    cast |= {f"{n}.bias" for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.bias is not None}
    return {n: (p.half() if n in cast else p) for n, p in model.named_parameters()}


def _fsdp_worker(info, seed, kind, same_data, compute_dtype):
    torch.use_deterministic_algorithms(True)
    W, rank = info.world_size, info.rank
    batches = _batches(seed, W, same_data)
    fp16 = compute_dtype == torch.float16
    make_opt = (lambda ps: torch.optim.SGD(ps, lr=0.1)) if fp16 else (lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1))

    ref = _make_model(kind, seed)
    ref_opt = make_opt(ref.parameters())
    model = FSDP(_make_model(kind, seed + rank), compute_dtype=compute_dtype)  # rank 0's weights win
    opt = make_opt(model.parameters())
    worst, checks = 0.0, []
    for step in range(STEPS):
        # Reference: the ranks' micro-batches in rank order, gradients averaged.
        for x, y in batches[step]:
            out = functional_call(ref, _fp16_params(ref), (x,)) if fp16 else ref(x)
            _loss(out, y).backward()
        for p in ref.parameters():
            p.grad.div_(W)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)

        x, y = batches[step][rank]
        model.on_train_batch_start()
        logits = model(x)
        live_after_forward = len(model._live)
        _loss(logits, y).backward()
        model.finish_gradient_synchronization()
        grads_ok = all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.shape == p.shape
                       for p in model.parameters())
        replicated_grads = [p.grad.clone() for p in model.replicated]
        alive_after_backward = [h.index for h in model.handles if h.bwd_flat is not None and h.bwd_flat() is not None]
        opt.step()
        opt.zero_grad(set_to_none=True)

        full = model.full_state_dict()
        ref_params = dict(ref.named_parameters())
        assert full.keys() == ref_params.keys()
        diff = max((full[n] - p).abs().max().item() for n, p in ref_params.items())
        exact = all(torch.equal(full[n], p) for n, p in ref_params.items())
        worst = max(worst, diff)
        checks.append(dict(step=step, diff=diff, exact=exact, grads_ok=grads_ok, live=live_after_forward,
                           alive_after_backward=alive_after_backward, trace=list(model.trace),
                           n_packed=len(model._packed), replicated=replicated_grads))
    return dict(worst=worst, checks=checks, shard_sizes=[h.shard_size for h in model.handles],
                numels=[h.numel for h in model.handles])


def _check_common(results, world_size, kind="toy"):
    r0 = results[0]
    for r in results:
        for c in r["checks"]:
            assert c["grads_ok"], "a gradient is missing, not fp32, or not shaped like its parameter"
            assert c["live"] == 0, "gathered weights still referenced after forward"
            assert c["alive_after_backward"] == [], "gathered weights still alive after backward"
        for c, c0 in zip(r["checks"], r0["checks"], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(c["replicated"], c0["replicated"], strict=True)), \
                "replicated gradients differ across ranks"
    # Padded where the size does not divide: shards are ceil(numel / W).
    assert r0["shard_sizes"] == [-(-n // world_size) for n in r0["numels"]]
    if kind == "toy" or world_size == 3:
        assert all(n % world_size for n in r0["numels"])
    for c in r0["checks"]:
        trace = c["trace"]
        fwd = [e for e in trace if e[0] != "bwd_gather"]
        for i, (what, j) in enumerate(fwd):
            if what == "gather":
                assert ("start", j) not in fwd[:i], f"module {j} gathered after it started"
                if j >= 2:
                    assert ("end", j - 2) in fwd[:i], f"module {j} gathered before module {j - 2} finished"
        # Every weight saved for backward is gathered again in backward, exactly once.
        assert sum(1 for e in trace if e[0] == "bwd_gather") == c["n_packed"] > 0
    # From the second step on, the next module's gather is issued before the current module starts.
    later = r0["checks"][-1]["trace"]
    starts = [j for what, j in later if what == "start"]
    assert all(later.index(("gather", j)) < later.index(("start", j - 1)) for j in starts[1:])


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "same_data"), [(2, False), (3, True)])
@pytest.mark.parametrize("kind", ["toy", "lm"])
def test_fsdp_fp32_matches_single_process_bitwise(world_size, same_data, kind, seed):
    results = spawn(_fsdp_worker, world_size, (seed, kind, same_data, None), timeout_s=120)
    _check_common(results, world_size, kind)
    for r in results:
        assert all(c["exact"] for c in r["checks"]), f"max |FSDP - reference| = {r['worst']}"


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp_fp16_compute_within_1e4(world_size, seed):
    results = spawn(_fsdp_worker, world_size, (seed, "toy", False, torch.float16), timeout_s=120)
    _check_common(results, world_size)
    for r in results:
        assert r["worst"] <= 1e-4, f"max |FSDP fp16 - reference| = {r['worst']}"
        assert r["worst"] > 0.0  # fp16 sums do round: an exact match would mean fp16 was not used


def _bad_input_worker(info):
    out = {}
    try:
        FSDP(nn.Embedding(5, 3, max_norm=1.0))
    except ValueError as e:
        out["max_norm"] = str(e)
    try:
        FSDP(nn.Linear(3, 3), compute_dtype=torch.int32)
    except ValueError as e:
        out["dtype"] = str(e)
    m = FSDP(ToyNet())
    m(torch.zeros(2, T, dtype=torch.long)).sum().backward()
    m.module.norm1.weight.grad = None
    try:
        m.finish_gradient_synchronization()
    except RuntimeError as e:
        out["missing"] = str(e)
    return out


def test_fsdp_bad_input():
    out = spawn(_bad_input_worker, 2, timeout_s=60)[0]
    assert "max_norm" in out["max_norm"] and "compute_dtype" in out["dtype"] and "norm1.weight" in out["missing"]
