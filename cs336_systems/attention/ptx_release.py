"""Ring-stage releases without a warpgroup barrier in Gluon kernels, by rewriting their PTX.

Gluon (Triton 3.6) lowers ``mbarrier.arrive`` as one thread's arrive behind a ``bar.sync`` of its warpgroup, so that
every warp's earlier work is done first. A consumer that releases a ring stage right after ``warpgroup_mma_wait``
does not need it: a warpgroup MMA is one operation of all four warps (it writes every warp's accumulator), so once
the arriving thread's wait returns, the MMAs that read the stage are done for the whole warpgroup, and every warp
has passed its wait on the stage's full barrier (it issued its share of those MMAs). CUTLASS's Hopper pipelines
release the same way, one thread and no barrier (``PipelineTmaAsync::consumer_release``). Under Nsight Compute the
warp-specialised attention forward spent 32% of its warps' cycles at such barriers (docs/flash_tuning_notes.md,
session 39), the fused feed-forward's forward 35% of its stalls (docs/training_step.md, session 32).

A kernel opts in through ``register`` and marks each such arrive with ``count=MARK``: the PTX stage of its
compilation (a compiler stage hook) turns the marked arrive back into a count of one and deletes the ``bar.sync``
just before it (register arithmetic may sit between the two). A marked arrive without that ``bar.sync`` is an error
at compile time, never a silently wrong count. The kernel takes ``VERSION`` as a constexpr where it marks its arrives,
so that Triton's compile cache never hands it code from another version of the rewrite.
"""

from __future__ import annotations

import re

from triton import knobs

MARK = 5  # an arrive count no kernel uses otherwise: marks the arrives whose warpgroup barrier goes
# What a kernel that opts in takes as a constexpr: Triton's compile cache keys on the kernel's source and constexprs,
# not on this rewrite, so a change to what ``patch`` does needs a new number
VERSION = 1

_KERNELS: set[str] = set()
_previous = None
_installed = False

_MARKED = re.compile(r"^(\s*(?:@%p\d+\s+)?mbarrier\.arrive\.shared::cta\.b64\s+_,\s*\[%r\d+\]),\s*"
                     + str(MARK) + r";\s*$")
_MARKER = f"], {MARK};"  # a marked arrive as it appears in PTX
_BAR = re.compile(r"^\s*bar\.sync\s+\d+,\s*128;\s*$")
_SKIP = re.compile(r"^\s*(//.*|\.loc\b.*)?$")  # comments (the inline asm brackets), debug lines, blank lines
# register arithmetic (the arrive's address) that ptxas may find between the two: no memory, no control flow
_ARITH = re.compile(r"^\s*(add|sub|mul|mad|shl|shr|and|or|xor|mov|cvt|selp|setp)(\.[\w:]+)*\s+%[^\[\]]*;\s*$")


def patch(ptx: str) -> str:
    """``ptx`` with every marked arrive restored to a count of one and the warpgroup ``bar.sync`` before it
    removed; unchanged if nothing is marked. Raises ``ValueError`` if a marked arrive has no such barrier."""
    lines = ptx.split("\n")
    drop: set[int] = set()
    for i, line in enumerate(lines):
        m = _MARKED.match(line)
        if not m:
            continue
        j = i - 1
        while j >= 0 and (_SKIP.match(lines[j]) or _ARITH.match(lines[j])):
            j -= 1
        if j < 0 or not _BAR.match(lines[j]):
            raise ValueError(f"ptx_release: no warpgroup bar.sync right before the marked arrive {line.strip()!r}")
        drop.add(j)
        lines[i] = m.group(1) + ";"
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def check(compiled) -> None:
    """Raise ``RuntimeError`` if ``compiled`` (a Triton compiled kernel) still holds a marked arrive: code compiled
    without the rewrite (elsewhere than through this process's hook), whose barriers would count wrong and hang."""
    if _MARKER in (getattr(compiled, "asm", None) or {}).get("ptx", ""):
        name = getattr(compiled, "name", "a kernel")
        raise RuntimeError(f"{name}: compiled without ptx_release's rewrite (its marked arrives are left); clear "
                           "Triton's cache (TRITON_CACHE_DIR) or set flash_hopper.LEAN_RELEASE = False")


def _hook(backend, stages, options, language, capability):
    make_ptx = stages["ptx"]

    def ptx_stage(src, metadata):
        ptx = make_ptx(src, metadata)
        return patch(ptx) if metadata.get("name") in _KERNELS else ptx

    stages["ptx"] = ptx_stage
    if _previous is not None:
        _previous(backend, stages, options, language, capability)


def active() -> bool:
    """Whether compilations still go through this module's hook (something installed after it may have replaced
    the hook; a marked kernel compiled without the rewrite would arrive with the marker's count)."""
    return _installed and knobs.runtime.add_stages_inspection_hook is _hook


def register(kernel) -> None:
    """Have ``kernel`` (a Gluon JIT function) compiled with this rewrite (a no-op where it marks no arrive)."""
    global _installed, _previous
    _KERNELS.add(kernel.fn.__name__)
    if not _installed:
        _previous = knobs.runtime.add_stages_inspection_hook
        knobs.runtime.add_stages_inspection_hook = _hook
        _installed = True
