"""Probe: our captured training step with one model-level change at a time, each in its own process.

    python scripts/device/step_variants.py VARIANT [--preset xl --context-length 2048 --compile-scope blocks]

VARIANT is ``base`` (the code as committed, with ``--residual-dtype``, bf16 by default), ``rope-swap`` (RoPE as ``x
* cos + swap_pairs(x) * (-sin, sin)``: every output element from its own and its neighbour's input, no stack of two
halves), ``pack-qkv`` / ``pack-qkv-vcont`` / ``pack-w13`` (q, k, v or w1, w3 as one packed ``Linear``; session 17,
``experiments/fused_qkv/``), ``whole-masters`` (FusedAdamW's fp32 masters whole instead of split), one of the
Inductor options in ``PATCHES``, or several joined with ``+``; ``--rope triton`` takes RoPE's Triton kernel (``bench
--rope``; session 15's ``rope-triton`` variant). Prints one JSON line: step ms (mean, median), MFU and peak GiB, as
``bench`` measures them (``run_benchmark``). Session 14's first probe (05cc250) compared the bf16 residual stream
and RoPE in the projections' layout this way, before both became the code.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from torch import nn

from cs336_basics.model import RotaryEmbedding
from cs336_systems.bench.e2e import BenchConfig, run_benchmark
from cs336_systems.fast import FFN_KERNELS, ROPE_KERNELS


def _rope_swap() -> None:
    def forward(self, x, token_positions):
        cos, sin = self.cos[token_positions], self.sin[token_positions]  # (..., dim/2)
        pairs = x.float().unflatten(-1, (-1, 2))  # (..., dim/2, 2): (even, odd)
        signed_sin = torch.stack((-sin, sin), dim=-1)  # even: e cos - o sin; odd: o cos + e sin
        return (pairs * cos.unsqueeze(-1) + pairs.flip(-1) * signed_sin).flatten(-2).to(x.dtype)

    RotaryEmbedding.forward = forward


def _pack_qkv(contiguous_v: bool = False):
    """q, k and v from one ``Linear(d, d + 2 kv)`` (one GEMM forward, two backward; no weight copy: the packed
    weight is the parameter); ``contiguous_v``: v copied out of the packed output (else a strided view into it).
    The presets' attention only: RoPE, causal, no window or packed documents (the forward refuses them)."""
    def patch() -> None:
        from cs336_basics import model as m

        init0 = m.CausalMultiHeadSelfAttention.__init__

        def init(self, d_model, num_heads, *args, **kwargs):
            init0(self, d_model, num_heads, *args, **kwargs)
            w = self.q_proj.weight
            del self.q_proj, self.k_proj, self.v_proj
            self.qkv_proj = m.Linear(d_model, d_model + 2 * self.num_kv_heads * self.head_dim, device=w.device,
                                     dtype=w.dtype)

        def forward(self, x, token_positions=None, doc_ids=None):
            if doc_ids is not None or self.attention_window is not None or self.positional_encoder is None:
                raise SystemExit("the pack-qkv probe runs RoPE and causal attention only (no window or documents)")
            T, kvd = x.shape[-2], self.num_kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split((self.d_model, kvd, kvd), dim=-1)
            if contiguous_v:
                v = v.contiguous()
            q = q.unflatten(-1, (self.num_heads, self.head_dim))
            k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
            v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
            if token_positions is None:
                token_positions = torch.arange(T, device=x.device)
            pos = token_positions.unsqueeze(-1)
            q, k = self.positional_encoder(q, pos), self.positional_encoder(k, pos)
            q, k, v = (t.transpose(-3, -2) for t in (q, k, v))
            out = self.attention_fn(q, k, v, True)
            return self.output_proj(out.transpose(-3, -2).flatten(-2))

        m.CausalMultiHeadSelfAttention.__init__ = init
        m.CausalMultiHeadSelfAttention.forward = forward
    return patch


def _pack_w13() -> None:
    """SwiGLU's w1 and w3 as one ``Linear(d, 2 d_ff)`` (one GEMM forward, two backward)."""
    from cs336_basics import model as m

    def init(self, d_model, d_ff, device=None, dtype=None):
        nn.Module.__init__(self)
        self.w13 = m.Linear(d_model, 2 * d_ff, device=device, dtype=dtype)
        self.w2 = m.Linear(d_ff, d_model, device=device, dtype=dtype)

    def forward(self, x):
        a, b = self.w13(x).chunk(2, dim=-1)
        return self.w2(m.silu(a) * b)

    m.SwiGLU.__init__ = init
    m.SwiGLU.forward = forward


def _inductor(**settings):
    """A variant that sets Inductor options (``torch._inductor.config``; dotted names under ``triton``)."""
    def patch() -> None:
        import torch._inductor.config as config

        for name, value in settings.items():
            owner = config.triton if name.startswith("triton_") else config
            key = name.removeprefix("triton_")
            if not hasattr(owner, key):
                raise SystemExit(f"this torch ({torch.__version__}) has no Inductor option {name}")
            setattr(owner, key, value)
    return patch


def _whole_masters() -> None:
    """FusedAdamW with a whole fp32 master beside each bf16 copy (28 bytes a parameter per step), as before
    session 24's split masters (the bf16 copy and int16 low halves, 26 bytes)."""
    from cs336_systems.fused import adamw

    init0 = adamw.FusedAdamW.__init__

    def init(self, *args, **kwargs):
        kwargs.setdefault("split_masters", False)
        init0(self, *args, **kwargs)

    adamw.FusedAdamW.__init__ = init


def _blas_lt() -> None:
    """Matmuls through cuBLASLt (PyTorch's other BLAS path) instead of cuBLAS: does it leave out the memsets
    cuBLAS issues before most of the step's GEMMs (674 a step at xl/2048, session 24)?"""
    torch.backends.cuda.preferred_blas_library("cublaslt")


def _no_gemm_workspace() -> None:
    """cuBLAS without a workspace (``bench --cublas-workspace none``, before the process's first matmul): only
    algorithms that need none, and so no memsets of it."""
    from cs336_systems.fast import apply_cublas_workspace

    apply_cublas_workspace("none")


PATCHES = {
    "base": lambda: None,
    "blaslt": _blas_lt,
    "noworkspace": _no_gemm_workspace,
    "whole-masters": _whole_masters,
    "rope-swap": _rope_swap,
    # session 17: packed projections (one GEMM where there were three for q/k/v, two for w1/w3)
    "pack-qkv": _pack_qkv(),
    "pack-qkv-vcont": _pack_qkv(contiguous_v=True),
    "pack-w13": _pack_w13,
    # compiler options (session 15): programmatic dependent launch between Inductor's kernels; per-kernel tuning
    # of block sizes by coordinate descent (which also tunes the norm backward's split); the norm backward's
    # rows per program (16 by default at xl/2048: 512 partial sums of the gain's gradient, then an aten::sum);
    # no mixed-order reduction (the gain's gradient as its own column reduction)
    "pdl": _inductor(triton_enable_pdl=True),
    "coord": _inductor(coordinate_descent_tuning=True),
    "split64": _inductor(triton_mix_order_reduction_split_size=64),
    "nomix": _inductor(triton_mix_order_reduction=False),
    # matmuls autotuned among cuBLAS and Triton templates, whose epilogues may take the pointwise work after
    # them (SwiGLU, its backward, the residual adds); -tma: with Hopper's persistent TMA templates among them
    "autotune": _inductor(max_autotune=True),
    "autotune-tma": _inductor(max_autotune=True, triton_enable_persistent_tma_matmul=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant")
    parser.add_argument("--preset", default="xl")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--compile-scope", default="blocks", choices=("model", "blocks"))
    parser.add_argument("--residual-dtype", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--rope", default="torch", choices=ROPE_KERNELS)
    parser.add_argument("--ffn", default="torch", choices=FFN_KERNELS)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    for name in args.variant.split("+"):
        if name not in PATCHES:
            raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(PATCHES)} (joined with +)")
        PATCHES[name]()
    cfg = BenchConfig(preset=args.preset, context_length=args.context_length, precision="bf16", compile=True,
                      compile_scope=args.compile_scope, attention="flash_auto", optimizer="fused", loss="unfused",
                      cuda_graph=True, warmup=3, steps=args.steps, residual_dtype=args.residual_dtype,
                      rope=args.rope, ffn=args.ffn)
    rec = run_benchmark(cfg)
    times = rec.get("step_times_ms", [float("nan")])
    print(json.dumps(dict(variant=args.variant, preset=args.preset, context=args.context_length,
                          scope=args.compile_scope, residual=args.residual_dtype, rope=args.rope, ffn=args.ffn,
                          status=rec["status"],
                          step_mean_ms=statistics.mean(times), step_median_ms=statistics.median(times),
                          mfu=rec.get("mfu"), peak_gib=rec.get("peak_memory_gib"), torch=torch.__version__)))


if __name__ == "__main__":
    main()
