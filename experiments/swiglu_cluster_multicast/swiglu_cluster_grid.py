# session 32 probe
"""Cluster kernels at several persistent grid sizes (programs = 2 x clusters), xl_2048, alternate rounds; also the
driver's cuOccupancyMaxActiveClusters for each kernel."""
import ctypes
import sys

import torch
from triton.testing import do_bench

from cs336_systems.fused import swiglu_gemm  # with the patch beside this script applied

m, k, n = 8192, 1600, 6400
g = torch.Generator(device="cuda").manual_seed(1)
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
w1, w3 = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5 for _ in range(2))
dy = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
w2 = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / n**0.5
a, b = x @ w1.T, x @ w3.T
orig = swiglu_gemm._programs
cap = {"v": None}
def capped(device, mm, nn, bm, bn, cluster):
    p = orig(device, mm, nn, bm, bn, cluster)
    return min(p, cap["v"]) if cap["v"] and cluster == 2 else p
swiglu_gemm._programs = capped

class Config(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("nattrs", ctypes.c_uint)]
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    for kern in (swiglu_gemm._dual_swiglu_kernel, swiglu_gemm._swiglu_bwd_kernel):
        swiglu_gemm.dual_swiglu(x, w1, w3, cluster=2)
        swiglu_gemm.swiglu_backward(dy, w2, a, b, cluster=2)
        dev = torch.cuda.current_device()
        for ck in kern.device_caches[dev][0].values():
            ck._init_handles()
            cfg = Config(132, 1, 1, ck.metadata.num_warps * 32, 1, 1, ck.metadata.shared, None, None, 0)
            num = ctypes.c_int(-1)
            rc = cuda.cuOccupancyMaxActiveClusters(ctypes.byref(num), ctypes.c_void_p(ck.function), ctypes.byref(cfg))
            print(kern.fn.__name__, "threads", ck.metadata.num_warps * 32, "smem", ck.metadata.shared,
                  "max active clusters rc", rc, "->", num.value, flush=True)
except Exception as e:
    print("occupancy query failed:", repr(e), flush=True)

caps = [int(c) for c in sys.argv[1:]] or [132, 128, 124, 120, 112, 96]
fns = {}
for c in caps:
    fns[f"fwd c2 p{c}"] = (c, lambda: swiglu_gemm.dual_swiglu(x, w1, w3, cluster=2))
    fns[f"bwd c2 p{c}"] = (c, lambda: swiglu_gemm.swiglu_backward(dy, w2, a, b, cluster=2))
fns["fwd c1"] = (None, lambda: swiglu_gemm.dual_swiglu(x, w1, w3, cluster=1))
fns["bwd c1"] = (None, lambda: swiglu_gemm.swiglu_backward(dy, w2, a, b, cluster=1))
times = {k_: [] for k_ in fns}
for r in range(3):
    for label in (list(fns) if r % 2 == 0 else list(reversed(fns))):
        c, fn = fns[label]
        cap["v"] = c
        times[label].append(do_bench(fn, warmup=10, rep=100, return_mode="median"))
for label, ts in times.items():
    ts = sorted(ts)
    print(f"{label:<14} {ts[len(ts)//2]:.4f} ms  {[round(t, 4) for t in ts]}", flush=True)
