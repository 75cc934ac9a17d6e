"""A Gluon kernel compiled for sm_90a on any host (Triton's bundled ptxas, no GPU), printing ptxas's resource report
(registers, spills) and the PTX's count of warpgroup barriers: ``python -m tests.sm90_ptxas swiglu_backward``.
Run without ``TRITON_INTERPRET``, which makes the kernels' decorators build interpreter functions instead."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type


def _compile(kernel, descs: list, consts: dict) -> str:
    """``kernel``'s PTX for sm_90a with these descriptors (its leading arguments), M, N, K and constexprs."""
    names = list(kernel.arg_names)
    sig = {names[i]: mangle_type(d) for i, d in enumerate(descs)} | dict.fromkeys(("M", "N", "K"), "i32")
    sig |= dict.fromkeys(consts, "constexpr")
    src = GluonASTSource(kernel, sig, {(names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]


def swiglu_backward_ptx() -> str:
    """The fused feed-forward's backward kernel at the package's configuration, as PTX for sm_90a."""
    from cs336_systems.fused import swiglu_gemm

    bf16, (block_m, block_n, block_k, stages, group_m) = torch.bfloat16, swiglu_gemm.BWD_CONFIG
    dy, w2 = torch.empty(256, 128, dtype=bf16), torch.empty(128, 256, dtype=bf16)
    out = torch.empty(256, 256, dtype=bf16)
    descs = [swiglu_gemm._desc(dy, [block_m // 2, block_k]), swiglu_gemm._desc(w2, [block_k, block_n])]
    descs += [swiglu_gemm._desc(out, [block_m // 2, block_n])] * 4
    return _compile(swiglu_gemm._swiglu_bwd_kernel, descs, {"GROUP_M": group_m, "STAGES": stages,
                                                            "REGS": swiglu_gemm.CONSUMER_REGS})


def swiglu_forward_ptx() -> str:
    """The fused feed-forward's forward (dual GEMM) kernel at the package's configuration, as PTX for sm_90a."""
    from cs336_systems.fused import swiglu_gemm

    bf16, (block_m, block_n, block_k, stages, group_m) = torch.bfloat16, swiglu_gemm.FWD_CONFIG
    x, w = torch.empty(256, 128, dtype=bf16), torch.empty(256, 128, dtype=bf16)
    out = torch.empty(256, 256, dtype=bf16)
    descs = [swiglu_gemm._desc(x, [block_m // 2, block_k])] + [swiglu_gemm._desc(w, [block_n, block_k])] * 2
    descs += [swiglu_gemm._desc(out, [block_m // 2, block_n])] * 3
    return _compile(swiglu_gemm._dual_swiglu_kernel, descs, {"GROUP_M": group_m, "STAGES": stages, "SAVE_AB": True,
                                                             "REGS": swiglu_gemm.CONSUMER_REGS})


def ptxas_report(ptx: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/kernel.ptx", "w") as f:
            f.write(ptx)
        return subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f"{tmp}/kernel.ptx", "-o",
                               f"{tmp}/kernel.cubin"], capture_output=True, text=True, check=True).stderr


def waits_behind_a_barrier(ptx: str) -> int:
    """How many mbarrier waits in ``ptx`` have a warpgroup (or one-warpgroup CTA) barrier right before them: the
    barriers Triton puts before a ring's waits, which ``ptx_release`` drops where they order nothing."""
    lines = [ln.split("//")[0].strip() for ln in ptx.split("\n")]
    lines = [ln for ln in lines if ln and not ln.startswith((".loc", "$L__tmp", "{", ".reg", "waitLoop:"))]
    return sum(a.startswith("bar.sync") and "mbarrier.try_wait" in b for a, b in itertools.pairwise(lines))


KERNELS = {"swiglu_backward": swiglu_backward_ptx, "swiglu_forward": swiglu_forward_ptx}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in KERNELS:
        sys.exit(f"usage: python -m tests.sm90_ptxas {{{','.join(KERNELS)}}}")
    ptx = KERNELS[sys.argv[1]]()
    print(ptxas_report(ptx))
    print(f"bar_sync={ptx.count('bar.sync')} waits_behind_a_barrier={waits_behind_a_barrier(ptx)}")
