"""AdamW that owns fp32 master weights and writes the low-precision copy the forward computes with.

``FusedAdamW(params, ..., compute_dtype=torch.bfloat16, low_precision=low_precision_params(model))`` keeps an
fp32 master of every parameter in ``low_precision`` and turns the parameter itself into a bf16 tensor:
the model then runs its matmuls on bf16 weights (autocast's per-step weight casts find nothing to cast)
and its gradients arrive in bf16; ``low_precision_params(model, "bf16")`` adds the token embedding, which
makes the residual stream bf16 (``is_compute_weight``). Each step updates, per parameter, the master, both
moments and the bf16 copy in one pass:

* CUDA: one multi-tensor Triton launch per bucket (parameters of one dtype and step count; a table of
  addresses picks each block's tensor) reads master, m, v (fp32) and the gradient and writes master, m, v
  and the bf16 copy, while the forward's cast (6 bytes) and the backward's bf16 -> fp32 gradient cast (6 bytes)
  disappear. Under bf16 the master is kept split (``split_masters=True``, the default): the bf16 parameter is
  its upper half, rounded to nearest (ties away from zero), and an int16 tensor holds the low 16 bits, so the
  fp32 value is exact and the step moves 26 bytes per parameter instead of 28 (an fp32 master beside the copy,
  as fp32 fused AdamW moves), and the state takes 2 bytes a parameter less. The addresses of masters, moments
  and parameters are taken once: do not reallocate parameters after construction. The step's
  hyperparameters (learning rate, bias corrections, seed) travel in the same device table, so a CUDA graph of
  the whole training step (``cs336_systems.step_graph.CapturedStep``) replays the kernel with each step's values
  (``before_graph_replay``; ``after_graph_replay`` moves the host's per-step work under the running replay).
* CPU (and ``use_triton=False``): the same arithmetic with ``torch._foreach`` ops, then a copy.

Update and its order are ``cs336_basics.optimizer.AdamW``'s: decay, lerp of m, v, bias corrections,
``p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)``; the Triton kernel rounds as those ops do
(IEEE sqrt and division). Parameters not selected (norm gains; the token embedding unless
``is_compute_weight`` selects it, which makes the residual stream bf16) stay fp32 and are their own master.
``master_of(p)`` is a parameter's fp32 value, ``set_master(p, value)`` sets it (and the copy), and
``master_state_dict(model)`` returns the model's state with the fp32 masters in place of the bf16 copies
(what a checkpoint should store). Parameters handed over in bf16 or fp16 (and not selected) keep
their moments in that dtype, as ``cs336_basics.optimizer.AdamW`` does: the 2026 leaderboard's all-bf16
configuration, with the arithmetic in fp32 and one rounding per stored value.

``stochastic_rounding=True`` rounds those bf16 values (parameters without a master, and their moments)
stochastically instead of to nearest (Gupta et al. 2015, "Deep learning with limited numerical precision";
Zamirai et al. 2020, "Revisiting BFloat16 training"): unbiased, so changes smaller than half a bf16 ulp
survive in expectation. To nearest, they are lost: ``v * beta2`` with beta2 = 0.999 rounds back to ``v``,
so v stops decaying while its bias correction keeps growing, and the effective step size grows with the
step count. The random bits come from Philox (Triton) or a ``torch.Generator`` (foreach path), keyed by
the ``seed`` kept in the param groups (and so in checkpoints), the step and the bucket.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from cs336_basics.optimizer import adamw_foreach_update, check_adamw_hyperparameters

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency; CPU-only installs fall back to foreach
    triton = None

if triton is not None:
    @triton.jit
    def _round_bf16_stochastic(x, rand):
        """fp32 -> bf16, up with probability (x - down) / ulp: 16 random bits added below bf16's last mantissa
        bit, then truncation (sign-magnitude, so negative values round symmetrically). NaN stays NaN (the carry
        would make a zero of the all-ones NaN)."""
        bits = x.to(tl.uint32, bitcast=True) + (rand & 0xFFFF).to(tl.uint32)
        return tl.where(x != x, x, ((bits >> 16) << 16).to(tl.float32, bitcast=True)).to(tl.bfloat16)

    @triton.jit
    def _hyper(ptrs_ptr, n_tensors, i: tl.constexpr):
        """Hyperparameter ``i`` (0-6) of the launch: fp64 bit patterns after the seed, which follows the tensors'
        rows in the table; rounded to fp32 as a scalar argument would be."""
        return tl.load(ptrs_ptr + 5 * n_tensors + 1 + i).to(tl.float64, bitcast=True).to(tl.float32)

    @triton.jit
    def _join_master(hi, lo):
        """fp32 from its bf16 copy (rounded to nearest, ties away from zero) and its low 16 bits (int16)."""
        hi = hi.to(tl.uint16, bitcast=True).to(tl.uint32)
        lo = lo.to(tl.uint16, bitcast=True).to(tl.uint32)
        return (((hi - (lo >= 0x8000).to(tl.uint32)) << 16) | lo).to(tl.float32, bitcast=True)

    @triton.jit
    def _split_master(x):
        """fp32 -> (bf16 rounded to nearest, ties away from zero; its low 16 bits as int16): ``_join_master``'s
        inverse, exact for every value but NaN, which stays a NaN in both (its quiet bit set in the copy: the
        rounding's carry would turn some NaNs into zeros)."""
        bits = x.to(tl.uint32, bitcast=True)
        hi = tl.where(x != x, (bits >> 16) | 0x40, (bits + 0x8000) >> 16)
        hi = hi.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        lo = (bits & 0xFFFF).to(tl.uint16).to(tl.int16, bitcast=True)
        return hi, lo

    @triton.jit
    def _adamw_kernel(ptrs_ptr, n_tensors, numels_ptr, block_tensor_ptr, block_start_ptr, STATE_DTYPE: tl.constexpr,
                      GRAD_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr, HAS_OUT: tl.constexpr, SPLIT: tl.constexpr,
                      STOCHASTIC: tl.constexpr, BLOCK: tl.constexpr):
        """One program updates BLOCK elements of one tensor; ``ptrs`` holds (master, m, v, grad, out) addresses
        per tensor, so one launch covers every parameter of a bucket (multi-tensor apply), then the step's seed
        and hyperparameters: read from device memory, so that a CUDA graph replays the kernel with each step's
        values. SPLIT: the master is the bf16 ``out`` plus the int16 low bits at ``master`` (read and written
        as two halves). STOCHASTIC: the stored state (bf16) is rounded stochastically, with Philox streams keyed
        by the seed and the block."""
        pid = tl.program_id(0)
        t = tl.load(block_tensor_ptr + pid).to(tl.int64)
        offs = tl.load(block_start_ptr + pid).to(tl.int64) + tl.arange(0, BLOCK)
        mask = offs < tl.load(numels_ptr + t)
        decay = _hyper(ptrs_ptr, n_tensors, 0)
        beta1c = _hyper(ptrs_ptr, n_tensors, 1)
        beta2 = _hyper(ptrs_ptr, n_tensors, 2)
        beta2c = _hyper(ptrs_ptr, n_tensors, 3)
        sqrt_bc2 = _hyper(ptrs_ptr, n_tensors, 4)
        eps = _hyper(ptrs_ptr, n_tensors, 5)
        step_size = _hyper(ptrs_ptr, n_tensors, 6)
        m_ptr = tl.load(ptrs_ptr + 5 * t + 1).to(tl.pointer_type(STATE_DTYPE))
        v_ptr = tl.load(ptrs_ptr + 5 * t + 2).to(tl.pointer_type(STATE_DTYPE))
        g_ptr = tl.load(ptrs_ptr + 5 * t + 3).to(tl.pointer_type(GRAD_DTYPE))
        if SPLIT:
            lo_ptr = tl.load(ptrs_ptr + 5 * t).to(tl.pointer_type(tl.int16))
            out_ptr = tl.load(ptrs_ptr + 5 * t + 4).to(tl.pointer_type(tl.bfloat16))
            p = _join_master(tl.load(out_ptr + offs, mask=mask), tl.load(lo_ptr + offs, mask=mask))
        else:
            master_ptr = tl.load(ptrs_ptr + 5 * t).to(tl.pointer_type(STATE_DTYPE))
            p = tl.load(master_ptr + offs, mask=mask).to(tl.float32)  # the arithmetic is fp32 for any state dtype
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=mask).to(tl.float32)
        p = p * decay
        m = m + beta1c * (g - m)  # torch.lerp(m, g, 1 - beta1) for weights below 0.5
        v = v * beta2 + beta2c * (g * g)
        denom = tl.div_rn(tl.sqrt_rn(v), sqrt_bc2) + eps
        p = p + step_size * tl.div_rn(m, denom)
        if STOCHASTIC:  # bf16 parameters without a master
            seed = tl.load(ptrs_ptr + 5 * n_tensors)
            r0, r1, r2, _ = tl.randint4x(seed, pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK))
            tl.store(master_ptr + offs, _round_bf16_stochastic(p, r0), mask=mask)
            tl.store(m_ptr + offs, _round_bf16_stochastic(m, r1), mask=mask)
            tl.store(v_ptr + offs, _round_bf16_stochastic(v, r2), mask=mask)
        else:
            if SPLIT:
                hi, lo = _split_master(p)
                tl.store(out_ptr + offs, hi, mask=mask)
                tl.store(lo_ptr + offs, lo, mask=mask)
            else:
                tl.store(master_ptr + offs, p.to(STATE_DTYPE), mask=mask)
                if HAS_OUT:
                    out_ptr = tl.load(ptrs_ptr + 5 * t + 4).to(tl.pointer_type(OUT_DTYPE))
                    tl.store(out_ptr + offs, p.to(OUT_DTYPE), mask=mask)
            tl.store(m_ptr + offs, m.to(STATE_DTYPE), mask=mask)
            tl.store(v_ptr + offs, v.to(STATE_DTYPE), mask=mask)

    _TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


# elements per program and warps (scripts/device/adamw_bandwidth.py, xl on an H100, session 24): whole masters
# 1024 x 8 warps, 19.06 ms a step (2.93 TB/s; 4096: 2.58); split masters 1024 x 4 warps, 17.82 ms (2.91 TB/s;
# 8 warps: 18.41), whose 2-byte halves load as 8 bytes a thread at 8 warps
_BLOCK = 1024
_NUM_WARPS = 8
_NUM_WARPS_SPLIT = 4
# split masters by GPU name where another tile measured faster: the H200 (session 47, xl): 512 x 2 warps 13.16 ms
# (3.95 TB/s) against 1024 x 4's 13.72 (3.79), and 13.55 against 14.23 ms a step in the captured xl/2048 step; its
# higher bandwidth wants more programs resident, as smaller ones allow (512 x 4: 13.25; 256 untried)
_SPLIT_BY_GPU = {"H200": (512, 2)}


def _tile(device: torch.device, split: bool) -> tuple[int, int]:
    """(elements per program, warps) of the kernel for a bucket on ``device``."""
    if split and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, tile in _SPLIT_BY_GPU.items():
            if key in name:
                return tile
    return _BLOCK, _NUM_WARPS_SPLIT if split else _NUM_WARPS


class _Launch:
    """The fixed part of one multi-tensor launch (a bucket of parameters of one dtype and step count): per-block
    tensor index and offset, numels, and a device table of addresses, seed and hyperparameters, whose grad column
    and last two rows are refreshed each step (gradients are new tensors every step) through a small ring of
    pinned host buffers. A launch captured in a CUDA graph keeps the addresses of the gradients it was captured
    with (the graph's own) and refreshes only the seed and hyperparameters, before each replay."""

    def __init__(self, params: list[Tensor], rows: list[list[int]], device: torch.device,
                 like: _Launch | None, tile: tuple[int, int]):
        self.params = params
        if like is not None:  # under a capture: no allocations or copies, the tensors of an eager launch
            self.n_blocks, self.block_tensor, self.block_start, self.numels, self.tile = (
                like.n_blocks, like.block_tensor, like.block_start, like.numels, like.tile)
        else:
            self.tile = tile  # (elements per program, warps): the block table is cut for it
            numels = [p.numel() for p in params]
            blocks = [triton.cdiv(n, tile[0]) for n in numels]
            self.n_blocks = sum(blocks)
            tensor_of_block = torch.repeat_interleave(torch.arange(len(params), dtype=torch.int32),
                                                      torch.tensor(blocks))
            first = torch.cumsum(torch.tensor([0, *blocks[:-1]]), 0)
            start = (torch.arange(self.n_blocks) - first.repeat_interleave(torch.tensor(blocks))) * tile[0]
            self.block_tensor = tensor_of_block.to(device)
            self.block_start = start.to(torch.int64).to(device)
            self.numels = torch.tensor(numels, dtype=torch.int64, device=device)
        # (n + 2, 5): per tensor (master, m, v, grad, out); then the seed and 7 hyperparameters (fp64 bits), flat
        self.host_rows = torch.zeros(len(rows) + 2, 5, dtype=torch.int64)
        self.host_rows[:len(rows)] = torch.tensor(rows, dtype=torch.int64)
        self.pinned = device.type == "cuda"
        self.ring: list[Tensor] = []  # made on the first upload (never inside a capture)
        self.events = [torch.cuda.Event() if self.pinned else None for _ in range(3)]
        # A table allocated during a capture would come from the graph's pool, where the replayed step's earlier
        # kernels may write over what was uploaded: the captured launch takes the table its eager launch set aside.
        if like is not None:
            self.table = like.graph_table
        else:
            self.table = torch.empty_like(self.host_rows, device=device)
            self.graph_table = torch.empty_like(self.table)
        self.turn = 0
        self.prepared: tuple | None = None  # the (seed, hyperparameters) uploaded ahead for the next replay

    def fill(self, seed: int, hyper: tuple[float, ...], grads: bool = True) -> None:
        """Write the step's values into the host table (``grads``: the gradients' current addresses too)."""
        n = len(self.params)
        if grads:
            self.host_rows[:n, 3] = torch.tensor([p.grad.data_ptr() for p in self.params], dtype=torch.int64)
        flat = self.host_rows[n:].view(-1)
        flat[0] = seed
        flat[1:1 + len(hyper)] = torch.tensor(hyper, dtype=torch.float64).view(torch.int64)

    def upload(self) -> Tensor:
        """Copy the host table to the device, in stream order."""
        if not self.ring:
            self.ring = [torch.empty_like(self.host_rows, pin_memory=self.pinned) for _ in range(3)]
        slot = self.turn % len(self.ring)
        self.turn += 1
        if self.events[slot] is not None:
            self.events[slot].synchronize()  # the copy that last read this slot (two steps ago) is done
        self.ring[slot].copy_(self.host_rows)
        self.table.copy_(self.ring[slot], non_blocking=True)
        if self.events[slot] is not None:
            self.events[slot].record()
        return self.table


def round_bf16_stochastic(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """``x`` (fp32) rounded to bf16 stochastically, as the Triton kernel does: random low 16 bits added to the
    fp32 bit pattern, then truncated (NaN stays NaN)."""
    x = x.float().contiguous()
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    bits = (x.view(torch.int32) + noise).bitwise_and_(-65536)
    return torch.where(torch.isnan(x), x, bits.view(torch.float32)).to(torch.bfloat16)


_SPLIT_CHUNK = 1 << 22  # elements per step of split_master / join_master: their temporaries stay about 150 MB


def _split_chunk(x: Tensor) -> tuple[Tensor, Tensor]:
    bits = x.view(torch.int32)
    upper = (bits >> 16) & 0xFFFF
    carry = ((bits & 0xFFFF) >= 0x8000).to(torch.int32)  # to nearest, ties away from zero (in magnitude)
    hi = torch.where(torch.isnan(x), upper | 0x40, (upper + carry) & 0xFFFF)
    to16 = lambda u: (u - ((u >= 0x8000).to(torch.int32) << 16)).to(torch.int16)  # 0..0xFFFF -> int16 bits
    return to16(hi).view(torch.bfloat16), to16(bits & 0xFFFF)


def _join_chunk(hi: Tensor, lo: Tensor) -> Tensor:
    lo = lo.to(torch.int32) & 0xFFFF
    upper = ((hi.view(torch.int16).to(torch.int32) & 0xFFFF) - (lo >= 0x8000).to(torch.int32)) & 0xFFFF
    signed = upper - ((upper >= 0x8000).to(torch.int32) << 16)
    return (signed * 65536 + lo).view(torch.float32)  # within int32: no overflow


def split_master(x: Tensor) -> tuple[Tensor, Tensor]:
    """An fp32 tensor as (its bf16 copy rounded to nearest, ties away from zero; its low 16 bits as int16): 4
    bytes that hold the fp32 value exactly (``join_master``), where an fp32 master beside its bf16 copy takes 6.
    Ties go away from zero, not to even as ``.to(torch.bfloat16)`` rounds: with ties to even, the 16 low bits
    0x8000 leave it open whether the copy was rounded up. A NaN stays a NaN in the copy and when joined (not bit
    for bit). Works in chunks, so that a large embedding needs no int32 temporaries of its own size."""
    x = x.detach().float().contiguous()
    hi = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    lo = torch.empty(x.shape, dtype=torch.int16, device=x.device)
    flat, flat_hi, flat_lo = x.view(-1), hi.view(-1), lo.view(-1)
    for start in range(0, flat.numel(), _SPLIT_CHUNK):
        part = slice(start, start + _SPLIT_CHUNK)
        h, low = _split_chunk(flat[part])
        flat_hi[part].copy_(h)
        flat_lo[part].copy_(low)
    return hi, lo


def join_master(hi: Tensor, lo: Tensor) -> Tensor:
    """The fp32 tensor that ``split_master`` split into ``hi`` (bf16) and ``lo`` (int16)."""
    hi, lo = hi.detach().contiguous(), lo.contiguous()
    out = torch.empty(hi.shape, dtype=torch.float32, device=hi.device)
    flat_out, flat_hi, flat_lo = out.view(-1), hi.view(-1), lo.view(-1)
    for start in range(0, flat_out.numel(), _SPLIT_CHUNK):
        part = slice(start, start + _SPLIT_CHUNK)
        flat_out[part].copy_(_join_chunk(flat_hi[part], flat_lo[part]))
    return out


def _master_kind(state: dict) -> str | None:
    """How a parameter's state keeps its fp32 master: "split" (the bf16 parameter and int16 low halves),
    "master" (a whole fp32 tensor beside the copy), or None (the parameter is its own master)."""
    return "split" if "master_lo" in state else "master" if "master" in state else None


def _launch_seed(seed: int, step: int, bucket: int) -> int:
    """A distinct 63-bit Philox key per (seed, step, bucket)."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + bucket * 0x94D049BB133111EB) % (1 << 63)


def is_matmul_weight(module: nn.Module, name: str, param: nn.Parameter) -> bool:
    """The default selection: weights of ``Linear`` modules (the tensors autocast would cast every step)."""
    from cs336_basics.model import Linear

    return isinstance(module, (Linear, nn.Linear)) and name == "weight"


def is_compute_weight(module: nn.Module, name: str, param: nn.Parameter) -> bool:
    """Linear weights and the token embedding table. With the table in bf16 its rows, and so the residual stream
    (the embedding output, every residual add and their gradients), are bf16 too, where autocast keeps them fp32:
    the default of Megatron-LM (without ``--fp32-residual-connection``) and of torchtitan (FSDP2 with
    ``param_dtype=bfloat16``). Norm gains stay fp32; the norms compute in fp32."""
    from cs336_basics.model import Embedding

    return is_matmul_weight(module, name, param) or (isinstance(module, (Embedding, nn.Embedding))
                                                     and name == "weight")


# which parameters get a bf16 copy, by the residual stream's dtype under bf16 (cs336_systems.fast.RESIDUAL_DTYPES)
SELECT_BY_RESIDUAL_DTYPE = {"fp32": is_matmul_weight, "bf16": is_compute_weight}


def low_precision_params(model: nn.Module, select: Callable | str = is_matmul_weight) -> set[nn.Parameter]:
    """The parameters ``select`` picks: a predicate ``(module, name, param)``, or a residual dtype of
    ``SELECT_BY_RESIDUAL_DTYPE`` ("fp32": the Linear weights; "bf16": those and the token embedding)."""
    if isinstance(select, str):
        if select not in SELECT_BY_RESIDUAL_DTYPE:
            raise ValueError(f"low_precision_params: unknown residual dtype {select!r}; choose from "
                             f"{', '.join(SELECT_BY_RESIDUAL_DTYPE)}")
        select = SELECT_BY_RESIDUAL_DTYPE[select]
    return {p for mod in model.modules() for name, p in mod.named_parameters(recurse=False) if select(mod, name, p)}


class FusedAdamW(torch.optim.Optimizer):
    """See the module docstring. ``low_precision``: the parameters to hold in ``compute_dtype`` (an fp32 master
    each); ``use_triton``: None picks Triton for CUDA tensors (or under ``TRITON_INTERPRET=1``), foreach otherwise;
    ``stochastic_rounding``: see the module docstring (``seed`` None draws one from torch's generator when
    stochastic rounding is on)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 compute_dtype: torch.dtype | None = None, low_precision: Iterable[nn.Parameter] = (),
                 use_triton: bool | None = None, stochastic_rounding: bool = False, seed: int | None = None,
                 split_masters: bool = True):
        check_adamw_hyperparameters(lr, betas, eps, weight_decay)
        if not isinstance(stochastic_rounding, bool):
            raise ValueError(f"FusedAdamW: stochastic_rounding must be True or False, got {stochastic_rounding!r}")
        if seed is None:  # drawn only when used, so that other users' random streams stay as they were
            seed = int(torch.randint(0, 1 << 62, (1,)).item()) if stochastic_rounding else 0
        elif not isinstance(seed, int) or seed < 0:
            raise ValueError(f"FusedAdamW: seed must be a non-negative int or None, got {seed!r}")
        if not isinstance(split_masters, bool):
            raise ValueError(f"FusedAdamW: split_masters must be True or False, got {split_masters!r}")
        if compute_dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"FusedAdamW: compute_dtype must be None, float32, bfloat16 or float16, "
                             f"got {compute_dtype}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      stochastic_rounding=stochastic_rounding, seed=seed))
        self.use_triton = use_triton
        self._launches: dict[tuple, _Launch] = {}  # multi-tensor launch tables by bucket
        self._captured: list[tuple[_Launch, int, int]] = []  # the launches of a step captured in a CUDA graph
        self._replayed = True  # False between a capture and its first replay
        self._uncounted = False  # a replay was launched whose step the host has not counted yet
        self._group_index = {p: i for i, g in enumerate(self.param_groups) for p in g["params"]}
        low = set(low_precision) if compute_dtype not in (None, torch.float32) else set()
        for group in self.param_groups:
            for p in group["params"]:
                if p in low and p.dtype != torch.float32:
                    raise ValueError(f"FusedAdamW: parameters given a {compute_dtype} copy must be fp32 when "
                                     f"handed over, got {p.dtype}")
                if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                    raise ValueError(f"FusedAdamW: parameters must be float32, bfloat16 or float16, got {p.dtype}")
                if group["stochastic_rounding"] and p.dtype == torch.float16 and p not in low:
                    raise ValueError("FusedAdamW: stochastic_rounding rounds bfloat16 state only; got a float16 "
                                     "parameter without an fp32 master (use bfloat16, or low_precision with a "
                                     "compute_dtype)")
                state = self.state[p]
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
                if p in low and split_masters and compute_dtype == torch.bfloat16:
                    p.data, state["master_lo"] = split_master(p.data)
                elif p in low:
                    state["master"] = p.detach().clone()
                    p.data = p.data.to(compute_dtype)

    def _triton_ok(self, p: Tensor) -> bool:
        if triton is None or not p.is_contiguous() or p.dtype not in _TL_DTYPES:
            return False
        if self.use_triton is not None:
            return self.use_triton
        return p.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"

    @torch.no_grad()
    def step(self, closure=None):
        self._count_replay()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._apply([p for group in self.param_groups for p in group["params"] if p.grad is not None])
        return loss

    def _apply(self, params: list[Tensor]) -> None:
        """Update ``params`` (which have gradients): one multi-tensor launch per (group, dtype, step) bucket."""
        buckets: dict[tuple, list[Tensor]] = {}
        for p in params:
            if p.grad.is_sparse:
                raise ValueError("FusedAdamW does not support sparse gradients")
            state = self.state[p]
            state["step"] += 1
            triton_ok = self._triton_ok(p) and p.grad.is_contiguous() and p.grad.dtype == p.dtype
            key = (self._group_index[p], triton_ok, state["step"], p.device, p.dtype, _master_kind(state))
            buckets.setdefault(key, []).append(p)
        capturing = any(p.is_cuda for p in params) and torch.cuda.is_current_stream_capturing()
        if capturing:
            self._captured, self._replayed = [], False
        for bucket, ((gi, triton_ok, step, _, dtype, _master), ps) in enumerate(buckets.items()):
            if triton_ok:
                launch = self._triton_update(ps, gi, bucket, step, capturing)
                if capturing:
                    self._captured.append((launch, gi, bucket))
            elif capturing:
                raise ValueError("FusedAdamW: a CUDA graph can capture only the Triton path (contiguous CUDA "
                                 "parameters and gradients of the parameter's dtype)")
            else:
                group = self.param_groups[gi]
                args = (ps, step, group["lr"], *group["betas"], group["eps"], group["weight_decay"],
                        self._seed(gi, bucket, step, dtype, _master_kind(self.state[ps[0]]) is not None))
                self._foreach_update(*args)

    def _seed(self, gi: int, bucket: int, step: int, dtype: torch.dtype, has_master: bool) -> int | None:
        """The Philox key of a bucket's launch when its stored values are rounded stochastically, else None."""
        group = self.param_groups[gi]
        stochastic = group["stochastic_rounding"] and dtype == torch.bfloat16 and not has_master
        return _launch_seed(group["seed"], step, bucket) if stochastic else None

    def _hyper(self, gi: int, step: int) -> tuple[float, ...]:
        """The kernel's hyperparameters: decay, 1 - beta1, beta2, 1 - beta2, sqrt(bias correction 2), eps, step
        size (negative)."""
        group = self.param_groups[gi]
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        bc1, bc2 = 1.0 - beta1**step, 1.0 - beta2**step
        return 1.0 - lr * wd, 1.0 - beta1, beta2, 1.0 - beta2, math.sqrt(bc2), eps, -lr / bc1

    def _triton_update(self, params: list[Tensor], gi: int, bucket: int, step: int, capturing: bool) -> _Launch:
        """One multi-tensor launch. Under CUDA graph capture the launch gets its own table, filled but not yet
        uploaded: ``before_graph_replay`` uploads it."""
        ids = tuple(id(p) for p in params)
        launch = self._launches.get((capturing, *ids))
        if launch is None:
            like = self._launches.get((False, *ids)) if capturing else None
            if capturing and like is None:
                raise ValueError("FusedAdamW: a CUDA graph can capture a step only after an eager step of the same "
                                 "parameters (it builds the launch tables, which a capture cannot copy to the GPU)")
            rows = []
            for p in params:
                st = self.state[p]
                master = st.get("master_lo", st.get("master", p))  # split: the low halves (the bf16 ``p`` is out)
                rows.append([master.data_ptr(), st["exp_avg"].data_ptr(), st["exp_avg_sq"].data_ptr(), 0,
                             p.data_ptr()])
            tile = _tile(params[0].device, _master_kind(self.state[params[0]]) == "split")
            launch = self._launches[(capturing, *ids)] = _Launch(params, rows, params[0].device, like, tile)
        state = self.state[params[0]]
        kind = _master_kind(state)
        seed = self._seed(gi, bucket, step, params[0].dtype, kind is not None)
        launch.fill(seed or 0, self._hyper(gi, step))
        launch.prepared = None
        if not capturing:
            launch.upload()
        dtype = _TL_DTYPES[params[0].dtype]
        _adamw_kernel[(launch.n_blocks,)](
            launch.table, len(params), launch.numels, launch.block_tensor, launch.block_start,
            STATE_DTYPE=_TL_DTYPES[state["exp_avg"].dtype], GRAD_DTYPE=dtype, OUT_DTYPE=dtype,
            HAS_OUT=kind is not None, SPLIT=kind == "split", STOCHASTIC=seed is not None, BLOCK=launch.tile[0],
            num_warps=launch.tile[1])
        return launch

    def before_graph_replay(self) -> None:
        """Make the step that a CUDA graph captured (``cs336_systems.step_graph.CapturedStep``) the next step: the
        captured step did its own bookkeeping while it was recorded, so the first replay only uploads what it
        filled in; every later replay takes the next step count and the groups' current hyperparameters (a changed
        ``lr`` applies), uploaded unless ``after_graph_replay`` already uploaded the same values. Call it on the
        replaying stream, right before the replay."""
        if not self._captured:
            raise ValueError("FusedAdamW.before_graph_replay: no step of this optimizer was captured in a CUDA graph")
        self._count_replay()  # the previous replay's, where after_graph_replay was not called
        for launch, gi, bucket in self._captured:
            if not self._replayed:
                launch.upload()
            elif launch.prepared != (values := self._replay_values(launch, gi, bucket)):
                launch.fill(*values, grads=False)
                launch.upload()
            launch.prepared = None
        self._uncounted, self._replayed = self._replayed, True

    def after_graph_replay(self) -> None:
        """The host's share of a replay that can wait until the replay is launched (the GPU busy meanwhile): count
        the step for every parameter it updates (checkpoints and resume read the counts) and upload the next
        step's values, in stream order behind the replay, so that ``before_graph_replay`` uploads nothing unless
        the hyperparameters change in between (a learning-rate schedule). Optional: without it
        ``before_graph_replay`` does both."""
        self._count_replay()
        for launch, gi, bucket in self._captured:
            values = self._replay_values(launch, gi, bucket)
            launch.fill(*values, grads=False)
            launch.upload()
            launch.prepared = values

    def _replay_values(self, launch: _Launch, gi: int, bucket: int) -> tuple[int, tuple[float, ...]]:
        """The seed and hyperparameters of a captured launch's next step."""
        p = launch.params[0]
        step = self.state[p]["step"] + 1
        seed = self._seed(gi, bucket, step, p.dtype, _master_kind(self.state[p]) is not None)
        return seed or 0, self._hyper(gi, step)

    def _count_replay(self) -> None:
        """Count a launched replay's step in every parameter's state (once)."""
        if not self._uncounted:
            return
        self._uncounted = False
        for launch, _, _ in self._captured:
            for p in launch.params:
                self.state[p]["step"] += 1

    def state_dict(self) -> dict:
        self._count_replay()
        return super().state_dict()

    def _foreach_update(self, params: list[Tensor], step: int, lr, beta1, beta2, eps, wd, seed: int | None) -> None:
        if seed is not None:  # bf16 state rounded stochastically: the arithmetic on fp32 copies, one rounding each
            states = [params, [self.state[p]["exp_avg"] for p in params], [self.state[p]["exp_avg_sq"] for p in params]]
            wide = [[t.float() for t in ts] for ts in states]
            adamw_foreach_update(*wide[:1], [p.grad.float() for p in params], *wide[1:], step, lr, beta1, beta2, eps,
                                 wd)
            generator = torch.Generator(params[0].device).manual_seed(seed)
            for ts, ws in zip(states, wide, strict=True):
                for t, w in zip(ts, ws, strict=True):
                    t.copy_(round_bf16_stochastic(w, generator))
            return
        masters = [self.master_of(p) for p in params]  # split masters: joined into fp32 temporaries
        grads = [p.grad.to(self.state[p]["exp_avg"].dtype) for p in params]  # fp32, or a bf16 / fp16 state's dtype
        adamw_foreach_update(masters, grads, [self.state[p]["exp_avg"] for p in params],
                             [self.state[p]["exp_avg_sq"] for p in params], step, lr, beta1, beta2, eps, wd)
        for p, m in zip(params, masters, strict=True):
            if m is not p:
                self.set_master(p, m)

    def load_state_dict(self, state_dict: dict) -> None:
        # torch casts floating-point state to its parameter's dtype: bf16 parameters' fp32 moments and masters
        # would lose their low bits. Each state tensor is put back as it was saved.
        saved = state_dict["state"]
        order = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(order, params, strict=True):
            for key, value in saved.get(i, {}).items():
                if isinstance(value, Tensor) and key != "step":
                    self.state[p][key] = value.to(device=p.device, copy=True)
        for group in self.param_groups:  # state saved before stochastic rounding existed
            group.setdefault("stochastic_rounding", False)
            group.setdefault("seed", self.defaults["seed"])
        self._launches.clear()  # the state tensors are new: their addresses too
        self._captured, self._uncounted = [], False  # and a captured step would update the old ones

    def master_of(self, p: nn.Parameter) -> Tensor:
        """The fp32 value of ``p``: its master, a new tensor joined from ``p`` and its low halves (split masters),
        or ``p`` itself where it has none."""
        state = self.state[p]
        if "master_lo" in state:
            return join_master(p.data, state["master_lo"])
        return state.get("master", p)

    @torch.no_grad()
    def set_master(self, p: nn.Parameter, value: Tensor) -> None:
        """Make ``value`` (fp32, ``p``'s shape) the master of ``p`` and refresh its copy (loading a checkpoint)."""
        state = self.state[p]
        if "master_lo" in state:
            hi, lo = split_master(value)
            p.data.copy_(hi)
            state["master_lo"].copy_(lo)
        elif "master" in state:
            if value is not state["master"]:
                state["master"].copy_(value)
            p.data.copy_(state["master"])
        else:
            p.data.copy_(value)

    def master_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        """``model.state_dict()`` with every low-precision parameter replaced by its fp32 master."""
        by_id = {id(p): self.master_of(p) for group in self.param_groups for p in group["params"]}
        params = dict(model.named_parameters())
        return {k: (by_id.get(id(params[k]), v) if k in params else v).detach()
                for k, v in model.state_dict().items()}
