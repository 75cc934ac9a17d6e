"""Compile the FlashAttention-2 kernels for sm_90a without a GPU and print registers and spills per config.

    python scripts/device/flash_aot.py [--shape lb2025] [--kernel bwd] [--configs 64,64,4,3 64,128,8,2 ...]

Uses Triton's bundled ptxas; arguments are specialised as the JIT would for the shape (bf16, causal, TMA
form). What a GPU sweep would find out by failing or spilling, at no device time.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.compiler import compile as triton_compile
from triton.runtime.jit import create_function_from_signature

import cs336_systems.attention.flash_triton as ft
from cs336_systems.bench.flash import MODEL_SHAPES


def aot_compile(kernel, *args, num_warps=4, num_stages=3, **constexprs):
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kw = dict(constexprs, num_warps=num_warps, num_stages=num_stages, debug=False)
    bound, spec, opts = binder(*args, **kw)
    options, signature, consts, attrs = kernel._pack_args(backend, kw, bound, spec, opts)
    return triton_compile(ASTSource(kernel, signature, consts, attrs), target=backend.target, options=options.__dict__)


def ptxas_usage(ptx: str) -> str:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spill = re.search(r"(\d+) bytes spill stores", res.stderr)
    return f"regs={regs.group(1) if regs else '?'} spill_stores={spill.group(1) if spill else '?'}B"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="lb2025", choices=list(MODEL_SHAPES))
    p.add_argument("--kernel", default="bwd", choices=["fwd", "bwd"])
    p.add_argument("--configs", nargs="+", default=["64,64,4,3", "64,128,8,2", "64,128,8,3", "128,128,8,2"])
    args = p.parse_args()
    s = MODEL_SHAPES[args.shape]
    bh, n, d = s.batch * s.heads, s.seq_len, s.head_dim
    x = torch.empty(bh, n, d, dtype=torch.bfloat16)
    lse = torch.empty(bh, n)
    acc = torch.empty(bh, n, d)
    for text in args.configs:
        bm, bn, w, st = (int(v) for v in text.split(","))
        common = dict(HEAD_DIM=d, D_PAD=d, BLOCK_M=bm, BLOCK_N=bn, IS_CAUSAL=s.causal, EVEN_D=True, TMA=True,
                      INPUT_PRECISION="tf32", INTERPRET=False, num_warps=w, num_stages=st)
        if args.kernel == "fwd":
            k = aot_compile(ft._flash_fwd_kernel, x, x, x, x, lse, *x.stride() * 4, n, n, 0.18, **common)
        else:
            k = aot_compile(ft._flash_bwd_dkdv_kernel, x, x, x, x, lse, lse, x, x, acc, *x.stride() * 6, n, n,
                            0.125, 0.18, ATOMIC_DQ=True, **common)
        wgmma = k.asm["ptx"].count("wgmma.mma_async")
        reduce = k.asm["ptx"].count("cp.reduce.async.bulk")
        usage = ptxas_usage(k.asm["ptx"])
        print(f"{args.shape} {args.kernel} {bm}x{bn}/w{w}/s{st}: shared={k.metadata.shared} {usage} "
              f"wgmma={wgmma} tma_reduce={reduce}", flush=True)


if __name__ == "__main__":
    main()
