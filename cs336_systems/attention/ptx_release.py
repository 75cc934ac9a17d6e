"""Ring-stage releases without warpgroup barriers in Gluon kernels, by rewriting their PTX.

Gluon (Triton 3.6) lowers ``mbarrier.arrive`` as one thread's arrive behind a ``bar.sync`` of its warpgroup, so that
every warp's earlier work is done first. A consumer that releases a ring stage right after ``warpgroup_mma_wait``
does not need it: a warpgroup MMA is one operation of all four warps (it writes every warp's accumulator), so once
the arriving thread's wait returns, the MMAs that read the stage are done for the whole warpgroup, and every warp
has passed its wait on the stage's full barrier (it issued its share of those MMAs). CUTLASS's Hopper pipelines
release the same way, one thread and no barrier (``PipelineTmaAsync::consumer_release``). Under Nsight Compute the
warp-specialised attention forward spent 32% of its warps' cycles at such barriers (docs/flash_tuning_notes.md,
session 39), the fused feed-forward's forward 35% of its stalls (docs/training_step.md, session 32).

A kernel opts in through ``register`` and marks each such arrive with ``count=MARK`` (``release``): the PTX stage of its
compilation (a compiler stage hook) turns the marked arrive back into a count of one and deletes the ``bar.sync``
just before it (register arithmetic may sit between the two). A marked arrive without that ``bar.sync`` is an error
at compile time, never a silently wrong count. (The same for a one-warpgroup CTA's own refills, marked expects, did
not pay: ``experiments/lean_refill/``.) The kernel takes ``VERSION`` as a constexpr where it marks anything, so that
Triton's compile cache never hands it code from another version of the rewrite; ``check`` refuses code that still
holds a mark.

In a kernel that carries a mark the rewrite then drops every warpgroup barrier that orders nothing
(``drop_quiet_barriers``, a dataflow over the PTX's basic blocks): one with only mbarrier operations, MMAs and TMA loads
since the previous barrier on every path into it. Triton's shared-memory analysis puts one before each mbarrier wait
that follows an arrive; in the attention forward's key loop that was the last barrier per tile (session 40).
"""

from __future__ import annotations

import re

from triton import knobs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

MARK = 5  # an arrive count no kernel uses otherwise: marks the arrives whose warpgroup barrier goes
# What a kernel that opts in takes as a constexpr: Triton's compile cache keys on the kernel's source and constexprs,
# not on this rewrite, so a change to what ``patch`` does needs a new number
VERSION = 3

_MARK = gl.constexpr(MARK)

_KERNELS: set[str] = set()
_previous = None
_installed = False

_MARKED = re.compile(r"^(\s*(?:@%p\d+\s+)?mbarrier\.arrive\.shared::cta\.b64\s+_,\s*\[%r\d+\]),\s*"
                     + str(MARK) + r";\s*$")
_MARKER = f"], {MARK};"  # a marked arrive as it appears in PTX
_BAR = re.compile(r"^\s*bar\.sync\s+\d+,\s*128;\s*$")
_SKIP = re.compile(r"^\s*(//.*|\.loc\b.*)?$")  # comments (the inline asm brackets), debug lines, blank lines
# register arithmetic (addresses, predicates) that may sit between a barrier and what it guards: no memory, no branch
_ARITH = re.compile(r"^\s*(add|sub|mul|mad|shl|shr|and|or|xor|mov|cvt|selp|setp)(\.[\w:]+)*\s+%[^\[\]]*;\s*$")


# Instructions that touch memory (an address operand) and need no bar.sync after them for other threads' sake: the
# mbarrier waits and arrivals (atomic; init and inval are not here), warpgroup MMAs and TMA loads (asynchronous
# proxy, ordered by mbarriers and MMA waits), parameter loads. Every other addressed instruction counts as an access,
# and so do fences and the bulk copies' commits and waits (a thread's wait for a TMA store that others then overwrite).
_QUIET = re.compile(r"^\s*(mbarrier\.(try_wait|test_wait|arrive)|wgmma\.|ld\.param|"
                    r"cp\.async\.bulk\.tensor\.\w+\.shared::cluster\.global\.mbarrier)")
_LABEL = re.compile(r"^(\$[\w.]+):")
_BRANCH = re.compile(r"^\s*(@!?%p\d+\s+)?bra(\.uni)?\s+(\$[\w.]+);")
_BRX = re.compile(r"^\s*(@!?%p\d+\s+)?brx\.idx\s+%r\d+,\s*(\$[\w.]+);")
_SYNC = re.compile(r"^\s*(bar|barrier)\.sync\s+\d+(,\s*\d+)?;\s*$")
_PRED = re.compile(r"^@!?%p\d+\s+")
_JUMP = re.compile(r"^(@!?%p\d+\s+)?(call|brx|bra)\b")


def _blocks(body: list[str]):
    """The basic blocks of a PTX function body as (first line, last line, successor blocks); an inline-asm group in
    braces is one instruction. None if its control flow is not understood (a call, a jump this does not parse, a
    target it cannot find)."""
    blocks, start, depth, tables, table = [], 0, 0, {}, None
    for i, line in enumerate(body):
        text = line.split("//")[0].strip()
        if table is not None:  # a brx.idx target list: $L_brx_0: .branchtargets $L1, $L2, ...;
            tables[table] += [t.strip() for t in text.rstrip(";").split(",") if t.strip()]
            table = None if text.endswith(";") else table
            continue
        depth += (text == "{") - (text == "}")
        if depth:
            continue
        label = _LABEL.match(text)
        if label and ".branchtargets" in text:
            tables[label.group(1)], table = [], label.group(1)
            continue
        if label and i > start:
            blocks.append([start, i - 1, [None]])  # falls through to the label
            start = i
        branch, indexed = _BRANCH.match(text), _BRX.match(text)
        if branch or indexed:
            jump = branch or indexed
            target = branch.group(3) if branch else indexed.group(2)
            blocks.append([start, i, [target] + ([None] if jump.group(1) else [])])  # predicated: falls through too
            start = i + 1
        elif text in ("ret;", "exit;", "trap;"):
            blocks.append([start, i, []])
            start = i + 1
        elif _JUMP.match(text):
            return None
    if start < len(body):
        blocks.append([start, len(body) - 1, [None]])
    labels = {m.group(1): n for n, (first, _last, _succ) in enumerate(blocks)
              if (m := _LABEL.match(body[first].strip()))}
    graph = []
    for n, (first, last, succ) in enumerate(blocks):
        out = []
        for t in succ:
            targets = [n + 1] if t is None else [labels.get(x) for x in tables[t]] if t in tables else [labels.get(t)]
            if None in targets:
                return None
            out += [x for x in targets if x < len(blocks)]
        graph.append((first, last, out))
    return graph


def drop_quiet_barriers(ptx: str, bar) -> str:
    """``ptx`` without the barriers ``bar`` (a predicate on a line) that order nothing: on every path into one, no
    instruction since the last ``bar.sync`` has touched memory but mbarrier arrivals and waits, warpgroup MMAs and
    TMA loads (``_QUIET``). Triton's shared-memory analysis puts such a barrier before an mbarrier wait that follows
    an arrive (it treats both as accesses of one buffer), one per key tile in the attention forward's loop. The
    PTX unchanged where its control flow is not understood (``_blocks``)."""
    lines = ptx.split("\n")
    entry = next((i for i, line in enumerate(lines) if line.startswith(".visible .entry")), None)
    open_ = next((i for i in range(entry, len(lines)) if lines[i].strip() == "{"), None) if entry is not None else None
    if open_ is None:
        return ptx
    depth, close = 0, None
    for i in range(open_, len(lines)):  # the body's closing brace (inline asm opens and closes its own)
        depth += (lines[i].strip() == "{") - (lines[i].strip() == "}")
        if depth == 0:
            close = i
            break
    if close is None:
        return ptx
    body = lines[open_ + 1:close]
    graph = _blocks(body)
    if graph is None:
        return ptx

    def walk(first, last, quiet, drop=None):
        """Whether the block ends quiet, given how it starts; with ``drop``, collect its barriers that order nothing."""
        for i in range(first, last + 1):
            text = body[i].split("//")[0].strip()
            op = _PRED.sub("", text)  # a predicated barrier does not count as one, a predicated access does
            if _SYNC.match(text):
                if quiet and bar(body[i]) and drop is not None:
                    drop.add(i)
                quiet = True
            elif ("[" in op or op.startswith(("cp.", "fence.", "membar"))) and not _QUIET.match(op):
                quiet = False
        return quiet

    # a must-dataflow forward: a block starts quiet when every predecessor ends quiet (the entry, which nothing
    # precedes, does); iterated from all quiet down to the greatest fixed point
    preds = [[] for _ in graph]
    for n, (_first, _last, out) in enumerate(graph):
        for m in out:
            preds[m].append(n)
    quiet_in, quiet_out = [True] * len(graph), [True] * len(graph)
    changed = True
    while changed:
        changed = False
        for n, (first, last, _out) in enumerate(graph):
            q = all(quiet_out[p] for p in preds[n])
            out = walk(first, last, q)
            if (q, out) != (quiet_in[n], quiet_out[n]):
                quiet_in[n], quiet_out[n], changed = q, out, True
    drop: set[int] = set()
    for n, (first, last, _out) in enumerate(graph):
        walk(first, last, quiet_in[n], drop)
    return "\n".join(lines[:open_ + 1] + [line for i, line in enumerate(body) if i not in drop] + lines[close:])


def patch(ptx: str) -> str:
    """``ptx`` with every marked arrive restored to a count of one and the warpgroup ``bar.sync`` before it
    removed; then, if anything was marked, without the barriers that order nothing (``drop_quiet_barriers``).
    Unchanged if nothing is marked. Raises ``ValueError`` if a marked arrive has no such barrier."""
    lines = ptx.split("\n")

    def bar(line: str) -> bool:
        return bool(_BAR.match(line))

    drop: set[int] = set()
    for i, line in enumerate(lines):
        m = _MARKED.match(line)
        if not m:
            continue
        j = i - 1
        while j >= 0 and (_SKIP.match(lines[j]) or _ARITH.match(lines[j])):
            j -= 1
        if j < 0 or not bar(lines[j]):
            raise ValueError(f"ptx_release: no warpgroup bar.sync right before the marked arrive {line.strip()!r}")
        drop.add(j)
        lines[i] = m.group(1) + ";"
    out = "\n".join(line for i, line in enumerate(lines) if i not in drop)
    return drop_quiet_barriers(out, bar) if drop else out


def marked(ptx: str) -> bool:
    """Whether ``ptx`` holds a marked arrive, which only this rewrite may let reach ptxas."""
    return _MARKER in ptx


def check(compiled) -> None:
    """Raise ``RuntimeError`` if ``compiled`` (a Triton compiled kernel) still holds a mark: code compiled without
    the rewrite (elsewhere than through this process's hook), whose barriers would count wrong and hang."""
    if marked((getattr(compiled, "asm", None) or {}).get("ptx", "")):
        name = getattr(compiled, "name", "a kernel")
        raise RuntimeError(f"{name}: compiled without ptx_release's rewrite (its marked arrives are left); clear "
                           "Triton's cache (TRITON_CACHE_DIR) or set flash_hopper.LEAN_RELEASE to False")


def _hook(backend, stages, options, language, capability):
    """Triton's stage hook: the registered kernels' PTX stage goes through ``patch``; backends without a PTX stage
    (AMD's) and every other kernel are left as they are."""
    make_ptx = stages.get("ptx")
    if make_ptx is not None:
        def ptx_stage(src, metadata):
            ptx = make_ptx(src, metadata)
            return patch(ptx) if metadata.get("name") in _KERNELS else ptx

        stages["ptx"] = ptx_stage
    if _previous is not None:
        _previous(backend, stages, options, language, capability)


@gluon.jit
def release(bar, LEAN: gl.constexpr):
    """A consumer warpgroup's arrival on ``bar`` once its MMAs that read what the barrier guards have completed;
    LEAN: marked, so that the rewrite drops the warpgroup barrier Gluon puts before the arrive (and the kernel's
    barriers that order nothing, ``drop_quiet_barriers``)."""
    if LEAN:
        mbarrier.arrive(bar, count=_MARK)
    else:
        mbarrier.arrive(bar)


def lean(on: bool) -> int:
    """The ``LEAN`` constexpr of a kernel that marks its releases: ``VERSION`` where ``on`` and this module's hook is
    in place (``active``), else 0 (the kernel's barriered form)."""
    return VERSION if on and active() else 0


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
