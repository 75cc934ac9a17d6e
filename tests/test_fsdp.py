"""FSDP against non-parallel training (CPU, gloo, 2 and 3 ranks).

Units: the LM is wrapped with one unit per TransformerBlock plus the embedding and the head (one
flat shard, one gather, one reduce-scatter each); ToyNet has no repeated block, so each of its
weights is a unit of its own; "tied" is the LM with the head tied to the embedding (one merged unit
used twice per forward).

Reference. Rank r trains on micro-batch r; FSDP sums the ranks' weight gradients (reduce-scatter)
and replicated ones (all-reduce), then divides by the world size. The non-parallel reference runs
the same micro-batches one after another on one model, accumulating ``.grad`` in rank order, and
divides by the world size: the same operations, so with deterministic algorithms fp32 training must
match *bitwise*. That holds when the order of the cross-rank sum cannot matter: two ranks (a + b is
commutative) with different data, or three ranks with the same data on every rank (every order
sums g + g + g as 2g + g, 2g being exact). The optimizer is our AdamW, stepping fp32 shards.

fp16 compute: FSDP casts shards to fp16 before gathering; the reference casts the same weights to
fp16 inside a single-process forward and sums the per-rank gradients in fp32. With the default fp32
reduction the sums agree up to their order (3 ranks); with ``reduce_dtype=fp16`` each summed gradient
is rounded once more to fp16 (relative 2^-11). With SGD at lr 0.1 and gradients O(0.1) that moves a
weight by ~1e-6 per step, far below the 1e-4 tolerance over 6 steps, while a wrong shard mapping or a
missing reduction moves weights by ~1e-2. (Adam would hide such errors: its update size is ~lr
whatever the gradient.) That fp16 is really used is checked on the weights the modules see.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.func import functional_call

from cs336_basics.model import BasicsTransformerLM, Embedding, Linear, RMSNorm
from cs336_basics.optimizer import AdamW
from cs336_systems.parallel.fsdp import FSDP
from cs336_systems.parallel.process_group import spawn

VOCAB, T, BATCH, STEPS = 37, 7, 3, 6
FP16_LR = 0.1  # SGD's learning rate in the fp16-compute runs


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
    lm = BasicsTransformerLM(vocab_size=VOCAB, context_length=T, d_model=10, num_layers=2, num_heads=5, d_ff=22)
    if kind == "tied":
        lm.lm_head.weight = lm.token_embeddings.weight  # both (VOCAB, 10)
    return lm


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


def _reference_step(ref, ref_opt, micro_batches, W: int, forward) -> float:
    """One single-process step on all ranks' micro-batches in rank order, gradients averaged over the W ranks
    (what FSDP must reproduce); returns the largest |gradient|."""
    for x, y in micro_batches:
        _loss(forward(x), y).backward()
    for p in ref.parameters():
        p.grad.div_(W)
    grad_max = max(p.grad.abs().max().item() for p in ref.parameters())
    ref_opt.step()
    ref_opt.zero_grad(set_to_none=True)
    return grad_max


def _fsdp_worker(info, seed, kind, same_data, compute_dtype, reduce_dtype=None, autocast=False):
    torch.use_deterministic_algorithms(True)
    W, rank = info.world_size, info.rank
    batches = _batches(seed, W, same_data)
    fp16 = compute_dtype == torch.float16
    make_opt = (lambda ps: torch.optim.SGD(ps, lr=FP16_LR)) if fp16 else \
        (lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1))

    ref = _make_model(kind, seed)
    ref_opt = make_opt(ref.parameters())
    model = FSDP(_make_model(kind, seed + rank), compute_dtype=compute_dtype,  # rank 0's weights win
                 reduce_dtype=reduce_dtype)
    opt = make_opt(model.parameters())
    seen_dtypes = set()  # dtypes of the weights the modules compute with (our pre-hooks run first)
    for m in model.module.modules():
        if isinstance(m, (Linear, Embedding, nn.Linear, nn.Embedding)):
            m.register_forward_pre_hook(lambda mod, args: seen_dtypes.add(mod.weight.dtype))
    # autocast: both run under autocast to the compute dtype, which then casts the activations (FSDP's
    # own casting hooks stand down); the reference still sees the same fp16 weights.
    region = (lambda: torch.autocast("cpu", dtype=compute_dtype)) if autocast else contextlib.nullcontext

    def ref_forward(x):
        with region():
            return functional_call(ref, _fp16_params(ref), (x,)) if fp16 else ref(x)

    worst, grad_max, checks, cast_hooks = 0.0, 0.0, [], set()
    for step in range(STEPS):
        grad_max = max(grad_max, _reference_step(ref, ref_opt, batches[step], W, ref_forward))

        x, y = batches[step][rank]
        model.on_train_batch_start()
        with region():
            logits = model(x)
        cast_hooks.add(len(model._cast_hooks))
        # Gathered weights after forward: no unit in forward use; of the uses autograd saved, only the one kept
        # for backward still holds its storage (the others were resized to 0 bytes), besides at most one
        # backward gather already in flight.
        in_use_after_forward = [u.index for u in model.units if u.use is not None or u.views is not None]
        held_after_forward = [use.unit.index for use in model._saved if use.allocated and use.pending is None]
        in_flight_after_forward = [use.unit.index for use in model._saved if use.pending is not None]
        saved = [use.unit.index for use in model._saved]
        _loss(logits, y).backward()
        model.finish_gradient_synchronization()
        grads_ok = all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.shape == p.shape
                       for p in model.parameters())
        replicated_grads = [p.grad.clone() for p in model.replicated]
        alive_after_backward = [use.unit.index for use in model._saved if use.allocated or use.pending is not None]
        collectives = dict(model.collectives)
        opt.step()
        opt.zero_grad(set_to_none=True)

        full = model.full_state_dict()
        ref_params = dict(ref.named_parameters(remove_duplicate=False))
        assert full.keys() == ref_params.keys()
        diff = max((full[n] - p).abs().max().item() for n, p in ref_params.items())
        exact = all(torch.equal(full[n], p) for n, p in ref_params.items())
        worst = max(worst, diff)
        checks.append(dict(step=step, diff=diff, exact=exact, grads_ok=grads_ok, in_use=in_use_after_forward,
                           held=held_after_forward, in_flight=in_flight_after_forward, saved=saved,
                           alive_after_backward=alive_after_backward,
                           trace=list(model.trace), replicated=replicated_grads, collectives=collectives))
    units = [dict(name=u.name, weights=[n[0] for n in u.weight_names], numels=u.numels, shard_sizes=u.shard_sizes,
                  params=[(p.shape, p.dtype) for p in u.params]) for u in model.units]
    return dict(worst=worst, checks=checks, units=units, seen_dtypes=seen_dtypes, cast_hooks=cast_hooks,
                grad_max=grad_max)


def _check_common(results, world_size, kind="toy"):
    r0 = results[0]
    for r in results:
        for c in r["checks"]:
            assert c["grads_ok"], "a gradient is missing, not fp32, or not shaped like its parameter"
            assert c["in_use"] == [], "a unit still in forward use after forward"
            assert c["held"] == [j for what, j in c["trace"] if what == "bwd_keep"], \
                "gathered weights still allocated after forward (other than the use kept for backward)"
            assert len(c["in_flight"]) <= 1 and len(c["held"]) + len(c["in_flight"]) <= 2
            assert c["alive_after_backward"] == [], "gathered weights still alive after backward"
        for c, c0 in zip(r["checks"], r0["checks"], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(c["replicated"], c0["replicated"], strict=True)), \
                "replicated gradients differ across ranks"
    # Padded where the size does not divide: each weight's shard is ceil(numel / W), an fp32 parameter.
    numels = [n for u in r0["units"] for n in u["numels"]]
    assert [s for u in r0["units"] for s in u["shard_sizes"]] == [-(-n // world_size) for n in numels]
    assert all(p == (torch.Size([s]), torch.float32)
               for u in r0["units"] for p, s in zip(u["params"], u["shard_sizes"], strict=True))
    if kind == "toy" or world_size == 3:
        assert all(n % world_size for n in numels)
    # Units: one per weight in ToyNet; in the LM the embedding, each block (its 7 weights), the head.
    names = [u["weights"] for u in r0["units"]]
    if kind == "toy":
        assert names == [["tok.weight"], ["pos.weight"], ["up.weight"], ["down.weight"], ["head.weight"]]
    else:
        head = [] if kind == "tied" else [["lm_head.weight"]]
        assert [u["name"] for u in r0["units"]] == ["token_embeddings", "layers.0", "layers.1"] + (
            [] if kind == "tied" else ["lm_head"])
        assert names[0] == ["token_embeddings.weight"] and names[3:] == head
        assert all(len(n) == 7 and all(w.startswith(f"layers.{i}.") for w in n) for i, n in enumerate(names[1:3]))
    # Uses whose weights autograd saved (and that are gathered again for backward): every Linear unit, in forward
    # order; not the embeddings (a lookup's backward needs only the indices).
    saved = {"toy": [2, 3, 4], "lm": [1, 2, 3], "tied": [1, 2, 0]}[kind]
    for c in r0["checks"]:
        assert c["saved"] == saved, c["saved"]
        trace = c["trace"]
        fwd = [e for e in trace if e[0] != "bwd_gather"]
        for i, (what, j) in enumerate(fwd):
            if what == "gather":
                assert ("start", j) not in fwd[:i], f"module {j} gathered after it started"
                if j >= 2:
                    assert ("end", j - 2) in fwd[:i], f"module {j} gathered before module {j - 2} finished"
        # Every use saved for backward is gathered again in backward exactly once, or kept from forward
        # (the last one); per step one gather per unit use in forward, one reduce-scatter per unit use.
        n_bwd = sum(1 for e in trace if e[0] == "bwd_gather")
        n_keep = sum(1 for e in trace if e[0] == "bwd_keep")
        assert n_bwd + n_keep == len(c["saved"]) > 0 and n_keep <= 1
        assert sorted(j for what, j in trace if what in ("bwd_gather", "bwd_keep")) == sorted(saved)
        uses = sum(1 for e in fwd if e[0] == "start")
        assert c["collectives"] == {"all_gather": uses + n_bwd, "reduce_scatter": uses, "all_reduce": 1}
    # From the second step on, the next module's gather is issued before the current module starts.
    later = r0["checks"][-1]["trace"]
    starts = [j for what, j in later if what == "start"]
    assert all(later.index(("gather", j)) < later.index(("start", j - 1)) for j in starts[1:])
    assert ("bwd_keep", 0 if kind == "tied" else len(r0["units"]) - 1) in later  # the last unit of forward


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "same_data"), [(2, False), (3, True)])
@pytest.mark.parametrize("kind", ["toy", "lm"])
def test_fsdp_fp32_matches_single_process_bitwise(world_size, same_data, kind, seed):
    results = spawn(_fsdp_worker, world_size, (seed, kind, same_data, None), timeout_s=120)
    _check_common(results, world_size, kind)
    for r in results:
        assert r["seen_dtypes"] == {torch.float32}
        assert all(c["exact"] for c in r["checks"]), f"max |FSDP - reference| = {r['worst']}"


def test_fsdp_tied_weights_match_single_process(seed):
    """Head tied to the embedding: one unit used twice per forward, two reduce-scatters accumulated in
    its ``.grad``. The reference accumulates the two uses' gradients in another order (per rank), so
    fp32 rounding differs: ~1e-7 relative, far below 1e-5, while a lost use would be ~1e-2."""
    results = spawn(_fsdp_worker, 2, (seed, "tied", False, None), timeout_s=120)
    _check_common(results, 2, "tied")
    for r in results:
        assert r["worst"] <= 1e-5, f"max |FSDP - reference| = {r['worst']}"


@pytest.mark.slow
@pytest.mark.parametrize("reduce_dtype", [None, torch.float16])
@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp_fp16_compute_within_1e4(world_size, reduce_dtype, seed):
    results = spawn(_fsdp_worker, world_size, (seed, "toy", False, torch.float16, reduce_dtype), timeout_s=120)
    _check_common(results, world_size)
    """fp16 compute, gradients reduced in fp32 (the issue's case): the reference computes with the same fp16
    weights and averages in fp32, so the runs must agree within 1e-4 (they agree exactly: only the order of
    fp32 sums of fp16 values could differ). Reduced in fp16 (FSDP2's policy, an option here): each averaged
    gradient is rounded once more, by at most (W - 1) * 2^-11 of the largest gradient, so after the first SGD
    step the parameters differ by at most lr times that (checked with a factor 2); later steps compute in
    fp16 from parameters that already differ, so fp16 roundings of activations flip and the gap grows (seen:
    median 7e-6, worst 3.4e-4 over 26 seeds x 2 world sizes), bounded here by 2e-3, while a reduction that
    lost a rank or its scaling moves parameters by ~lr * |g| ~ 1e-2 per step."""
    for r in results:
        assert r["seen_dtypes"] == {torch.float16}, "weights were not gathered in the compute dtype"
        if reduce_dtype is None:
            assert r["worst"] <= 1e-4, f"max |FSDP fp16 - reference| = {r['worst']}"
            continue
        first = r["checks"][0]["diff"]
        assert first <= 2 * FP16_LR * (world_size - 1) * 2 ** -11 * r["grad_max"], (first, r["grad_max"])
        assert 0.0 < r["worst"] <= 2e-3, f"max |FSDP fp16 - reference| = {r['worst']}"  # > 0: fp16 did round


@pytest.mark.parametrize("kind", ["toy", "lm"])
def test_fsdp_fp16_compute_under_autocast(kind, seed):
    """Under autocast to the compute dtype FSDP leaves the casting of activations to autocast (no casting
    hooks), and still matches the reference under the same autocast within the fp16 tolerance above;
    without autocast its hooks cast Linear inputs (one pre- and one post-hook per sharded Linear)."""
    results = spawn(_fsdp_worker, 2, (seed, kind, False, torch.float16, None, True), timeout_s=120)
    _check_common(results, 2, kind)
    for r in results:
        assert r["cast_hooks"] == {0}
        assert r["seen_dtypes"] == {torch.float16}
        assert r["worst"] <= 1e-4, f"max |FSDP fp16 - reference| = {r['worst']}"
    plain = spawn(_fsdp_worker, 2, (seed, "toy", False, torch.float16), timeout_s=120)
    assert plain[0]["cast_hooks"] == {2 * 3}  # ToyNet's Linears: up, down, head


class _TorchBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(5, 7), nn.Linear(7, 5)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class _TorchStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 5)
        self.blocks = nn.ModuleList(_TorchBlock() for _ in range(3))
        self.out = nn.Linear(5, 11)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def _bad_input_worker(info):
    out = {}
    # Units of a torch model: its repeated block class is found; () gives one unit per weight.
    out["units_default"] = [u.name for u in FSDP(_TorchStack()).units]
    out["units_none"] = [u.name for u in FSDP(_TorchStack(), unit_classes=()).units]
    try:
        FSDP(_TorchStack(), unit_classes=[3])
    except ValueError as e:
        out["unit_classes"] = str(e)
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
    assert out["units_default"] == ["emb", "blocks.0", "blocks.1", "blocks.2", "out"]
    assert out["units_none"] == ["emb", "blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1", "blocks.1.fc2", "blocks.2.fc1",
                                 "blocks.2.fc2", "out"]
    assert "unit_classes" in out["unit_classes"]


def _accumulate_worker(info, seed):
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    model = FSDP(_make_model("lm", seed))
    gen = torch.Generator().manual_seed(seed + info.rank)
    xs = [torch.randint(0, VOCAB, (BATCH, T), generator=gen) for _ in range(2)]

    def loss(x):
        return model(x).float().logsumexp(-1).mean()

    def backward(x):
        loss(x).backward()
        model.finish_gradient_synchronization()

    singles = []
    for x in xs:
        backward(x)
        singles.append([p.grad.clone() for p in model.sharded_parameters()])
        model.zero_grad(set_to_none=True)
    backward(xs[0])
    backward(xs[1])  # accumulates into the flat gradient of each unit
    accumulated = [p.grad.clone() for p in model.sharded_parameters()]
    views = all(p.grad._base is not None for p in model.sharded_parameters())
    model.zero_grad(set_to_none=False)  # zeroed in place: the views stay
    backward(xs[0])
    after_zero = [p.grad.clone() for p in model.sharded_parameters()]
    # Two forwards, then one backward of both: the second forward's start frees what the first kept, so the first
    # forward's uses are gathered again by their own hooks (each use has its own storage).
    model.zero_grad(set_to_none=True)
    (loss(xs[0]) + loss(xs[1])).backward()
    model.finish_gradient_synchronization()
    two_forwards = [p.grad.clone() for p in model.sharded_parameters()]
    # A second backward through a retained graph: every use was freed by the first, and is gathered again.
    model.zero_grad(set_to_none=True)
    retained = loss(xs[0])
    retained.backward(retain_graph=True)
    model.finish_gradient_synchronization()
    retained.backward()
    model.finish_gradient_synchronization()
    twice = [p.grad.clone() for p in model.sharded_parameters()]
    bwd_gathers = sum(1 for what, _ in model.trace if what == "bwd_gather")
    return dict(exact=all(torch.equal(a, s0 + s1) for a, s0, s1 in zip(accumulated, *singles, strict=True)),
                views=views, zero_exact=all(torch.equal(a, s) for a, s in zip(after_zero, singles[0], strict=True)),
                two_forwards=all(torch.equal(a, s0 + s1) for a, s0, s1 in zip(two_forwards, *singles, strict=True)),
                retained=all(torch.equal(a, s + s) for a, s in zip(twice, singles[0], strict=True)),
                retained_gathers=bwd_gathers, n_units=len(model.units))


def test_fsdp_gradients_accumulate_over_backwards(seed):
    """Two backwards without zeroing: each unit's reduce-scatter adds into the same flat fp32 gradient,
    exactly the sum of the two single-backward gradients (one fp32 add either way). (Replicated
    gradients are summed locally before their all-reduce, in another order: not compared here.)
    The same sum from two forwards and one backward of the summed losses, and twice one gradient from two
    backwards through a retained graph: gathered weights freed after forward (and after each backward) are
    gathered again by whichever backward needs them."""
    for r in spawn(_accumulate_worker, 2, (seed,), timeout_s=60):
        # retained: the first backward gathers every saved use but the kept last one (lm: 2 blocks), the second
        # gathers all 3 saved uses again (the head, the blocks; never the embedding)
        assert r == dict(exact=True, views=True, zero_exact=True, two_forwards=True, retained=True,
                         retained_gathers=2 + 3, n_units=4)


def _nccl_worker(info, seed, compute_dtype):
    """The LM on a GPU per rank (NCCL): fp32 training against the single-process reference (SGD, as in the fp16
    test above), and for bf16 the same structure checks; per step what the storage scheme must give on CUDA."""
    dev = info.device
    W, rank = info.world_size, info.rank
    batches = [[(x.to(dev), y.to(dev)) for x, y in step] for step in _batches(seed, W, False)]
    ref = _make_model("lm", seed).to(dev)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    model = FSDP(_make_model("lm", seed + rank).to(dev), compute_dtype=compute_dtype,
                 reduce_dtype=compute_dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    region = ((lambda: torch.autocast("cuda", dtype=compute_dtype)) if compute_dtype is not None
              else contextlib.nullcontext)
    checks = []
    for step in range(STEPS):
        _reference_step(ref, ref_opt, batches[step], W, ref)

        x, y = batches[step][rank]
        model.on_train_batch_start()
        with region():
            logits = model(x)
        saved = [use.unit.index for use in model._saved]
        held = [use.unit.index for use in model._saved if use.allocated and use.pending is None]
        freed_bytes = [use.full.untyped_storage().nbytes() for use in model._saved[:-1] if use.pending is None]
        _loss(logits, y).backward()
        model.finish_gradient_synchronization()
        alive = [use.unit.index for use in model._saved if use.allocated or use.pending is not None]
        collectives = dict(model.collectives)
        opt.step()
        opt.zero_grad(set_to_none=True)
        full = model.full_state_dict()
        diff = max((full[n] - p).abs().max().item() for n, p in ref.named_parameters())
        checks.append(dict(saved=saved, held=held, freed_bytes=freed_bytes, alive=alive, collectives=collectives,
                           diff=diff, trace=list(model.trace)))
    torch.cuda.synchronize()
    return dict(checks=checks, state={k: v.cpu() for k, v in model.full_state_dict().items()})


@pytest.mark.multigpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("compute_dtype", [None, torch.bfloat16])
def test_fsdp_nccl_two_gpus(compute_dtype, seed):
    """On 2 GPUs (NCCL): the uses whose weights autograd saved are found as on CPU (the blocks and the head, not
    the embedding: NCCL's bookkeeping must not hold a reference that makes the two ranks decide differently,
    which would make them issue different collectives), their storage is 0 bytes after forward except the
    kept head's and after backward none is held; the collectives per step are as on CPU; the ranks end with
    the same weights; in fp32 they equal the single-process reference (SGD at lr 0.1 over 6 steps: 1e-5 is
    ~100x the fp32 rounding of these sums and far below what a wrong shard or a missing reduction moves)."""
    r0, r1 = spawn(_nccl_worker, 2, (seed, compute_dtype), backend="nccl", device_type="cuda", timeout_s=150)
    for r in (r0, r1):
        for c in r["checks"]:
            assert c["saved"] == [1, 2, 3] and c["held"] == [3] and c["alive"] == []
            assert c["freed_bytes"] == [0, 0]
            assert c["collectives"] == {"all_gather": 4 + 2, "reduce_scatter": 4, "all_reduce": 1}
            if compute_dtype is None:
                assert c["diff"] <= 1e-5, c["diff"]
    assert all(torch.equal(v, r1["state"][k]) for k, v in r0["state"].items())
