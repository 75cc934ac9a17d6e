"""Two-CTA clusters with TMA multicast for Gluon kernels on Hopper, by rewriting their PTX.

Gluon in Triton 3.6 issues every TMA load into its own CTA's shared memory: it has no multicast, and its CGA
layouts only make each CTA of a cluster load a broadcast operand itself. A GEMM tile whose operand is shared by two
neighbouring tiles then reads it from L2 twice; at 128 x 128 (x 2) tiles that L2 traffic, not the tensor cores, sets
the speed on an H100 (about 7 TB/s of operand traffic: docs/training_step.md, session 32). cuBLAS's Hopper kernels
pair CTAs in clusters and multicast the shared operand (the ``1x2`` in ``nvjet_sm90_tst_192x192_64x3_1x2``).

A kernel opts in by being written per CTA of a pair (rank = program id % 2, the pair = program id // 2) and marking
two things in its source, which the PTX stage of its compilation then rewrites (a compiler stage hook, installed
by ``register``):

- the TMA loads through the descriptor that is the kernel's first argument become
  ``.multicast::cluster`` loads to both CTAs (each CTA issues half of the shared tile, predicated on its rank);
- ``mbarrier.arrive(bar, count=REMOTE_ARRIVE)`` becomes an arrive on the *other* CTA's barrier at the same offset
  (``mapa`` + ``mbarrier.arrive.shared::cluster``, default semantics as in CUTLASS's ``ClusterBarrier::arrive``),
  so a ring stage goes back to a producer only when the consumers of both CTAs have released it;
- the kernel gets ``.reqnctapercluster 2, 1, 1`` (a plain launch then forms the pairs from consecutive CTAs).

The kernel itself must call ``cluster_sync`` after initialising its barriers and ``cluster_wait`` at the start of each
worker partition (the rewrite has the worker warps arrive at that cluster barrier where they branch off at the
kernel's entry), and keep its remote
arrives to stages that the other CTA's producer will claim again (so that no CTA signals a CTA that has exited).
PTX without the marker (the kernel compiled without pairs) passes through unchanged, so one kernel source serves
both forms.
"""

from __future__ import annotations

import re

from triton import knobs
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

REMOTE_ARRIVE = 7  # an arrive count no kernel uses otherwise: marks the arrives to move to the other CTA

_REGISTRY: dict[str, int] = {}  # kernel name -> the PTX parameter of the descriptor to multicast
_installed = False


@gluon.jit
def cluster_sync(x):
    """The default partition's side of a cluster barrier, after this CTA's mbarrier inits (made visible to the
    cluster), before warp specialisation: the other warps arrive where they branch off (``patch``) and each worker
    partition that multicasts or arrives remotely waits at its start (``cluster_wait``), so nothing reaches a CTA's
    barriers before it has initialised them. ``x``: any scalar (inline asm needs an operand); returns it."""
    # Triton's cache key covers this source, not ``patch``: change this line when ``patch`` changes (rewrite 4).
    return gl.inline_asm_elementwise(
        "fence.mbarrier_init.release.cluster;\nbarrier.cluster.arrive.release.aligned;\n"
        "barrier.cluster.wait.acquire.aligned;\nmov.u32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def cluster_wait(x):
    """A worker partition's wait at the cluster barrier of ``cluster_sync`` (its warps arrived at the kernel's
    entry); once per partition, never in the default one. ``x`` as ``cluster_sync``'s."""
    return gl.inline_asm_elementwise("barrier.cluster.wait.acquire.aligned;\nmov.u32 $0, $1;", "=r,r", [x],
                                     dtype=gl.int32, is_pure=False, pack=1)


def _param_registers(lines: list[str], param: str) -> set[str]:
    """The 64-bit registers holding the address of kernel parameter ``param`` (``mov`` then ``cvta.param``)."""
    regs: set[str] = set()
    mov = re.compile(r"^\s*(?:mov|cvta\.param)\.(?:b64|u64)\s+(%rd\d+),\s*(\S+);")
    changed = True
    while changed:
        changed = False
        for line in lines:
            m = mov.match(line)
            if m and (m.group(2) == param or m.group(2) in regs) and m.group(1) not in regs:
                regs.add(m.group(1))
                changed = True
    return regs


def patch(ptx: str, name: str, param_index: int) -> str:
    """``ptx`` of kernel ``name`` rewritten for a two-CTA cluster (see the module docstring); unchanged if it has no
    remote-arrive marker. Raises ``ValueError`` if the marker is there but no multicast load or cluster
    directive could be placed (a Triton whose PTX this does not recognise)."""
    marker = re.compile(r"^(\s*)(@%p\d+\s+)?mbarrier\.arrive\.shared::cta\.b64\s+_,\s*\[(%r\d+)\],\s*"
                        + str(REMOTE_ARRIVE) + r";\s*$")
    lines = ptx.split("\n")
    if not any(marker.match(line) for line in lines):
        return ptx
    regs = _param_registers(lines, f"{name}_param_{param_index}")
    load = re.compile(r"^(\s*(?:@%p\d+\s+)?cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global"
                      r"\.mbarrier::complete_tx::bytes)(\s+\[%r\d+\],\s*\[(%rd\d+),\s*\{[^}]*\}\],\s*\[%r\d+\]);\s*$")
    split = re.compile(r"^\s*@(%p\d+)\s+bra\s+\S+;\s*$")
    out, loads, entry, body, workers = [], 0, False, False, 0
    for i, line in enumerate(lines):
        m = marker.match(line)
        ld = load.match(line)
        sp = split.match(line) if body and not workers else None
        if sp and re.match(r"^\s*setp\.lt\.u32\s+" + re.escape(sp.group(1)) + r",\s*%r\d+,\s*4;", lines[i - 1]) \
                and re.match(r"^\s*bra\.uni\s+\S+;\s*$", lines[i + 1]):
            # the warps past the default partition's four branch off here to wait for their partitions: they arrive
            # at the cluster barrier that the default partition enters after initialising the barriers
            # (cluster_sync). Not a wait: the default partition's setmaxnreg.inc waits for these warps' registers.
            out += [line, "\tbarrier.cluster.arrive.relaxed.aligned;"]
            workers += 1
        elif m:
            indent, pred, addr = m.group(1), m.group(2) or "", m.group(3)
            out.append(f"{indent}mapa.shared::cluster.u32 %mcaddr, {addr}, %mcpeer;")
            out.append(f"{indent}{pred}mbarrier.arrive.shared::cluster.b64 _, [%mcaddr];")
        elif ld and ld.group(3) in regs:
            out.append(f"{ld.group(1)}.multicast::cluster{ld.group(2)}, %mcmask;")
            loads += 1
        elif line.startswith(".visible .entry " + name + "("):
            entry = True
            out.append(line)
        elif entry and not body and line.strip() == "{":
            body = True
            out += [".reqnctapercluster 2, 1, 1", line, "\t.reg .b16 %mcmask;",
                    "\t.reg .b32 %mcrank, %mcpeer, %mcaddr;", "\tmov.b16 %mcmask, 3;",
                    "\tmov.u32 %mcrank, %cluster_ctarank;", "\txor.b32 %mcpeer, %mcrank, 1;"]
        else:
            out.append(line)
    if not body or loads == 0 or workers != 1:
        raise ValueError(f"cluster_ptx: {name}'s PTX has remote arrives but {loads} multicast loads of parameter "
                         f"{param_index}, {'a' if body else 'no'} kernel body and {workers} worker-warp branches (one "
                         "expected): not a form this rewrite knows")
    return "\n".join(out)


def _hook(backend, stages, options, language, capability):
    """Wrap the PTX stage of every compilation: kernels in the registry get their PTX patched."""
    make_ptx = stages["ptx"]

    def ptx_stage(src, metadata):
        ptx = make_ptx(src, metadata)
        name = metadata.get("name")
        return patch(ptx, name, _REGISTRY[name]) if name in _REGISTRY else ptx

    stages["ptx"] = ptx_stage
    if _previous is not None:
        _previous(backend, stages, options, language, capability)


_previous = None


def register(kernel) -> None:
    """Have ``kernel`` (a Gluon JIT function) compiled with its cluster rewrite where its source asks for it,
    multicasting the loads through its first argument (a tensor descriptor: PTX parameter 0)."""
    global _installed, _previous
    _REGISTRY[kernel.fn.__name__] = 0
    if not _installed:
        _previous = knobs.runtime.add_stages_inspection_hook
        knobs.runtime.add_stages_inspection_hook = _hook
        _installed = True
