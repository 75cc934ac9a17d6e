"""ShardedOptimizer against the unsharded optimizer (CPU, gloo, 2 and 3 ranks).

Every rank feeds the same batches, so every rank's gradients equal the single-process ones and the
sharded run must reproduce the unsharded run *bitwise*: an optimizer update is elementwise per
tensor, so updating a tensor on its owner and broadcasting it changes no arithmetic. Each rank also
runs the unsharded reference itself (same seed) and reports the largest difference.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cs336_basics.model import Embedding, Linear, RMSNorm
from cs336_basics.optimizer import AdamW
from cs336_systems.parallel.process_group import spawn
from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

STEPS = 12


class ToyLM(nn.Module):
    """Odd sizes (none divides 2 or 3 evenly), optional tied head and a frozen layer."""

    def __init__(self, tied: bool = False, frozen: bool = False):
        super().__init__()
        self.emb = Embedding(37, 13)
        self.fc1 = Linear(13, 29)
        self.norm = RMSNorm(29)
        self.fc2 = Linear(29, 13)
        self.frozen = Linear(13, 13)
        self.head = Linear(13, 37)
        if tied:
            self.head.weight = self.emb.weight  # (37, 13) shared
        if frozen:
            self.frozen.weight.requires_grad_(False)

    def forward(self, ids):
        x = self.emb(ids)
        x = x + self.fc2(torch.relu(self.norm(self.fc1(x))))
        return self.head(x + self.frozen(x))


def _optimizer(kind: str):
    if kind == "sgd":
        return torch.optim.SGD, dict(lr=0.05, momentum=0.9)
    if kind == "adamw":
        return AdamW, dict(lr=1e-2, weight_decay=0.1)
    if kind == "torch-adamw":
        return torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, foreach=False)
    raise AssertionError(kind)


def _groups(model: nn.Module, scenario: str, late: bool):
    """Parameter groups for a scenario; ``late``: the group added mid-training (or None)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if scenario == "two-groups":
        first = [p for n, p in trainable if "norm" not in n and n != "fc2.weight"]
        second = [p for n, p in trainable if "norm" in n or n == "fc2.weight"]
        return [{"params": first}, {"params": second, "lr": 0.003}] if not late else None
    if scenario == "add-group":
        early = [p for n, p in trainable if not n.startswith("head")]
        added = {"params": [p for n, p in trainable if n.startswith("head")], "lr": 0.02}
        return added if late else [{"params": early}]
    return [p for _, p in trainable] if not late else None


def _run(model, make_opt, scenario, batches, start=0, stop=STEPS, opt=None, ckpt=None):
    opt = opt or make_opt(_groups(model, scenario, late=False))
    for step in range(start, stop):
        if scenario == "add-group" and step == STEPS // 2:
            for p in _groups(model, scenario, late=True)["params"]:
                p.requires_grad_(True)
            opt.add_param_group(_groups(model, scenario, late=True))
        if ckpt is not None and step == ckpt[0]:
            ckpt[1](model, opt)
        x, y = batches[step]
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return opt


def _make(seed: int, scenario: str):
    torch.manual_seed(seed)
    model = ToyLM(tied=scenario == "tied-frozen", frozen=scenario == "tied-frozen")
    if scenario == "add-group":  # the head starts frozen and is unfrozen when its group is added
        model.head.weight.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [(torch.randint(0, 37, (3, 7), generator=gen), torch.randint(0, 37, (3, 7), generator=gen))
               for _ in range(STEPS)]
    return model, batches


KINDS = ("sgd", "adamw", "torch-adamw")
SCENARIOS = ("two-groups", "add-group", "tied-frozen")


def _parity_worker(info, seed):
    """Every (optimizer, scenario) pair in one process group (process start-up dominates otherwise)."""
    out = {}
    for kind in KINDS:
        for scenario in SCENARIOS:
            cls, kwargs = _optimizer(kind)
            ref, batches = _make(seed, scenario)
            _run(ref, lambda groups: cls(groups, **kwargs), scenario, batches)  # noqa: B023
            model, _ = _make(seed, scenario)
            opt = _run(model, lambda groups: ShardedOptimizer(groups, cls, **kwargs), scenario, batches)  # noqa: B023
            diff = max((a - b).abs().max().item()
                       for a, b in zip(ref.parameters(), model.parameters(), strict=True))
            owned = {id(p) for p in opt.local_optimizer.state}
            mine = {id(p) for p in opt.owned_parameters() if p.grad is not None}
            out[kind, scenario] = dict(diff=diff, state_matches_owned=owned == mine, n_state=len(owned),
                                       numel=opt.rank_numel, groups=len(opt.local_optimizer.param_groups))
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_equals_unsharded(world_size, seed):
    """SGD with momentum, our AdamW and torch's AdamW; two groups with their own lr, a group added
    mid-training, tied weights plus a frozen parameter: bitwise equal to the unsharded optimizer."""
    results = spawn(_parity_worker, world_size, (seed,), timeout_s=120)
    for key in results[0]:
        for rank, res in enumerate(results):
            r = res[key]
            assert r["diff"] == 0.0, f"{key} rank {rank}: parameters differ from the unsharded run by {r['diff']}"
            assert r["state_matches_owned"], f"{key} rank {rank} holds state for parameters it does not own"
            assert r["groups"] == (2 if key[1] in ("two-groups", "add-group") else 1)
        numel = results[0][key]["numel"]
        assert all(res[key]["numel"] == numel for res in results), "ranks disagree on the assignment"
        assert sum(res[key]["n_state"] for res in results) > 0
        # Balanced: no rank owns more than an even share plus the largest parameter (37 * 13).
        assert max(numel) <= sum(numel) / world_size + 37 * 13


def _lopsided_worker(info, seed):
    """One big parameter and two tiny ones on 3 ranks (two ranks own almost nothing), and a single
    parameter on 3 ranks (two ranks own nothing at all and only take part in the broadcasts)."""
    torch.manual_seed(seed)
    big, small1, small2 = nn.Parameter(torch.randn(101)), nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(2))
    lone = nn.Parameter(torch.randn(5))
    params = [big, small1, small2]
    ref = [p.detach().clone().requires_grad_() for p in params]
    opt = ShardedOptimizer(params, AdamW, lr=0.1)
    lone_opt = ShardedOptimizer([lone], torch.optim.SGD, lr=0.1, momentum=0.5)
    ref_opt = AdamW(ref, lr=0.1)
    lone_ref = lone.detach().clone().requires_grad_()
    lone_ref_opt = torch.optim.SGD([lone_ref], lr=0.1, momentum=0.5)
    for step in range(STEPS):
        for ps, o in ((params, opt), (ref, ref_opt), ([lone], lone_opt), ([lone_ref], lone_ref_opt)):
            o.zero_grad()
            sum(((p - step) ** 2).sum() * (i + 1) for i, p in enumerate(ps)).backward()
            o.step()
    diff = max((a - b).abs().max().item() for a, b in zip([*params, lone], [*ref, lone_ref], strict=True))
    return dict(diff=diff, owned=[p.numel() for p in opt.owned_parameters()],
                lone_owned=len(lone_opt.owned_parameters()), lone_state=len(lone_opt.local_optimizer.state))


def test_lopsided_sizes_and_idle_ranks(seed):
    results = spawn(_lopsided_worker, 3, (seed,), timeout_s=60)
    assert all(r["diff"] == 0.0 for r in results), [r["diff"] for r in results]
    assert sorted(tuple(r["owned"]) for r in results) == [(2,), (3,), (101,)]
    assert [r["lone_owned"] for r in results] == [1, 0, 0]
    assert [r["lone_state"] for r in results] == [1, 0, 0]


def _checkpoint_worker(info, seed, path, phase):
    return {kind: _checkpoint_one(info, seed, kind, f"{path}.{kind}", phase) for kind in ("adamw", "sgd")}


def _checkpoint_one(info, seed, kind, path, phase):
    """phase "save": train STEPS steps, saving model + optimizer at STEPS//2; "resume": load and finish."""
    cls, kwargs = _optimizer(kind)
    model, batches = _make(seed, "two-groups")
    make = lambda groups: ShardedOptimizer(groups, cls, **kwargs)
    if phase == "save":
        def save(m, o):
            sd = o.state_dict()  # collective: every rank calls it
            if info.rank == 0:
                assert sd["state"], "rank 0 got the consolidated state"
                torch.save({"model": m.state_dict(), "optim": sd}, path)
            else:
                assert sd == {}
        _run(model, make, "two-groups", batches, ckpt=(STEPS // 2, save))
    else:
        blob = torch.load(path, weights_only=False)
        model.load_state_dict(blob["model"])
        opt = make(_groups(model, "two-groups", late=False))
        opt.load_state_dict(blob["optim"])
        _run(model, make, "two-groups", batches, start=STEPS // 2, opt=opt)
    return [p.detach().clone() for p in model.parameters()]


def test_save_then_resume_continues_identically(seed, tmp_path):
    path = str(tmp_path / "ckpt.pt")
    straight = spawn(_checkpoint_worker, 2, (seed, path, "save"), timeout_s=60)
    resumed = spawn(_checkpoint_worker, 3, (seed, path, "resume"), timeout_s=60)  # even on 3 ranks
    for kind in ("adamw", "sgd"):
        for a, b in zip(straight[0][kind], resumed[0][kind], strict=True):
            assert torch.equal(a, b), kind
        _check_consolidated_layout(kind, seed, f"{path}.{kind}")


def _check_consolidated_layout(kind, seed, path):
    # The consolidated state is the unsharded optimizer's: same keys and shapes as cls(...).state_dict().
    cls, kwargs = _optimizer(kind)
    saved = torch.load(path, weights_only=False)["optim"]
    model, _ = _make(seed, "two-groups")
    plain = cls(_groups(model, "two-groups", late=False), **kwargs)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    plain.step()
    expected = plain.state_dict()
    assert saved["state"].keys() == expected["state"].keys()
    for i, st in expected["state"].items():
        assert {k: getattr(v, "shape", None) for k, v in st.items()} == \
            {k: getattr(v, "shape", None) for k, v in saved["state"][i].items()}


def _errors_worker(info):
    out = {}
    try:
        ShardedOptimizer([], AdamW, lr=1.0)
    except ValueError as e:
        out["empty"] = str(e)
    try:
        ShardedOptimizer(torch.zeros(3, requires_grad=True), AdamW, lr=1.0)
    except TypeError as e:
        out["tensor"] = str(e)
    p = nn.Parameter(torch.zeros(3))
    opt = ShardedOptimizer([p], AdamW, lr=1.0)
    try:
        opt.load_state_dict({})
    except ValueError as e:
        out["load"] = str(e)
    return out


def test_constructor_errors_match_torch():
    with pytest.raises(ValueError):
        torch.optim.AdamW([], lr=1.0)
    with pytest.raises(TypeError):
        torch.optim.AdamW(torch.zeros(3, requires_grad=True), lr=1.0)
    # Same exception types from the wrapper, before any collective (no process group needed).
    with pytest.raises(ValueError, match="empty parameter list"):
        ShardedOptimizer([], AdamW, lr=1.0)
    with pytest.raises(TypeError, match="iterable"):
        ShardedOptimizer(torch.zeros(3, requires_grad=True), AdamW, lr=1.0)
    out = spawn(_errors_worker, 2, timeout_s=60)[0]
    assert set(out) == {"empty", "tensor", "load"}
