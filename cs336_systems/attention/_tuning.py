"""Tile sizes, warps, pipeline stages and memory form of the FlashAttention-2 Triton kernels: one table.

``config_for(device, n_q, d_pad, dtype)`` is the only lookup; it is cached per (device, query-length
bucket, padded head dim, dtype), so a call costs a dict lookup and nothing is tuned at run time. Its
answer, per kernel (``FlashConfig``: ``fwd``; ``bwd``, the fused dK/dV/dQ-atomic kernel; ``dkdv`` and
``dq``, the deterministic backward; ``atomic_dq``, which backward is the default; ``single_max_programs``, up to
which grid size the whole backward is one kernel, with ``single``'s tiles or else ``dkdv``'s; ``small_fwd``, the
forward's tiles for small calls, in the Gluon forward where it runs, else by block pointers):
1. on a GPU of the compute capability recorded in ``flash_tune_h100.json`` (next to this module, written
   by ``scripts/device/flash_tune.py`` on an H100): its entry for the query-length bucket, else for the
   head dim and dtype;
2. otherwise the code table ``_table`` below (H100 sweeps, docs/flash_tuning_notes.md);
3. on the CPU (the Triton interpreter) 16 x 16 tiles so the interpreter stays quick.
``hopper_fwd`` / ``hopper_bwd`` are the Gluon kernels' tiles on sm_90 (None elsewhere: the Triton kernels run).
``KernelConfig.tma`` selects tensor-descriptor (TMA) loads and stores; the launcher still falls back to
block pointers where descriptors cannot describe the tensors (``flash_triton._tma_fits``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch


@dataclass(frozen=True)
class KernelConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False  # tensor-descriptor (TMA) loads and stores
    # Gluon kernels: two consumer warpgroups of 64 rows (query rows forward, key rows backward) and a producer
    # warp (flash_hopper, flash_hopper_bwd)
    warp_specialize: bool = False
    # Gluon kernels: as many programs as the GPU holds, taking the work items (query or key tiles of a head) from a
    # counter (flash_hopper, flash_hopper_bwd without warp specialisation); False: a program per item
    persistent: bool = False
    # persistent Gluon kernels: work items in groups of this many heads, tile by tile across a group's heads
    # (``flash_hopper._item_head``; 1: a head's tiles in a row); 0: chosen per call (``interleave_for``)
    interleave: int = 0

    def __post_init__(self):
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        if not isinstance(self.interleave, int) or self.interleave < 0:
            raise ValueError(f"interleave must be an int >= 0 (0: chosen per call), got {self.interleave!r}")
        if self.warp_specialize and (self.num_warps != 4 or 128 not in (self.block_m, self.block_n)):
            raise ValueError("warp_specialize needs num_warps=4 and 128-row tiles on the side that two consumer "
                             "warpgroups split (block_m=128 forward, block_n=128 backward), got "
                             f"block_m={self.block_m}, block_n={self.block_n}, num_warps={self.num_warps}")
        if self.warp_specialize and not self.tma:  # the warp-specialised kernels load by TMA only
            raise ValueError(f"warp_specialize needs tma=True, got tma={self.tma}")

    def short(self) -> str:
        return (f"{self.block_m}x{self.block_n}/w{self.num_warps}/s{self.num_stages}/{'tma' if self.tma else 'ptr'}"
                f"{'/ws' if self.warp_specialize else ''}{'/p' if self.persistent else ''}"
                f"{f'/i{self.interleave}' if self.interleave > 1 else ''}")


@dataclass(frozen=True)
class FlashConfig:
    fwd: KernelConfig
    bwd: KernelConfig  # fused dK/dV + atomic dQ: a program owns a key tile (block_n), walks query tiles
    dkdv: KernelConfig  # deterministic mode: the same kernel without the dQ atomics
    dq: KernelConfig  # deterministic mode: a program owns a query tile (block_m), walks key tiles
    # False: the default backward is the atomic-free pair (dkdv, dq) too. At head dim 128 its two recomputed
    # matmuls cost less than the fused kernel's fp32 dQ reduce-adds (scripts/device/flash_bwd_probe.py, H100:
    # 0.62 vs 0.73-0.77 ms at 1 x 16 x 4,096; 7.0 vs 8.1-8.4 ms with a 4,096 window at 32,768)
    atomic_dq: bool = True
    # Backwards of up to this many programs (``dkdv``'s tiles: max(key tiles, query tiles) x key/value heads) run
    # as one kernel: a program per key tile computes its dK, dV and one per query tile its dQ, with D from the O
    # and dO tiles. Seven matmuls per tile pair instead of five, but one launch instead of three: faster while the call
    # is small enough for launches to be its cost (scripts/device/flash_host.py --single, H100: 0.48-0.95x of the
    # three-kernel time up to 512 programs at head dim 64 and 128 at 128; 1.02-1.36x beyond)
    single_max_programs: int = 0
    # Eager calls outside CUDA graph capture also take the single kernel up to this many query-key pairs (batch x
    # heads x Nq x Nk; 0: none). Where the kernels take well under the host's time to issue a call, that host time is
    # what an eager caller waits for, and the single kernel saves two launches and two allocations (H200, session 48,
    # scripts/device/flash_eager_forms.py: do_bench forward+backward 159-296 against 218-353 us at 4 x 25 x 512 x 64 in
    # four runs, 270-323 against 322-497 at 8 x 12 x 512 x 64 in three, for 12 us more of kernel time); a captured or
    # compiled call keeps ``single_max_programs``'s kernel-time choice
    eager_single_max_pairs: int = 0
    # Tiles of the Gluon forward for sm_90 (``flash_hopper``: TMA ring, asynchronous warpgroup MMAs), taken
    # where its scope allows (16-bit, head dim 64 or 128, full or causal attention); None: the Triton forward
    hopper_fwd: KernelConfig | None = None
    # Tiles of the Gluon backward for sm_90 (``flash_hopper_bwd``: the atomic-dQ middle kernel; block_m query rows,
    # block_n key rows, num_stages Q/dO buffers, tma: dQ by TMA reduce-add), the default backward in the same scope
    # (not with ``deterministic=True``); None: the Triton kernels
    hopper_bwd: KernelConfig | None = None
    # The single backward kernel's tiles (None: ``dkdv``'s); ``single_max_programs`` counts ``dkdv``'s tiles
    single: KernelConfig | None = None
    # Small forwards: (most programs, tiles) in ascending order; a call of at most that many query tiles x heads
    # runs with the first such entry's tiles instead of ``hopper_fwd`` (the Gluon forward, one warpgroup, a program
    # per item) or, outside the Gluon scope, of ``fwd`` (the Triton forward, by block pointers unless ``tma``)
    small_fwd: tuple[tuple[int, KernelConfig], ...] = ()

    def small_forward(self, n_q: int, heads: int) -> KernelConfig | None:
        """The ``small_fwd`` tiles for a forward of ``heads`` (batch x heads) of ``n_q`` queries, or None."""
        for most, cfg in self.small_fwd:
            if -(-n_q // cfg.block_m) * heads <= most:
                return cfg
        return None


KERNELS = tuple(f.name for f in fields(FlashConfig) if f.type in (KernelConfig, "KernelConfig"))
_CPU = KernelConfig(16, 16, 1, 1)
CPU_CONFIG = FlashConfig(_CPU, _CPU, _CPU, _CPU, single_max_programs=8)  # small calls take the single kernel


def _table(d_pad: int, elem_bytes: int, tma: bool, hopper: bool = False) -> FlashConfig:
    """Code defaults by padded head dim and element size (H100 sweeps; notes in docs); ``hopper``: an sm_90
    GPU (warpgroup MMAs), where the Gluon forward runs."""
    K = KernelConfig
    if elem_bytes == 4:  # fp32: twice the shared memory per element, so smaller tiles
        if d_pad <= 64:
            return FlashConfig(K(64, 32, 4, 3), K(32, 64, 4, 2), K(32, 64, 4, 2), K(64, 32, 4, 2),
                               single_max_programs=128)
        if d_pad <= 128:
            return FlashConfig(K(64, 32, 4, 2), K(32, 32, 4, 2), K(32, 32, 4, 2), K(32, 32, 4, 2),
                               single_max_programs=128)
        return FlashConfig(K(32, 16, 4, 2), K(16, 32, 4, 1), K(16, 32, 4, 1), K(32, 16, 4, 1),
                           single_max_programs=128)
    # Small calls on sm_90 (H100, scripts/device/flash_floor_variants.py, kernel us at 1 x 1 x 128 x 64 / 1 x 1 x 256
    # x 64 / 4 x 25 x 256 x 64 / 1 x 1 x 128 x 128). The backward: the single kernel by block pointers on 64 x 64
    # tiles with two stages, 5.8 / 8.1 / 28.0 against 21.5 / 23.5 / 56.9 by tensor descriptors built on the device
    # (session 36). The forward (session 39, descriptors from the host): the Gluon kernel takes the small tiers'
    # tiles, one warpgroup and a program per item, 4.0 / 5.2 / 11.2 / 4.4 (64 x 64 at head dim 128) against the
    # Triton forward by pointers' 4.5 / 6.5 / 12.8 / 6.3 and, at head dim 128, the two-warpgroup tile's 6.5; outside
    # the Gluon scope (windows, documents) the Triton forward runs them by pointers, as the device-built descriptors
    # of its TMA form cost a short program more than they save
    small = dict(single=K(64, 64, 4, 2), small_fwd=((128, K(64, 128, 4, 2)), (512, K(64, 64, 4, 2)))) if hopper else {}
    if d_pad <= 64:
        return FlashConfig(K(128, 64, 8, 3, tma), K(64, 128, 8, 2, tma), K(64, 64, 4, 3, tma), K(128, 64, 8, 3, tma),
                           single_max_programs=512, eager_single_max_pairs=1 << 25 if hopper else 0,
                           hopper_fwd=K(64, 64, 4, 3, True, persistent=True) if hopper else None,
                           hopper_bwd=K(64, 64, 4, 2, True, persistent=True) if hopper else None, **small)
    if d_pad <= 128:
        # head dim 128 (1 x 1 x 128 x 128): single backward 11.3 us by pointers against 31.6 (session 36)
        small = dict(small, small_fwd=((128, K(64, 64, 4, 2)),)) if hopper else {}
        return FlashConfig(K(64, 64, 4, 3, tma), K(64, 128, 8, 2, tma), K(64, 128, 8, 3, tma), K(128, 64, 8, 3, tma),
                           atomic_dq=False, single_max_programs=128, **small,
                           # two consumer warpgroups, persistent (H100, session 20: 0.91-1.00x cuDNN's forward at
                           # every head-dim-128 model shape; a program per item 1.02-1.15x)
                           hopper_fwd=K(128, 128, 4, 2, True, True, True) if hopper else None,
                           # two consumer warpgroups on 128-key tiles (H100, session 19: 0.71-0.77x the time of
                           # one warpgroup's 64 x 32 tiles at every timed shape)
                           hopper_bwd=K(64, 128, 4, 2, True, warp_specialize=True) if hopper else None)
    return FlashConfig(K(64, 64, 4, 2), K(32, 64, 8, 1), K(32, 64, 8, 1), K(64, 32, 8, 1), single_max_programs=128)


# Share of the L2 cache that the heads of one group of persistent work items fill: K and V forward, Q, dO and the dQ
# accumulator backward (H100, session 27, scripts/device/layout_variant_ab.py; forward / backward kernel ms, causal,
# a head's items in a row -> grouped): xl_2048 0.157 -> 0.152 (25 heads) / 0.444 -> 0.431 (25), with the model's
# heads-last inputs 0.162 -> 0.152 / 0.475 -> 0.458; small_512 0.0259 -> 0.0241 (96) / 0.0635 -> 0.0595 (96);
# d128_4k forward 0.140 -> 0.118 (4 of 16 heads); lb2025 forward 1.20 either way. Groups past the share lose
# (xl_2048 backward: 0.472 with 50 heads, 0.649 with all 100), and so did groups that leave a smaller last one
# (d128_4k forward 0.131 with 6 heads, lb2025 1.245 with 3): the group is a divisor of the heads.
L2_SHARE = {"fwd": 0.25, "bwd": 0.5}


def interleave_for(cfg: KernelConfig, kernel: str, causal: bool, heads: int, head_bytes: int, l2_bytes: int) -> int:
    """How many heads a group of a persistent Gluon kernel's work items spans (``flash_hopper._item_head``): the
    config's ``interleave`` if set; else, causal, the largest divisor of ``heads`` that fits ``L2_SHARE[kernel]`` of
    the L2 cache at ``head_bytes`` a head, 10% over allowed (a group's items run longest first across its heads, so
    the programs end together, and read what the cache holds); without a mask, 1 (items of equal length gain nothing
    from the order: 8 x 16 x 2,048 x 128's forward ran 2% slower with 16-head groups, 18% with 64)."""
    if cfg.interleave:
        return min(cfg.interleave, heads)
    if not causal:
        return 1
    cap = 1.1 * l2_bytes * L2_SHARE[kernel] / max(head_bytes, 1)
    return max(g for g in range(1, heads + 1) if heads % g == 0 and (g <= cap or g == 1))


def seq_bucket(n: int) -> int:
    """Next power of two (>= 64): configs are chosen per bucket, not per exact length."""
    return max(64, 1 << (max(1, n) - 1).bit_length())


def pinned_key(kernel: str, d_pad: int, dtype: torch.dtype, n_q: int | None = None) -> str:
    """``fwd|d64|bfloat16`` (head dim and dtype) or ``fwd|d64|bfloat16|q16384`` (and query-length bucket)."""
    key = f"{kernel}|d{d_pad}|{str(dtype).removeprefix('torch.')}"
    return key if n_q is None else f"{key}|q{seq_bucket(n_q)}"


PINNED_JSON = Path(__file__).with_name("flash_tune_h100.json")


def load_pinned(path: Path | None = None) -> dict:
    """The tuner's file (``{"capability": [9, 0], "configs": {key: KernelConfig fields}}``), or {} if absent;
    ``ValueError`` if it exists but cannot be read as one."""
    path = path or PINNED_JSON
    try:
        data = json.loads(path.read_text())
        data["configs"] = {k: KernelConfig(**v) for k, v in data.get("configs", {}).items()}
        return data
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{path} is not a valid tuning file: {err}") from err


@functools.cache
def _pinned_data() -> dict:
    return load_pinned()


def resolve(d_pad: int, dtype: torch.dtype, n_q: int, capability: tuple[int, int] | None, pinned: dict) -> FlashConfig:
    """The table lookup without caching (``capability`` None: no GPU-specific entries)."""
    elem_bytes = torch.finfo(dtype).bits // 8
    table = _table(d_pad, elem_bytes, tma=capability is not None and capability[0] >= 9,
                   hopper=capability is not None and tuple(capability) == (9, 0))
    if table.hopper_fwd is not None and d_pad == 64 and n_q >= 8192:
        # long sequences at head dim 64: the persistent warp-specialised forward on 128 x 128 tiles with three stages
        # (H100, session 20: 1.224 ms at 1 x 16 x 16,384 against 1.260 for one warpgroup's persistent 64 x 128 tiles;
        # it loses at 2,048 tokens, 0.173 against 0.165-0.169 ms at 4 x 25 x 2,048) and the warp-specialised backward
        # on 64 query rows, 128 keys and three stages (session 37: 3.05 ms at 1 x 16 x 16,384 against 3.20 on 128 x 128
        # tiles, which spill, and 3.52 for one warpgroup's persistent 64 x 64 tiles; a program per item, it loses to
        # the persistent one at 4 x 25 x 2,048: 0.50 vs 0.43 ms)
        table = dataclasses.replace(table, hopper_fwd=KernelConfig(128, 128, 4, 3, True, True, True),
                                    hopper_bwd=KernelConfig(64, 128, 4, 3, True, warp_specialize=True))
    configs = pinned.get("configs")
    if not configs or capability is None or tuple(pinned.get("capability", ())) != tuple(capability):
        return table
    picked = {}
    for kernel in KERNELS:
        picked[kernel] = (configs.get(pinned_key(kernel, d_pad, dtype, n_q))
                          or configs.get(pinned_key(kernel, d_pad, dtype)) or getattr(table, kernel))
    hopper = table.hopper_fwd and (configs.get(pinned_key("hopper_fwd", d_pad, dtype, n_q))
                                   or configs.get(pinned_key("hopper_fwd", d_pad, dtype)) or table.hopper_fwd)
    if hopper and hopper.warp_specialize and hopper.block_m != 128:
        raise ValueError(f"a pinned warp-specialised hopper_fwd needs block_m=128 (two consumer warpgroups of 64 query "
                         f"rows), got {hopper.short()} for d{d_pad} {dtype}")
    return dataclasses.replace(table, **picked, hopper_fwd=hopper)


@functools.cache
def _config_for(device: torch.device, bucket: int, d_pad: int, dtype: torch.dtype) -> FlashConfig:
    if device.type != "cuda":
        return CPU_CONFIG
    return resolve(d_pad, dtype, bucket, torch.cuda.get_device_capability(device), _pinned_data())


def config_for(device: torch.device, n_q: int, d_pad: int, dtype: torch.dtype) -> FlashConfig:
    """The configs of every kernel for this call (cached; see the module docstring)."""
    return _config_for(device, seq_bucket(n_q), d_pad, dtype)


def clear_cache() -> None:
    """Forget cached lookups (after the tuner rewrote ``flash_tune_h100.json`` in this process)."""
    _pinned_data.cache_clear()
    _config_for.cache_clear()
