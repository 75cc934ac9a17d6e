"""Tile sizes, warps, pipeline stages and kernel form of the FlashAttention-2 Triton kernels.

Sources, in this order:
1. ``CS336_FLASH_TUNE=auto``: a bounded autotune. For a new key (sequence-length bucket, padded head
   dim, dtype, causal) each kernel times at most ``MAX_CANDIDATES`` configurations for a few
   milliseconds each, and the winner is cached in memory and in ``~/.cache/cs336_systems/flash_tune.json``
   (so a second process tunes nothing). Compiling the candidates takes most of the time: well under a
   minute for one key.
2. Otherwise (the default) the pinned choices: the committed JSON ``flash_tune_h100.json`` next to this
   module (written by ``scripts/device/flash_tune.py`` on an H100; used on GPUs of the same compute
   capability; a key for the query-length bucket first, then one for the head dim and dtype), then the
   code table below (H100 sweeps, see docs/flash_tuning_notes.md). No tuning happens at run time.
On the CPU (the Triton interpreter) tiles are 16 x 16 so the interpreter stays quick.

A ``KernelConfig`` also selects the kernel form: ``tma`` loads and stores through tensor descriptors
(Hopper's TMA unit) instead of block pointers; ``warp_spec`` (implies ``tma``) additionally runs the
key/query loop warp-specialised (Triton 3.6 does that on Hopper only with ``num_warps == 4`` and a single
loop, so that form masks every tile); it is right in the interpreter but wrong on an H100, so GPU launches
refuse it. Both fall back to the block-pointer kernels where descriptors
cannot describe the tensors (see ``flash_triton._tma_ready``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch


@dataclass(frozen=True)
class KernelConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False  # tensor-descriptor (TMA) loads and stores
    warp_spec: bool = False  # warp-specialised loop (implies tma)

    def __post_init__(self):
        if self.warp_spec and not self.tma:
            raise ValueError(f"{self}: warp_spec needs tma=True (the warp-specialised loop loads through descriptors)")

    def short(self) -> str:
        form = "ws" if self.warp_spec else "tma" if self.tma else "ptr"
        return f"{self.block_m}x{self.block_n}/w{self.num_warps}/s{self.num_stages}/{form}"


@dataclass(frozen=True)
class FlashConfig:
    fwd: KernelConfig
    dkdv: KernelConfig  # program owns a key tile (block_n) and walks query tiles (block_m)
    dq: KernelConfig  # program owns a query tile (block_m) and walks key tiles (block_n)


CPU_CONFIG = FlashConfig(KernelConfig(16, 16, 1, 1), KernelConfig(16, 16, 1, 1), KernelConfig(16, 16, 1, 1))


def _pinned(d_pad: int, elem_bytes: int) -> FlashConfig:
    """Pinned choices by padded head dim and element size (measured on an H100; notes in docs)."""
    if elem_bytes == 4:  # fp32: twice the shared memory per element, so half the key tile
        if d_pad <= 64:
            return FlashConfig(KernelConfig(64, 32, 4, 3), KernelConfig(32, 64, 4, 2), KernelConfig(64, 32, 4, 2))
        if d_pad <= 128:
            return FlashConfig(KernelConfig(64, 32, 4, 2), KernelConfig(32, 32, 4, 2), KernelConfig(32, 32, 4, 2))
        return FlashConfig(KernelConfig(32, 16, 4, 2), KernelConfig(16, 32, 4, 1), KernelConfig(32, 16, 4, 1))
    # H100 sweep 2026-11-22 (16 x 16,384 x 64 and 16 x 4,096 x 128, bf16, causal): see the notes.
    if d_pad <= 64:
        return FlashConfig(KernelConfig(128, 64, 8, 3), KernelConfig(128, 128, 8, 2), KernelConfig(64, 64, 4, 3))
    if d_pad <= 128:
        return FlashConfig(KernelConfig(64, 64, 4, 3), KernelConfig(64, 128, 8, 2), KernelConfig(128, 64, 8, 3))
    return FlashConfig(KernelConfig(64, 64, 4, 2), KernelConfig(32, 64, 8, 1), KernelConfig(64, 32, 8, 1))


def candidates(kernel: str, d_pad: int, elem_bytes: int) -> list[KernelConfig]:
    """The bounded search space of one kernel (the pinned config first)."""
    pinned = getattr(_pinned(d_pad, elem_bytes), kernel)
    if elem_bytes == 4 or d_pad > 128:
        pool: list[KernelConfig] = []
    elif kernel == "fwd":
        pool = [KernelConfig(128, 64, 8, 3), KernelConfig(64, 64, 4, 3), KernelConfig(64, 128, 4, 3),
                KernelConfig(128, 64, 4, 4)]
    elif kernel == "dkdv":
        pool = [KernelConfig(128, 128, 8, 2), KernelConfig(64, 128, 8, 2), KernelConfig(32, 64, 4, 4),
                KernelConfig(64, 64, 4, 3)]
    else:
        pool = [KernelConfig(64, 64, 4, 3), KernelConfig(128, 64, 8, 3), KernelConfig(64, 128, 4, 3),
                KernelConfig(64, 32, 4, 4)]
    pool += variant_candidates(kernel, d_pad, elem_bytes)
    out = [pinned] + [c for c in pool if c != pinned]
    return out[:MAX_CANDIDATES]


def variant_candidates(kernel: str, d_pad: int, elem_bytes: int) -> list[KernelConfig]:
    """The TMA form of the code-table config. The warp-specialised form is not a candidate: it compiles for
    sm_90a with Triton 3.6 but returns wrong results on an H100 (see ``flash_triton._use_tma``)."""
    if elem_bytes == 4 or d_pad > 128:
        return []
    return [replace(getattr(_pinned(d_pad, elem_bytes), kernel), tma=True)]


MAX_CANDIDATES = 6
_CACHE_PATH = Path(os.environ.get("CS336_FLASH_TUNE_CACHE", Path.home() / ".cache" / "cs336_systems" /
                                  "flash_tune.json"))
_memory_cache: dict[str, dict] | None = None


def seq_bucket(n: int) -> int:
    """Next power of two (>= 64): configs are chosen per bucket, not per exact length."""
    return max(64, 1 << (max(1, n) - 1).bit_length())


def tune_key(kernel: str, n_q: int, n_k: int, d_pad: int, dtype: torch.dtype, causal: bool) -> str:
    return f"{kernel}|q{seq_bucket(n_q)}|k{seq_bucket(n_k)}|d{d_pad}|{str(dtype).removeprefix('torch.')}|c{int(causal)}"


def _load_cache() -> dict[str, dict]:
    global _memory_cache
    if _memory_cache is None:
        try:
            _memory_cache = json.loads(_CACHE_PATH.read_text())
        except (OSError, ValueError):
            _memory_cache = {}
    return _memory_cache


def cached(key: str) -> KernelConfig | None:
    entry = _load_cache().get(key)
    return KernelConfig(**entry) if entry else None


def remember(key: str, cfg: KernelConfig) -> None:
    cache = _load_cache()
    cache[key] = asdict(cfg)
    try:
        _CACHE_PATH.parent.mkdir(parents=True, exist_ok=True)
        _CACHE_PATH.write_text(json.dumps(cache, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only home only loses the on-disk copy


def autotune_enabled() -> bool:
    mode = os.environ.get("CS336_FLASH_TUNE", "pinned")
    if mode not in ("pinned", "auto"):
        raise ValueError(f"CS336_FLASH_TUNE must be 'pinned' or 'auto', got {mode!r}")
    return mode == "auto"


PINNED_JSON = Path(__file__).with_name("flash_tune_h100.json")
_pinned_json: dict | None = None


def _load_pinned_json() -> dict:
    """The committed tuning results (``{"capability": [9, 0], "configs": {key: KernelConfig fields}}``), or {}."""
    global _pinned_json
    if _pinned_json is None:
        try:
            data = json.loads(PINNED_JSON.read_text())
            data["configs"] = {k: KernelConfig(**v) for k, v in data.get("configs", {}).items()}
            _pinned_json = data
        except (OSError, ValueError, TypeError) as err:
            if PINNED_JSON.exists():
                raise ValueError(f"{PINNED_JSON} is not a valid tuning file: {err}") from err
            _pinned_json = {}
    return _pinned_json


def pinned_key(kernel: str, d_pad: int, dtype: torch.dtype, n_q: int | None = None) -> str:
    """``fwd|d64|bfloat16`` (head dim and dtype) or ``fwd|d64|bfloat16|q16384`` (and query-length bucket)."""
    key = f"{kernel}|d{d_pad}|{str(dtype).removeprefix('torch.')}"
    return key if n_q is None else f"{key}|q{seq_bucket(n_q)}"


def pinned_config(device: torch.device, d_pad: int, dtype: torch.dtype, n_q: int | None = None) -> FlashConfig:
    """The JSON's choice (query-length bucket, then head dim and dtype) on a GPU of the capability it was
    tuned on, else the code table; ``CPU_CONFIG`` off CUDA."""
    if device.type != "cuda":
        return CPU_CONFIG
    table = _pinned(d_pad, torch.finfo(dtype).bits // 8)
    data = _load_pinned_json()
    configs = data.get("configs")
    if not configs or tuple(data.get("capability", ())) != torch.cuda.get_device_capability(device):
        return table
    picked = {}
    for kernel in ("fwd", "dkdv", "dq"):
        cfg = configs.get(pinned_key(kernel, d_pad, dtype, n_q)) if n_q is not None else None
        picked[kernel] = cfg or configs.get(pinned_key(kernel, d_pad, dtype)) or getattr(table, kernel)
    return FlashConfig(**picked)
