"""Compile the FlashAttention-2 kernels a call would launch for sm_90a, without a GPU, and print shared memory,
registers and spills of each.

    python scripts/device/flash_aot.py [--shape xl_512] [--backward single|atomic|deterministic]
    python scripts/device/flash_aot.py --gluon-bwd      # every Variant of flash_hopper_bwd, causal and not
    python scripts/device/flash_aot.py --shape xl_2048 --forward-only --fwd-set NAME=1   # a patch's constexpr
    python scripts/device/flash_aot.py --shape xl_2048 --forward-only --sass-waits  # softmax under P V or not
    python scripts/device/flash_aot.py --shape noncausal_2k --backward atomic --ptx-dir /tmp/ptx  # the PTX too
    python scripts/device/flash_aot.py --shape xl_2048 --forward-only --fwd-set PACK_P=1 --sass-ops PRMT F2FP
        # how many SASS instructions of these opcodes (prefixes) each kernel holds; --dtype fp16 for half inputs

The launchers plan the call exactly as on an H100 (the code table's tiles, tensor descriptors, bf16) on CPU
tensors; each launch is compiled with Triton's bundled ptxas instead of run. What a GPU run would find out by
failing to compile or spilling, at no device time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import tempfile
import types
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.compiler import compile as triton_compile
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import create_function_from_signature

import cs336_systems.attention.flash_triton as ft
from cs336_systems.attention import _tuning, ptx_release
from cs336_systems.attention._common import normalize_window
from cs336_systems.bench.flash import MODEL_SHAPES


def aot_compile(kernel, *args, num_warps=4, num_stages=3, **constexprs):
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kw = dict(constexprs, num_warps=num_warps, num_stages=num_stages, debug=False)
    bound, spec, opts = binder(*args, **kw)
    options, signature, consts, attrs = kernel._pack_args(backend, kw, bound, spec, opts)
    source = GluonASTSource if kernel.is_gluon() else ASTSource  # the Gluon kernels (flash_hopper*) on sm_90
    return triton_compile(source(kernel, signature, consts, attrs), target=backend.target, options=options.__dict__)


def gluon_bwd(variants=None, causals=(False, True), groups=(1, 4), n: int = 1000) -> int:
    """Compile variants of the Gluon backward kernel (default: all), causal and not, plain and grouped heads (GROUP
    1 is specialised to a constant), Nq = Nk = n; print shared memory, registers and spills. Returns how many
    spill."""
    from cs336_systems.attention import flash_hopper_bwd as hb

    bad = 0
    for var in variants or hb.VARIANTS:
        d = var.head_dim
        q, k, v, do, dk, dv = (torch.empty(8, n, d, dtype=torch.bfloat16) for _ in range(6))
        lse, delta, dq_acc = torch.empty(8, n), torch.empty(8, n), torch.empty(8, n, d)
        s3 = (n * d, d, 1)
        for causal in causals:
            for group in groups:
                descs = hb.backward_descs(2, group, n, n, s3, s3, s3, s3, s3, d, var.block_m, var.block_n,
                                          torch.bfloat16, 0, 0, var.warp_specialize, var.dq_tma)
                pointers = ft._with_descs((q, k, v, do, lse, delta, dk, dv, dq_acc, lse, lse), descs)
                args = (*pointers, *s3 * 6, n, n, group, 2, 0, 0, 0.125, 0.18)
                kernel = aot_compile(var.kernel, *args, num_warps=var.num_warps, num_stages=1,
                                     **var.constexprs(causal))
                ptx = kernel.asm["ptx"]
                usage = ptxas_usage(ptx)
                bad += "spill_stores=0B" not in usage
                print(f"gluon_bwd {var.name()} causal={int(causal)} group={group}: shared={kernel.metadata.shared} "
                      f"{usage} wgmma={ptx.count('wgmma.mma_async')} tma_reduce={ptx.count('cp.reduce.async.bulk')} "
                      f"bar_sync={ptx.count('bar.sync')} marked={int(ptx_release.marked(ptx))}", flush=True)
    return bad


def disassemble(cubin: bytes) -> str:
    """The SASS of a compiled kernel (Triton's bundled nvdisasm)."""
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(nvdisasm), "-c", str(path)], capture_output=True, text=True).stdout


def sass_waits(cubin: bytes) -> list[int]:
    """Per software-pipelined step of a compiled kernel (a ``wgmma`` wait that leaves one group in flight, then the
    wait for none): how many exponentials ptxas scheduled between the two, i.e. how much softmax runs under the
    in-flight P V. ptxas places the second wait itself: in a basic block with the softmax it may hoist it above
    every exponential (docs/flash_tuning_notes.md, session 23)."""
    lines = disassemble(cubin).splitlines()
    counts = []
    for i, line in enumerate(lines):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            j = next((k for k in range(i + 1, len(lines)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in lines[k]), i)
            counts.append(sum("MUFU.EX2" in lines[k] for k in range(i, j)))
    return counts


def sass_ops(cubin: bytes, ops: list[str]) -> str:
    """``OP=count`` of the SASS instructions whose opcode starts with each of ``ops`` (predicates skipped)."""
    opcodes = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)",
                                               disassemble(cubin))]
    return " ".join(f"{op}={sum(o.startswith(op) for o in opcodes)}" for op in ops)


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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="xl_512", choices=list(MODEL_SHAPES))
    p.add_argument("--backward", default="single", choices=["single", "atomic", "deterministic"])
    p.add_argument("--gluon-bwd", nargs="*", default=None, metavar="NAME",
                   help="compile the Gluon backward kernel's variants instead (these, by Variant.name(); default all)")
    p.add_argument("--fwd-set", nargs="*", default=[], metavar="NAME=INT",
                   help="constexprs added to the forward's launch (an experiment's, e.g. LAZY_RESCALE=8)")
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--ptx-dir", default=None, help="also write each compiled kernel's PTX there (<kernel>.ptx)")
    p.add_argument("--sass-ops", nargs="*", default=[], metavar="OP",
                   help="also print how many SASS instructions each kernel holds of these opcodes (prefixes)")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--sass-waits", action="store_true",
                   help="also print, per pipelined step, the exponentials between the two wgmma waits")
    args = p.parse_args()
    fwd_set = {name: int(value) for name, value in (kv.split("=") for kv in args.fwd_set)}
    if args.gluon_bwd is not None:
        from cs336_systems.attention import flash_hopper_bwd as hb

        names = set(args.gluon_bwd)
        raise SystemExit(1 if gluon_bwd([v for v in hb.VARIANTS if not names or v.name() in names]) else 0)
    s = MODEL_SHAPES[args.shape]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    q, k, v, do = (torch.empty(s.batch, s.heads, s.seq_len, s.head_dim, dtype=dtype) for _ in range(4))
    cfg = _tuning.resolve(ft._d_pad(s.head_dim), dtype, s.seq_len, (9, 0), _tuning.load_pinned())
    cfg = dataclasses.replace(cfg, single_max_programs=1 << 30 if args.backward == "single" else 0)

    def compile_instead(self, grid, pointers, scalars):
        extra = fwd_set if "fwd" in self.kernel.__name__ else {}
        kernel = aot_compile(self.kernel, *ft._with_descs(pointers, self.descs), *scalars,
                             **dict(self.constexprs, **extra),
                             num_warps=self.cfg.num_warps, num_stages=self.cfg.num_stages)
        ptx = kernel.asm["ptx"]
        if args.ptx_dir:
            Path(args.ptx_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.ptx_dir) / f"{self.kernel.__name__}.ptx").write_text(ptx)
        print(f"{args.shape} {self.kernel.__name__} {self.cfg.short()} grid={grid}: shared={kernel.metadata.shared} "
              f"{ptxas_usage(ptx)} wgmma={ptx.count('wgmma.mma_async')} "
              f"tma_reduce={ptx.count('cp.reduce.async.bulk')} bar_sync={ptx.count('bar.sync')} "
              f"marked={int(ptx_release.marked(ptx))}"
              + (f" ex2_under_pv={sass_waits(kernel.asm['cubin'])}" if args.sass_waits else "")
              + (f" {sass_ops(kernel.asm['cubin'], args.sass_ops)}" if args.sass_ops else ""), flush=True)

    ft._Launch.__call__ = compile_instead
    # the planner asks the GPU for its SM count (one-wave calls skip persistence) and, for the persistent forward,
    # for a work counter on the device: an H100's numbers and a CPU tensor stand in
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
        multi_processor_count=132, regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
        max_threads_per_multi_processor=2048, L2_cache_size=50 * 2**20)
    ft._work_counter = lambda device: torch.zeros(2, dtype=torch.int32)
    left, right = normalize_window(None, s.causal, s.seq_len, s.seq_len)
    scale = s.head_dim ** -0.5
    o, lse = ft._forward(q, k, v, cfg, left, right, None, None, scale)
    if args.forward_only:
        return
    ft._backward(q, k, v, o, lse, do, cfg, args.backward == "deterministic", left, right, None, None, scale)


if __name__ == "__main__":
    main()
