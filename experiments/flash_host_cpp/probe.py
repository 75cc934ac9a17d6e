"""How much of a small attention call's host time a C++ dispatch path could remove (issue 18's host-bound rows).

Times forward+backward of four ways to issue the same call, interleaved round by round in one process, with no
kernel launched (so what is timed is the dispatch: Python, the autograd engine, the allocations):
- ``ours``: the adapters' ``FlashAttention2Triton`` with its launches stubbed out (``_Launch.__call__``);
- ``empty``: a Python ``autograd.Function`` that allocates nothing (the interface's floor);
- ``py+cpp``: a Python ``autograd.Function`` whose forward and backward call one C++ function each, which allocates
  O and L, then dQ, dK and dV (FlashAttention-3's layout: Python Function, C++ ops);
- ``cpp``: a C++ ``torch::autograd::Function`` doing the same (no Python in the backward; the engine's device thread
  then runs it without the GIL on CUDA).
Also says whether each one's ``grad_fn`` exposes ``saved_tensors``, which the flash tests read L from.

    python experiments/flash_host_cpp/probe.py [--device cpu|cuda] [--shape 1 1 128 64] [--calls 2000] [--rounds 9]

Builds a small extension with ``torch.utils.cpp_extension.load_inline`` (a C++ compiler and ninja; about 30 s).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.cpp_extension import load_inline

import cs336_systems.attention.flash_triton as ft

_SRC = r"""
#include <torch/extension.h>
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<torch::Tensor, torch::Tensor> fwd(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                             bool causal) {
  return {torch::empty_like(q), torch::empty(q.sizes().slice(0, q.dim() - 1), q.options().dtype(torch::kFloat32))};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> bwd(const torch::Tensor& q, const torch::Tensor& k,
                                                            const torch::Tensor& v, const torch::Tensor& o,
                                                            const torch::Tensor& l, const torch::Tensor& d) {
  return {torch::empty_like(q), torch::empty_like(k), torch::empty_like(v)};
}

struct Fn : public torch::autograd::Function<Fn> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal) {
    auto [o, l] = fwd(q, k, v, causal);
    ctx->save_for_backward({l, q, k, v, o});
    return o;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto s = ctx->get_saved_variables();
    auto [dq, dk, dv] = bwd(s[1], s[2], s[3], s[4], s[0], g[0]);
    return {dq, dk, dv, torch::Tensor()};
  }
};

torch::Tensor cpp_apply(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal) {
  return Fn::apply(q, k, v, causal);
}
"""


class _Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None


def _py_cpp(ext):
    class PyCpp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal=False):
            o, lse = ext.fwd(q, k, v, causal)
            ctx.save_for_backward(lse, q, k, v, o)
            return o

        @staticmethod
        def backward(ctx, do):
            lse, q, k, v, o = ctx.saved_tensors
            return *ext.bwd(q, k, v, o, lse, do), None

    return PyCpp.apply


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", type=int, nargs=4, default=[1, 1, 128, 64], metavar=("B", "H", "N", "D"))
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    dev = torch.device(args.device)
    ext = load_inline("flash_host_cpp_probe", cpp_sources=_SRC, functions=["fwd", "bwd", "cpp_apply"])
    ft._Launch.__call__ = lambda self, grid, pointers, scalars: None  # dispatch only
    if dev.type == "cpu":
        if ft._INTERPRETED:
            raise SystemExit("unset TRITON_INTERPRET: this times the compiled-kernel path's Python")
        ft._check_runnable = lambda t: None
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    q, k, v = (torch.randn(*args.shape, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    do = torch.randn(*args.shape, device=dev, dtype=dtype)
    ways = {"ours": ft.FlashAttention2Triton.apply, "empty": _Empty.apply, "py+cpp": _py_cpp(ext),
            "cpp": ext.cpp_apply}
    for name, fn in ways.items():
        o = fn(q, k, v, True)
        exposed = hasattr(o.grad_fn, "saved_tensors")
        print(f"{name:7s} grad_fn {type(o.grad_fn).__name__}, saved_tensors exposed: {exposed}")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                q.grad = k.grad = v.grad = None
                fn(q, k, v, True).backward(do)
            sync()
            times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
    print(f"{dev.type}, {' x '.join(map(str, args.shape))}, us per forward+backward, median (min-max) of "
          f"{args.rounds} interleaved rounds of {args.calls}:")
    for name, ts in times.items():
        ts.sort()
        print(f"  {name:7s} {ts[len(ts) // 2]:7.1f} ({ts[0]:.1f}-{ts[-1]:.1f})")


if __name__ == "__main__":
    main()
