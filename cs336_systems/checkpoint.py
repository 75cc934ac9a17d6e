"""Training checkpoints through ``torch.distributed.checkpoint`` (DCP), loadable under any strategy and world size.

A checkpoint is a directory ``DIR/step-000300`` (300 steps done) holding a DCP checkpoint (``.metadata`` and
``*.distcp`` files) and ``train_state.json`` (step, configuration, world size: what ``--resume`` reads
first). Everything is keyed by parameter name at full shape, whatever the strategy that wrote it:

=====================================  ========================================================================
key                                    value
=====================================  ========================================================================
``model.<name>``                       the weight (full shape; the fp32 master where the optimizer keeps one;
                                       replicated copies written once, DCP de-duplicates them)
``optim.<name>.exp_avg``               AdamW's moments (full shape) and ``optim.<name>.step`` (0-d int64)
``optim.<name>.exp_avg_sq``
``optim.<name>.low_precision_copy``    ``FusedAdamW`` with whole fp32 masters: the low-precision weight as
                                       its kernel rounded it (loaded as is; without it, the master rounded
                                       by ``.to()``); split masters (the bf16 default) derive the copy from
                                       the master and neither write nor read it
``rng.<rank>.cpu/.cuda``               each rank's torch RNG state (data batches depend on (seed, step) only)
=====================================  ========================================================================

How each strategy maps onto that (the adapters below): replicated strategies (``none`` and the DDP variants)
give their tensors as they are; ``zero1`` / ``torch-zero`` give the optimizer state of the parameters each rank
owns (DCP writes the union); ``torch-fsdp2`` gives its DTensors (DCP saves the shards and reshards on load);
our ``fsdp`` all-gathers each unit's weights and moments (``FSDP.gather_full``), each unit kept by one rank, and
on load cuts this rank's shard out of the full tensors (``FSDP.shard_of``).

Atomicity: every rank writes into ``DIR/.tmp-step-000300``; after all ranks finished (DCP's final collective)
rank 0 adds ``train_state.json`` and renames the directory into place. A kill during a save leaves only the
``.tmp-`` directory, which :func:`latest_checkpoint` never picks (and the next save removes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

STEP_DIR = re.compile(r"^step-(\d+)$")
STATE_FILE = "train_state.json"
ADAMW_KEYS = ("exp_avg", "exp_avg_sq")
COPY_KEY = "low_precision_copy"  # FusedAdamW: the bf16 weight the forward uses (model.<name> holds its fp32 master)


@contextmanager
def _quiet_single_process():
    """DCP warns that it 'assumes the intent is to save in a single process' when no group exists: it is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def is_complete(path: Path) -> bool:
    return (STEP_DIR.match(path.name) is not None and path.is_dir() and (path / ".metadata").is_file()
            and (path / STATE_FILE).is_file())


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, lowest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_complete(p)]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root`` (None if there is none)."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def read_train_state(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / STATE_FILE).read_text())


# -- adapters: a wrapped model and its optimizer <-> the flat dict of full-shape tensors by name ------------

def _fsdp_of(wrapped: nn.Module):
    from cs336_systems.parallel.fsdp import FSDP

    return wrapped if isinstance(wrapped, FSDP) else None


def _local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state: the wrapped one of ``ShardedOptimizer`` / ZeRO, or itself."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

    if isinstance(optimizer, ShardedOptimizer):
        return optimizer.local_optimizer
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer.optim
    return optimizer


def _stepped_params(optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    return [p for g in _local_optimizer(optimizer).param_groups for p in g["params"]]


def _ensure_adamw_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter this rank steps an (empty) AdamW state to load into (AdamW creates it lazily)."""
    local = _local_optimizer(optimizer)
    for p in _stepped_params(optimizer):
        if not local.state[p]:
            local.state[p] = {"step": 0, **{k: torch.zeros_like(p) for k in ADAMW_KEYS}}


def _renamer(names: dict[str, str] | None):
    """Module name -> the name a checkpoint keeps (``names``: e.g. activation checkpointing's wrapped block names
    -> the model's own; missing names are kept)."""
    return (lambda n: n) if not names else (lambda n: names.get(n, n))


def _model_state(module: nn.Module, local: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The module's state dict, with fp32 masters in place of low-precision copies where the optimizer keeps them
    (``FusedAdamW.master_state_dict``)."""
    if hasattr(local, "master_state_dict"):
        return local.master_state_dict(module)
    return module.state_dict()


def state_to_save(wrapped: nn.Module, optimizer: torch.optim.Optimizer, rank: int, world: int,
                  names: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """This rank's part of the checkpoint (a collective under ``fsdp``: call it on every rank). ``names``: module
    names -> the names to save under (default: the module's)."""
    module, fsdp = wrapped.module, _fsdp_of(wrapped)
    local = _local_optimizer(optimizer)
    own = _renamer(names)
    names = {p: own(n) for n, p in module.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    sharded = fsdp.shard_names() if fsdp is not None else {}
    keep = lambda unit_index: unit_index % world == rank  # each unit's full tensors on one rank
    if fsdp is not None:
        out.update((f"model.{own(k)}", v)
                   for k, v in fsdp.gather_full({p: p.detach() for p in sharded}, keep).items())
        for key in ADAMW_KEYS:
            full = fsdp.gather_full({p: local.state[p][key] for p in sharded}, keep)
            out.update((f"optim.{own(k)}.{key}", v) for k, v in full.items())
    sharded_names = set(sharded.values())
    for name, t in _model_state(module, local).items():
        if name not in sharded_names:
            out[f"model.{own(name)}"] = t  # a DTensor under torch-fsdp2: DCP saves its shards
    for p in _stepped_params(optimizer):
        state = local.state.get(p)
        if not state:
            continue
        out[f"optim.{names[p]}.step"] = torch.tensor(int(state["step"]), dtype=torch.int64)
        if "master" in state:  # the low-precision copy as the optimizer rounded it (its kernel may round unlike .to())
            out[f"optim.{names[p]}.{COPY_KEY}"] = p.detach()
        if p not in sharded:
            out.update((f"optim.{names[p]}.{key}", state[key]) for key in ADAMW_KEYS)
    out[f"rng.{rank}.cpu"] = torch.get_rng_state()
    device = next(module.parameters()).device
    if device.type == "cuda":
        out[f"rng.{rank}.cuda"] = torch.cuda.get_rng_state(device)
    return out


def _metadata(path: Path):
    return dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata


def _placeholder(meta) -> torch.Tensor:
    return torch.empty(tuple(meta.size), dtype=meta.properties.dtype)


def load(path: str | Path, wrapped: nn.Module, optimizer: torch.optim.Optimizer, rank: int,
         distributed: bool, names: dict[str, str] | None = None) -> None:
    """Load the checkpoint at ``path`` into ``wrapped`` and ``optimizer`` (any strategy, any world size; call
    on every rank). ``ValueError`` when the checkpoint's weights do not fit the model (another preset).
    ``names``: module names -> the names they were saved under (as for :func:`save`). Where the optimizer keeps
    fp32 masters of low-precision parameters (``FusedAdamW``), the saved weight goes into the master and the
    parameter becomes its rounded copy."""
    path = Path(path)
    saved = _metadata(path)
    module, fsdp = wrapped.module, _fsdp_of(wrapped)
    local = _local_optimizer(optimizer)
    _ensure_adamw_state(optimizer)
    own = _renamer(names)
    names = {p: own(n) for n, p in module.named_parameters()}
    sharded = fsdp.shard_names() if fsdp is not None else {}
    dest: dict[str, torch.Tensor] = {}
    full: dict[str, torch.Tensor] = {}  # fsdp: full tensors read here, then cut into shards
    copies = []  # (low-precision parameter, its fp32 master) to refresh after loading
    splits = []  # (low-precision parameter, fp32 buffer): split masters (FusedAdamW) set from the buffer
    for name, t in module.state_dict().items():
        dest[f"model.{own(name)}"] = t
    for p, name in names.items():
        master = local.state.get(p, {}).get("master")
        if "master_lo" in local.state.get(p, {}):  # the copy follows from the master: COPY_KEY is not read
            dest[f"model.{name}"] = torch.empty(p.shape, dtype=torch.float32, device=p.device)
            splits.append((p, dest[f"model.{name}"]))
        elif master is not None:
            dest[f"model.{name}"] = master
            if f"optim.{name}.{COPY_KEY}" in saved and tuple(saved[f"optim.{name}.{COPY_KEY}"].size) == tuple(p.shape):
                dest[f"optim.{name}.{COPY_KEY}"] = p.detach()  # the copy as it was
            else:
                copies.append((p, master))  # written by another optimizer: round the master
    for p in sharded:
        dest[f"model.{names[p]}"] = None
    for p in _stepped_params(optimizer):
        dest[f"optim.{names[p]}.step"] = torch.zeros((), dtype=torch.int64)
        for key in ADAMW_KEYS:
            dest[f"optim.{names[p]}.{key}"] = None if p in sharded else local.state[p][key]
    # Check the shapes first: a clear error instead of DCP's per-tensor one.
    expected_shapes = {own(k): v for k, v in fsdp.full_shapes().items()} if fsdp is not None else {}
    problems = []
    for key, t in dest.items():
        if key not in saved:
            problems.append(f"{key} is missing")
            continue
        if t is None:
            name = key.removeprefix("model.").removeprefix("optim.")
            for suffix in (".exp_avg_sq", ".exp_avg"):
                name = name.removesuffix(suffix)
            if tuple(saved[key].size) != tuple(expected_shapes[name]):
                problems.append(f"{key} has shape {tuple(saved[key].size)}, the model {tuple(expected_shapes[name])}")
            dest[key] = full[key] = _placeholder(saved[key])
        elif hasattr(saved[key], "size") and tuple(saved[key].size) != tuple(t.shape):
            problems.append(f"{key} has shape {tuple(saved[key].size)}, the model {tuple(t.shape)}")
    if problems:
        raise ValueError(f"train: checkpoint {path} does not fit this model ({len(problems)} mismatches, e.g. "
                         f"{'; '.join(problems[:3])}); resume with the --preset that wrote it")
    for suffix in ("cpu", "cuda"):
        key = f"rng.{rank}.{suffix}"
        if key in saved and (suffix == "cpu" or next(module.parameters()).device.type == "cuda"):
            dest[key] = _placeholder(saved[key])
    with _quiet_single_process():
        dcp.load(dest, checkpoint_id=str(path), no_dist=not distributed)
    with torch.no_grad():
        for p, master in copies:
            p.copy_(master)
        for p, value in splits:
            local.set_master(p, value)
        for p in sharded:
            p.copy_(fsdp.shard_of(p, full[f"model.{names[p]}"]))
            for key in ADAMW_KEYS:
                local.state[p][key].copy_(fsdp.shard_of(p, full[f"optim.{names[p]}.{key}"]))
    for p in _stepped_params(optimizer):
        local.state[p]["step"] = int(dest[f"optim.{names[p]}.step"])
    if f"rng.{rank}.cpu" in dest:
        torch.set_rng_state(dest[f"rng.{rank}.cpu"])
    if f"rng.{rank}.cuda" in dest:
        torch.cuda.set_rng_state(dest[f"rng.{rank}.cuda"], next(module.parameters()).device)


def save(root: str | Path, step: int, wrapped: nn.Module, optimizer: torch.optim.Optimizer, train_state: dict,
         rank: int, world: int, distributed: bool, names: dict[str, str] | None = None) -> Path:
    """Write ``root/step-<step>`` atomically (see the module docstring); call on every rank. Returns its path.
    ``names``: module names -> the names to save under (default: the module's own)."""
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}"
    if rank == 0:
        for stale in root.glob(".tmp-step-*"):  # left by saves that were killed
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
    if distributed:
        dist.barrier()
    state = state_to_save(wrapped, optimizer, rank, world, names)
    with _quiet_single_process():
        dcp.save(state, checkpoint_id=str(tmp), no_dist=not distributed)
    if rank == 0:  # dcp.save returned on every rank: all data and .metadata are written
        with open(tmp / STATE_FILE, "w") as f:
            json.dump({**train_state, "step": step, "world_size": world}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        old = root / f".old-{final.name}"
        if final.exists():  # the same step saved again (e.g. a resumed run preempted at once): replace it
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(root)
    if distributed:
        dist.barrier()
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint by key, in this process (no process group): for inspection and tests."""
    path = Path(path)
    state = {k: _placeholder(m) for k, m in _metadata(path).items() if hasattr(m, "size")}
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state


def export_state_dict(state: dict[str, torch.Tensor], path: str | Path, model_kwargs: dict) -> None:
    """Write a consolidated state dict (``torch.save``; ``BasicsTransformerLM(**model_kwargs).load_state_dict``
    loads it in one process) and ``<path>.json`` with the model's constructor arguments."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in state.items()}, path)
    Path(f"{path}.json").write_text(json.dumps(model_kwargs, indent=1) + "\n")
