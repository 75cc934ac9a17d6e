"""A Gluon kernel compiled for sm_90a on any host (Triton's bundled ptxas, no GPU), printing ptxas's resource report
(registers, spills): ``python -m tests.sm90_ptxas swiglu_backward``. Run without ``TRITON_INTERPRET``, which makes
the kernels' decorators build interpreter functions instead."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type


def swiglu_backward_ptx() -> str:
    """The fused feed-forward's backward kernel at the package's configuration, as PTX for sm_90a."""
    from cs336_systems.fused import swiglu_gemm

    bf16, (block_m, block_n, block_k, stages, group_m) = torch.bfloat16, swiglu_gemm.BWD_CONFIG
    dy, w2 = torch.empty(256, 128, dtype=bf16), torch.empty(128, 256, dtype=bf16)
    out = torch.empty(256, 256, dtype=bf16)
    descs = [swiglu_gemm._desc(dy, [block_m // 2, block_k]), swiglu_gemm._desc(w2, [block_k, block_n])]
    descs += [swiglu_gemm._desc(out, [block_m // 2, block_n])] * 4
    kernel = swiglu_gemm._swiglu_bwd_kernel
    consts = {"GROUP_M": group_m, "STAGES": stages, "REGS": swiglu_gemm.CONSUMER_REGS}
    names = list(kernel.arg_names)
    sig = {names[i]: mangle_type(d) for i, d in enumerate(descs)} | dict.fromkeys(("M", "N", "K"), "i32")
    sig |= dict.fromkeys(consts, "constexpr")
    src = GluonASTSource(kernel, sig, {(names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]


def ptxas_report(ptx: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/kernel.ptx", "w") as f:
            f.write(ptx)
        return subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f"{tmp}/kernel.ptx", "-o",
                               f"{tmp}/kernel.cubin"], capture_output=True, text=True, check=True).stderr


KERNELS = {"swiglu_backward": swiglu_backward_ptx}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in KERNELS:
        sys.exit(f"usage: python -m tests.sm90_ptxas {{{','.join(KERNELS)}}}")
    print(ptxas_report(KERNELS[sys.argv[1]]()))
