"""DDP wrappers on CPU with gloo and 2 ranks: parity with single-process training on the global batch.

Each test spawns two processes on a free port (``cs336_systems.parallel.process_group.spawn``) with a
timeout, so a hang is a failure. Every rank trains the wrapped model on its half of a freshly
shuffled global batch and, side by side, a single-process reference on the whole batch, and compares
after every step.

Tolerance: both sides are fp32 and compute the same mean-over-examples gradient; they differ only
in summation order (two half-batch sums averaged vs one full sum, matmul blocking), i.e. a few ulp
relative per gradient element (fp32 eps ~1.2e-7). SGD turns that into parameter differences of
order lr * |g| * 1e-6; AdamW's update m / sqrt(v) is scale-free, so a relative gradient error
becomes a relative error of the update (size ~lr). After a few steps both stay far below
rtol = 1e-5, atol = 1e-6 (observed: ~1e-7), while any real bug (a missing division by the world size,
one rank's gradient dropped, a parameter reduced twice) moves parameters by ~lr = 1e-2..1e-3.
Ranks must end *bitwise* identical: they apply the same all-reduced gradients.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing import ProcessRaisedException

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.optimizer import AdamW
from cs336_systems.parallel import wrap_model
from cs336_systems.parallel.process_group import spawn
from tests import adapters

WORLD = 2
TIMEOUT_S = 60
RTOL, ATOL = 1e-5, 1e-6


# --- models ------------------------------------------------------------------------------------
class ToyModel(nn.Module):
    """A frozen parameter, a bias without grad, a LayerNorm; odd sizes."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(7, 13)
        self.ln = nn.LayerNorm(13)
        self.fc2 = nn.Linear(13, 5)
        self.fc2.bias.requires_grad_(False)
        self.no_grad_fixed_param = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)
        self.register_buffer("scale", torch.rand(5))

    def forward(self, x):
        return self.fc2(torch.relu(self.ln(self.fc1(x)))) * self.scale


class TiedModel(nn.Module):
    """fc3 reuses fc1's weight: one tensor under two names, reduced once."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(9, 9, bias=False)
        self.fc2 = nn.Linear(9, 9)
        self.fc3 = nn.Linear(9, 9, bias=False)
        self.fc3.weight = self.fc1.weight
        self.head = nn.Linear(9, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))))


class UnusedParamModel(nn.Module):
    def __init__(self, width: int = 6):
        super().__init__()
        self.used = nn.Linear(width, 3)
        self.unused = nn.Linear(width, 3)

    def forward(self, x):
        return self.used(x)


def tiny_lm() -> nn.Module:
    return BasicsTransformerLM(vocab_size=37, context_length=11, d_model=12, num_layers=2, num_heads=3, d_ff=20)


MODELS = {"toy": ToyModel, "tied": TiedModel, "lm": tiny_lm}
N_GLOBAL = 6  # global batch; 3 examples per rank


def make_batch(model_name: str, step: int, n: int = N_GLOBAL):
    """The same global batch on every rank (seeded by step), freshly shuffled each step."""
    g = torch.Generator().manual_seed(1234 + step)
    if model_name == "lm":
        x = torch.randint(0, 37, (n, 11), generator=g)
        y = torch.randint(0, 37, (n, 11), generator=g)
    else:
        d_in, d_out = {"toy": (7, 5), "tied": (9, 3)}[model_name]
        x, y = torch.randn(n, d_in, generator=g), torch.randn(n, d_out, generator=g)
    perm = torch.randperm(n, generator=g)
    return x[perm], y[perm]


def loss_fn(model_name: str, out, y):
    return cross_entropy(out, y) if model_name == "lm" else nn.functional.mse_loss(out, y)


def make_optimizer(model_name: str, params):
    return AdamW(params, lr=1e-2) if model_name == "lm" else torch.optim.SGD(params, lr=0.1)


def build(info, model_name: str, strategy: str, bucket_size_mb):
    torch.manual_seed(100 + info.rank)  # ranks start different; the wrapper must make them equal
    local = MODELS[model_name]()
    local_init = copy.deepcopy(local.state_dict())
    if strategy in ("adapter-individual", "adapter-ddp", "adapter-bucketed"):
        ddp = {"adapter-individual": adapters.get_ddp_individual_parameters, "adapter-ddp": adapters.get_ddp,
               "adapter-bucketed": lambda m: adapters.get_ddp_bucketed(m, bucket_size_mb)}[strategy](local)
    else:
        ddp = wrap_model(local, strategy, bucket_size_mb)
    return ddp, local_init


def finish(strategy, ddp, opt):
    if strategy == "adapter-individual":
        adapters.ddp_individual_parameters_on_after_backward(ddp, opt)
    elif strategy == "adapter-ddp":
        adapters.ddp_on_after_backward(ddp, opt)
    elif strategy == "adapter-bucketed":
        adapters.ddp_bucketed_on_after_backward(ddp, opt)
    else:
        ddp.finish_gradient_synchronization()


# --- workers (module level: they run in spawned processes) -------------------------------------
def zero_grads(opt, model: nn.Module, mode: str, step: int) -> None:
    """``none``: zero_grad(set_to_none=True) (torch's default: autograd hands the wrapper fresh tensors);
    ``zero``: set_to_none=False (gradients stay bucket views and autograd accumulates into them);
    ``alternate``: the two in turn (views -> fresh tensors -> views ...); ``partial``: zeroed views but
    one parameter's gradient set to None (a bucket with some views and one fresh tensor)."""
    if mode == "none" or (mode == "alternate" and step % 2 == 0):
        opt.zero_grad(set_to_none=True)
        return
    opt.zero_grad(set_to_none=False)
    if mode == "partial":
        next(p for p in model.parameters() if p.requires_grad).grad = None


def parity_worker(info, model_name: str, strategy: str, bucket_size_mb, steps: int, zero_mode: str = "none"):
    ddp, local_init = build(info, model_name, strategy, bucket_size_mb)
    state0 = {k: v.clone() for k, v in ddp.module.state_dict().items()}
    if info.rank == 0:  # rank 0's own initialisation is what everyone got
        for k, v in local_init.items():
            assert torch.equal(state0[k], v), k
    ref = copy.deepcopy(ddp.module)
    opt, ref_opt = make_optimizer(model_name, ddp.parameters()), make_optimizer(model_name, ref.parameters())
    max_diff = 0.0
    lo, hi = info.rank * N_GLOBAL // WORLD, (info.rank + 1) * N_GLOBAL // WORLD
    for step in range(steps):
        x, y = make_batch(model_name, step)
        ref_opt.zero_grad()
        loss_fn(model_name, ref(x), y).backward()
        ref_opt.step()
        if strategy == "adapter-bucketed":
            adapters.ddp_bucketed_on_train_batch_start(ddp, opt)
        zero_grads(opt, ddp.module, zero_mode, step)
        loss_fn(model_name, ddp(x[lo:hi]), y[lo:hi]).backward()
        finish(strategy, ddp, opt)
        opt.step()
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=lambda m, n=name, s=step: f"{n} step {s}: {m}")
            max_diff = max(max_diff, (p - q).abs().max().item())
    final = {k: v.clone() for k, v in ddp.module.state_dict().items()}
    return {"state0": state0, "local_init": local_init, "final": final, "max_diff": max_diff,
            "calls_per_step": ddp.stats.calls / steps}


def accumulation_worker(info, strategy: str, bucket_size_mb, zero_mode: str = "none"):
    """Two micro-batches, the first inside no_sync(), equal one step on the whole global batch."""
    ddp, _ = build(info, "lm", strategy, bucket_size_mb)
    ref = copy.deepcopy(ddp.module)
    opt, ref_opt = make_optimizer("lm", ddp.parameters()), make_optimizer("lm", ref.parameters())
    n = 2 * N_GLOBAL  # global batch: 2 micro-batches x 2 ranks x 3 examples
    per_rank = n // WORLD
    for step in range(3):
        x, y = make_batch("lm", step, n)
        ref_opt.zero_grad()
        loss_fn("lm", ref(x), y).backward()
        ref_opt.step()
        zero_grads(opt, ddp.module, zero_mode, step)
        xs, ys = x[info.rank * per_rank:(info.rank + 1) * per_rank], y[info.rank * per_rank:(info.rank + 1) * per_rank]
        with ddp.no_sync():
            (loss_fn("lm", ddp(xs[:3]), ys[:3]) / 2).backward()
            ddp.finish_gradient_synchronization()  # a no-op inside no_sync
        calls_before = ddp.stats.calls
        (loss_fn("lm", ddp(xs[3:]), ys[3:]) / 2).backward()
        ddp.finish_gradient_synchronization()
        assert ddp.stats.calls > calls_before
        opt.step()
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=lambda m, nm=name: f"{nm}: {m}")
    return {k: v.clone() for k, v in ddp.module.state_dict().items()}


def bucket_bases(ddp) -> dict[int, int] | None:
    """data_ptr of the flat buffer behind each multi-parameter bucket's gradients, or None if some
    bucket's gradients are not views of one buffer laid out back to back in bucket order."""
    out = {}
    for b in ddp.buckets:
        if len(b.params) == 1:
            continue
        base = b.params[0].grad._base
        if base is None or base.dim() != 1 or base.numel() != sum(p.numel() for p in b.params):
            return None
        offset = 0
        for p in b.params:
            g = p.grad
            if g._base is None or g._base.data_ptr() != base.data_ptr() or not g.is_contiguous() or \
                    g.data_ptr() != base.data_ptr() + offset * base.element_size():
                return None
            offset += p.numel()
        out[b.index] = base.data_ptr()
    return out


def views_worker(info):
    """After every synchronised backward the gradients of a multi-parameter bucket are views of one flat
    buffer; with zero_grad(set_to_none=False) that buffer is reused (no copy); with set_to_none=True
    the wrapper keeps nothing alive between steps."""
    import gc
    import time
    import weakref

    torch.manual_seed(7)
    model = tiny_lm()
    ddp = wrap_model(model, "bucketed", 0.004)
    assert sum(len(b.params) > 1 for b in ddp.buckets) > 1, [len(b.params) for b in ddp.buckets]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    lo, hi = info.rank * N_GLOBAL // WORLD, (info.rank + 1) * N_GLOBAL // WORLD
    out, previous = {}, None
    for step, mode in enumerate(["none", "zero", "zero", "partial", "none"]):
        zero_grads(opt, ddp.module, mode, step)
        x, y = make_batch("lm", step)
        loss_fn("lm", ddp(x[lo:hi]), y[lo:hi]).backward()
        ddp.finish_gradient_synchronization()
        bases = bucket_bases(ddp)
        out[f"{step}_{mode}_views"] = bases is not None
        if mode == "zero":
            out[f"{step}_{mode}_same_buffers"] = bases == previous
        if mode == "partial":  # one gradient was replaced: its bucket got a new buffer
            out[f"{step}_{mode}_new_buffer"] = bases != previous
        previous = bases
        opt.step()
    out["grads"] = {n: p.grad.clone() for n, p in ddp.module.named_parameters()}
    out["no_reference_kept"] = all(b.reduced is None and b.work is None for b in ddp.buckets)
    refs = [weakref.ref(b.params[0].grad._base) for b in ddp.buckets if len(b.params) > 1]
    opt.zero_grad(set_to_none=True)
    # c10d's gloo worker thread may hold a finished work object (and its tensor) a little longer: allow it a
    # moment to let go, then require every bucket buffer to be gone.
    for _ in range(100):
        gc.collect()
        if all(r() is None for r in refs):
            break
        time.sleep(0.02)
    out["buffers_freed_by_set_to_none"] = all(r() is None for r in refs)
    return out


def lag_side_stream(ddp, cycles: int = 20_000_000) -> None:
    """Make every side-stream block of a BucketedDDP start with a GPU busy-wait (~10 ms), so the copies on it
    run well after backward has moved on: a missing wait or ``record_stream`` then shows up as wrong values."""
    inner = ddp._packing_stream

    @contextlib.contextmanager
    def lagging(device):
        with inner(device) as side:
            if side is not None:
                torch.cuda._sleep(cycles)
            yield side

    ddp._packing_stream = lagging


def comm_dtype_worker(info, strategy: str, bucket_size_mb, lag: bool = False):
    """One synchronised backward with gradients all-reduced in bf16; also this rank's local gradients."""
    torch.manual_seed(3 + info.rank)
    ddp = wrap_model(tiny_lm().to(info.device), strategy, bucket_size_mb, grad_comm_dtype=torch.bfloat16)
    if lag:
        lag_side_stream(ddp)
    local = copy.deepcopy(ddp.module)  # rank 0's weights (broadcast at construction)
    lo, hi = info.rank * N_GLOBAL // WORLD, (info.rank + 1) * N_GLOBAL // WORLD
    x, y = (t.to(info.device) for t in make_batch("lm", 0))
    loss_fn("lm", local(x[lo:hi]), y[lo:hi]).backward()
    loss_fn("lm", ddp(x[lo:hi]), y[lo:hi]).backward()
    ddp.finish_gradient_synchronization()
    return {"local": {n: p.grad.cpu() for n, p in local.named_parameters()},
            "synced": {n: p.grad.cpu() for n, p in ddp.module.named_parameters()},
            "dtypes": {p.grad.dtype for p in ddp.module.parameters()}}


def mismatch_worker(info, strategy: str):
    torch.manual_seed(info.rank)
    model = nn.Linear(4, 3 if info.rank == 0 else 5)
    wrap_model(model, strategy, 1.0)


def unused_grad_worker(info, strategy: str):
    ddp = wrap_model(UnusedParamModel(), strategy, 1e-5)
    ddp(torch.randn(4, 6)).sum().backward()
    try:
        ddp.finish_gradient_synchronization()
    except RuntimeError as err:
        return str(err)
    return None


def double_backward_worker(info):
    ddp = wrap_model(TiedModel(), "bucketed", 1e-5)
    x = torch.randn(4, 9)
    ddp(x).sum().backward()
    try:
        ddp(x).sum().backward()
    except RuntimeError as err:
        return str(err)
    return None


def bucket_worker(info, bucket_size_mb):
    ddp = wrap_model(tiny_lm(), "bucketed", bucket_size_mb)
    return [[ddp._names[p] for p in b.params] for b in ddp.buckets]


def raising_worker(info):
    if info.rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 would wait here forever for rank 1


def sleeping_worker(info):
    import time

    time.sleep(3600)


# --- tests -----------------------------------------------------------------------------------
STRATEGY_CASES = [
    ("naive", None), ("flat", None), ("overlap", None),
    ("bucketed", 1e-6),   # smaller than any tensor: one bucket per parameter
    ("bucketed", 0.004),  # a few buckets (4 KiB: tiny LM ~7, toy/tied 1-2)
    ("bucketed", 1000.0),  # one bucket
]


@pytest.mark.timeout(TIMEOUT_S * 2)
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize(("strategy", "bucket_size_mb"), STRATEGY_CASES)
def test_parity_with_single_process(model_name, strategy, bucket_size_mb):
    r0, r1 = spawn(parity_worker, WORLD, (model_name, strategy, bucket_size_mb, 4), timeout_s=TIMEOUT_S)
    # Ranks started from different seeds: rank 1's own init differs, but after construction both hold rank 0's.
    assert any(not torch.equal(r1["local_init"][k], r0["local_init"][k]) for k in r0["local_init"]
               if k != "no_grad_fixed_param")
    for k in r0["state0"]:
        assert torch.equal(r0["state0"][k], r1["state0"][k]), k
        assert torch.equal(r0["final"][k], r1["final"][k]), f"ranks diverged on {k}"
    if model_name == "toy":  # frozen parameter and bias untouched by training
        assert torch.equal(r0["final"]["no_grad_fixed_param"], torch.tensor([2.0, 2.0]))
        assert torch.equal(r0["final"]["fc2.bias"], r0["state0"]["fc2.bias"])
    n_trainable = {"toy": 5, "tied": 5, "lm": 2 + 2 * 9 + 1}[model_name]  # tied: 6 names, fc1.weight once
    if strategy in ("naive", "overlap") or bucket_size_mb == 1e-6:
        assert r0["calls_per_step"] == n_trainable
    elif strategy == "flat" or bucket_size_mb == 1000.0:
        assert r0["calls_per_step"] == 1


@pytest.mark.parametrize(("strategy", "bucket_size_mb"), [("overlap", None), ("bucketed", 0.004)])
def test_bf16_gradient_communication(strategy, bucket_size_mb):
    """comm_dtype=bf16: each rank's fp32 gradient is rounded to bf16, the two are summed in bf16 (one more
    rounding: gloo adds two bf16 values), halved (exact) and copied back into fp32 gradients. With two ranks
    that is reproducible exactly from the ranks' local gradients; it differs from the fp32 average (by up to
    ~2^-8 relative), which shows that bf16 was really on the wire. (PyTorch DDP's bf16 hook, the benchmark
    peer, needs NCCL: it runs in ddp-bench on GPUs.)"""
    r0, r1 = spawn(comm_dtype_worker, WORLD, (strategy, bucket_size_mb), timeout_s=TIMEOUT_S)
    for r in (r0, r1):
        assert r["dtypes"] == {torch.float32}
    differs = False
    for n, g in r0["synced"].items():
        a, b = r0["local"][n], r1["local"][n]
        expected = (a.bfloat16() + b.bfloat16()).float() / 2
        assert torch.equal(g, expected), n
        assert torch.equal(g, r1["synced"][n]), n
        exact = (a + b) / 2
        assert torch.allclose(g, exact, rtol=2 ** -7, atol=2 ** -7 * exact.abs().max().item()), n
        differs |= not torch.equal(g, exact)
    assert differs


def test_comm_dtype_rejected():
    from cs336_systems.parallel.ddp import BucketedDDP, TorchDDP

    with pytest.raises(ValueError, match="comm_dtype"):
        BucketedDDP.__init__(object.__new__(BucketedDDP), nn.Linear(2, 2), comm_dtype=torch.int8)
    with pytest.raises(ValueError, match="comm_dtype"):
        TorchDDP.__init__(object.__new__(TorchDDP), nn.Linear(2, 2), comm_dtype=torch.float64)


@pytest.mark.timeout(TIMEOUT_S * 2)
@pytest.mark.parametrize("strategy", ["adapter-individual", "adapter-ddp", "adapter-bucketed"])
def test_course_adapters(strategy):
    r0, r1 = spawn(parity_worker, WORLD, ("toy", strategy, 0.0016, 3), timeout_s=TIMEOUT_S)
    for k in r0["final"]:
        assert torch.equal(r0["final"][k], r1["final"][k])


@pytest.mark.timeout(TIMEOUT_S * 2)
@pytest.mark.parametrize(("strategy", "bucket_size_mb"), [("naive", None), ("flat", None), ("overlap", None),
                                                          ("bucketed", 0.004)])
def test_no_sync_accumulation_equals_large_batch(strategy, bucket_size_mb):
    r0, r1 = spawn(accumulation_worker, WORLD, (strategy, bucket_size_mb), timeout_s=TIMEOUT_S)
    for k in r0:
        assert torch.equal(r0[k], r1[k])


@pytest.mark.timeout(TIMEOUT_S * 2)
@pytest.mark.parametrize("zero_mode", ["zero", "alternate", "partial"])
@pytest.mark.parametrize(("strategy", "bucket_size_mb"), [("overlap", None), ("bucketed", 0.004),
                                                          ("bucketed", 1000.0)])
def test_parity_whatever_zero_grad_leaves(strategy, bucket_size_mb, zero_mode):
    r0, r1 = spawn(parity_worker, WORLD, ("lm", strategy, bucket_size_mb, 4, zero_mode), timeout_s=TIMEOUT_S)
    for k in r0["final"]:
        assert torch.equal(r0["final"][k], r1["final"][k]), f"ranks diverged on {k}"


@pytest.mark.timeout(TIMEOUT_S * 2)
@pytest.mark.parametrize("zero_mode", ["zero", "alternate"])
@pytest.mark.parametrize(("strategy", "bucket_size_mb"), [("overlap", None), ("bucketed", 0.004)])
def test_no_sync_accumulation_with_gradient_views(strategy, bucket_size_mb, zero_mode):
    r0, r1 = spawn(accumulation_worker, WORLD, (strategy, bucket_size_mb, zero_mode), timeout_s=TIMEOUT_S)
    for k in r0:
        assert torch.equal(r0[k], r1[k])


@pytest.mark.timeout(TIMEOUT_S * 2)
def test_gradients_are_bucket_views():
    r0, r1 = spawn(views_worker, WORLD, timeout_s=TIMEOUT_S)
    for r in (r0, r1):
        flags = {k: v for k, v in r.items() if k != "grads"}
        assert all(flags.values()), flags
    for n in r0["grads"]:  # the averaged gradients are the same on both ranks
        assert torch.equal(r0["grads"][n], r1["grads"][n]), n


@pytest.mark.timeout(TIMEOUT_S * 2)
@pytest.mark.parametrize("strategy", ["naive", "bucketed"])
def test_different_architectures_rejected(strategy):
    with pytest.raises(ProcessRaisedException, match="differs from rank 0"):
        spawn(mismatch_worker, WORLD, (strategy,), timeout_s=TIMEOUT_S)


@pytest.mark.timeout(TIMEOUT_S * 2)
@pytest.mark.parametrize("strategy", ["naive", "flat", "overlap", "bucketed"])
def test_missing_gradient_is_named(strategy):
    messages = spawn(unused_grad_worker, WORLD, (strategy,), timeout_s=TIMEOUT_S)
    for msg in messages:
        assert msg is not None and "unused.weight" in msg and "unused.bias" in msg and "used.weight" not in msg.replace(
            "unused.weight", "")


@pytest.mark.timeout(TIMEOUT_S * 2)
def test_second_backward_without_no_sync_raises():
    for msg in spawn(double_backward_worker, WORLD, timeout_s=TIMEOUT_S):
        assert msg is not None and "no_sync" in msg


@pytest.mark.timeout(TIMEOUT_S * 2)
def test_bucket_assignment_reverse_order_and_caps():
    one_each, few, one = (spawn(bucket_worker, WORLD, (b,), timeout_s=TIMEOUT_S)[0] for b in (1e-6, 0.004, 1000.0))
    names = [n for b in one_each for n in b]
    lm = tiny_lm()
    assert names == [n for n, _ in reversed(list(lm.named_parameters()))]
    assert all(len(b) == 1 for b in one_each)
    assert len(one) == 1 and one[0] == names
    assert 1 < len(few) < len(names) and [n for b in few for n in b] == names
    sizes = dict((n, p.numel() * 4) for n, p in lm.named_parameters())
    for b in few:  # at most the cap, unless a single tensor is larger
        assert len(b) == 1 or sum(sizes[n] for n in b) <= 0.004 * 2**20


@pytest.mark.timeout(30)
def test_raising_rank_fails_fast_instead_of_hanging():
    import time

    t0 = time.monotonic()
    # Whichever rank's error is seen first is raised: rank 1's own, or rank 0's gloo all_reduce losing its peer.
    with pytest.raises(ProcessRaisedException, match=r"rank 1 fails on purpose|gloo"):
        spawn(raising_worker, WORLD, timeout_s=20)
    assert time.monotonic() - t0 < 15


@pytest.mark.timeout(30)
def test_hung_group_is_killed_at_timeout():
    with pytest.raises(TimeoutError, match="did not finish"):
        spawn(sleeping_worker, WORLD, timeout_s=2)


def test_wrap_model_rejects_unknown_strategy():
    with pytest.raises(ValueError, match="unknown parallel strategy"):
        wrap_model(nn.Linear(2, 2), "zero9")


def test_wrapper_needs_process_group():
    from cs336_systems.parallel.ddp import NaiveDDP

    with pytest.raises(ValueError, match="not initialised"):
        NaiveDDP(nn.Linear(2, 2))


# --- NCCL on two GPUs (device machine only) --------------------------------------------------
def nccl_parity_worker(info, strategy: str, bucket_size_mb, zero_mode: str = "none", lag: bool = False):
    """4 steps on GPUs against single-process training on the global batch; returns the final state.
    ``lag``: the wrapper's side stream lags backward (:func:`lag_side_stream`)."""
    torch.manual_seed(100 + info.rank)
    ddp = wrap_model(tiny_lm().to(info.device), strategy, bucket_size_mb)
    if lag:
        lag_side_stream(ddp)
    ref = copy.deepcopy(ddp.module)
    opt, ref_opt = make_optimizer("lm", ddp.parameters()), make_optimizer("lm", ref.parameters())
    lo, hi = info.rank * N_GLOBAL // WORLD, (info.rank + 1) * N_GLOBAL // WORLD
    for step in range(4):
        x, y = (t.to(info.device) for t in make_batch("lm", step))
        ref_opt.zero_grad()
        loss_fn("lm", ref(x), y).backward()
        ref_opt.step()
        zero_grads(opt, ddp.module, zero_mode, step)
        loss_fn("lm", ddp(x[lo:hi]), y[lo:hi]).backward()
        ddp.finish_gradient_synchronization()
        opt.step()
    # GPU matmuls may pick different kernels for batch 3 and 6 (and TF32 is off by default): same bound as CPU
    # plus a margin for cuBLAS split-K reductions.
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    return {k: v.cpu() for k, v in ddp.module.state_dict().items()}


@pytest.mark.multigpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("strategy", "bucket_size_mb"), [("naive", None), ("flat", None), ("overlap", None),
                                                          ("bucketed", 0.004), ("torch-ddp", None)])
def test_nccl_parity_two_gpus(strategy, bucket_size_mb):
    r0, r1 = spawn(nccl_parity_worker, WORLD, (strategy, bucket_size_mb), backend="nccl", device_type="cuda",
                   timeout_s=150)
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k


@pytest.mark.multigpu
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("bucket_size_mb", "zero_mode"), [(0.004, "none"), (0.004, "partial"), (0.004, "alternate"),
                                                           (100.0, "zero")])
def test_nccl_bucketed_side_stream_lagging(bucket_size_mb, zero_mode):
    """The bucket copies run on a side stream: with it lagging far behind backward, and gradients handed over
    fresh, as views, or mixed, training still matches one process (nothing read too early or reused too soon)."""
    r0, r1 = spawn(nccl_parity_worker, WORLD, ("bucketed", bucket_size_mb, zero_mode, True),
                   backend="nccl", device_type="cuda", timeout_s=200)
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k


@pytest.mark.multigpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("strategy", "bucket_size_mb", "lag"), [("bucketed", 0.004, False), ("bucketed", 0.004, True),
                                                                 ("overlap", None, True), ("torch-ddp", None, False)])
def test_nccl_bf16_gradient_communication(strategy, bucket_size_mb, lag):
    """On NCCL (our cast-and-pack path, and PyTorch DDP's bf16 compression hook): ranks agree exactly, the
    result is the average to bf16 accuracy, and differs from the fp32 average (bf16 was on the wire). ``lag``:
    our side stream (pack, collective, copy back) lags backward, so finish must really wait for it."""
    r0, r1 = spawn(comm_dtype_worker, WORLD, (strategy, bucket_size_mb, lag), backend="nccl", device_type="cuda",
                   timeout_s=150)
    differs = False
    for n, g in r0["synced"].items():
        exact = (r0["local"][n] + r1["local"][n]) / 2
        assert torch.equal(g, r1["synced"][n]), n
        assert torch.allclose(g, exact, rtol=2 ** -6, atol=2 ** -7 * exact.abs().max().item()), n
        differs |= not torch.equal(g, exact)
    assert r0["dtypes"] == {torch.float32} and differs


def nccl_no_host_sync_worker(info, bucket_size_mb):
    """The backward hooks and finish_gradient_synchronization() never wait for the device: run them
    with CUDA sync debugging set to error (the rest of backward, e.g. embedding backward, may sync)."""
    from cs336_systems.parallel.ddp import BucketedDDP

    checking = {"on": False}

    def checked(fn):
        def run(*args, **kwargs):
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error" if checking["on"] else previous)
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        return run

    class Checked(BucketedDDP):
        _on_grad_ready = checked(BucketedDDP._on_grad_ready)
        finish_gradient_synchronization = checked(BucketedDDP.finish_gradient_synchronization)

    torch.manual_seed(3)
    ddp = Checked(tiny_lm().to(info.device), bucket_size_mb=bucket_size_mb)
    opt = make_optimizer("lm", ddp.parameters())
    x, y = (t.to(info.device) for t in make_batch("lm", 0))
    for step, set_to_none in enumerate([True, True, False]):  # step 0 warms up NCCL (communicator set-up)
        checking["on"] = step > 0
        opt.zero_grad(set_to_none=set_to_none)
        loss_fn("lm", ddp(x), y).backward()
        ddp.finish_gradient_synchronization()
        opt.step()
    torch.cuda.synchronize()
    return True


@pytest.mark.multigpu
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("strategy", "bucket_size_mb"), [("overlap", None), ("bucketed", 0.004)])
def test_nccl_hooks_do_not_synchronize_host(strategy, bucket_size_mb):
    assert spawn(nccl_no_host_sync_worker, WORLD, (bucket_size_mb,), backend="nccl", device_type="cuda",
                 timeout_s=150) == [True, True]
