"""Probe: our captured training step with one model-level change at a time, each in its own process.

    python scripts/device/step_variants.py VARIANT [--preset xl --context-length 2048 --compile-scope blocks]

VARIANT is ``base`` (the code as committed), ``residual-bf16`` (the fused optimizer also keeps the token embedding
as a bf16 copy of an fp32 master, so the residual stream and its gradient run in bf16, as Megatron-LM does by
default), ``rope-bthd`` (q and k rotated in the projections' (B, T, H, Dh) layout, attention given (B, H, T, Dh)
views: coalesced reads and writes, no layout copies), or both joined with ``+``. Prints one line per variant:
step ms (mean, median), MFU and peak GiB, as ``bench`` measures them (``run_benchmark``).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from einops import rearrange

import cs336_systems.fused.adamw as fused_adamw
from cs336_basics.model import CausalMultiHeadSelfAttention, Embedding
from cs336_systems.bench.e2e import BenchConfig, run_benchmark


def _residual_bf16() -> None:
    original = fused_adamw.low_precision_params

    def select(module, name, param):
        return fused_adamw.is_matmul_weight(module, name, param) or (isinstance(module, Embedding) and name == "weight")

    fused_adamw.low_precision_params = lambda model, select_=select: original(model, select_)


def _rope_bthd() -> None:
    def forward(self, x, token_positions=None, doc_ids=None):
        T = x.shape[-2]
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))  # (B, T, H, Dh)
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.positional_encoder is not None:
            if token_positions is None:
                token_positions = torch.arange(T, device=x.device)
            pos = token_positions.unsqueeze(-1)  # (..., T, 1): the same position for every head
            q, k = self.positional_encoder(q, pos), self.positional_encoder(k, pos)
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))
        out = self.attention_fn(q, k, v, True)
        return self.output_proj(rearrange(out, "... h t d -> ... t (h d)"))

    CausalMultiHeadSelfAttention.forward = forward


PATCHES = {"base": lambda: None, "residual-bf16": _residual_bf16, "rope-bthd": _rope_bthd}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant")
    parser.add_argument("--preset", default="xl")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--compile-scope", default="blocks", choices=("model", "blocks"))
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    for name in args.variant.split("+"):
        if name not in PATCHES:
            raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(PATCHES)} (joined with +)")
        PATCHES[name]()
    cfg = BenchConfig(preset=args.preset, context_length=args.context_length, precision="bf16", compile=True,
                      compile_scope=args.compile_scope, attention="flash_auto", optimizer="fused", loss="unfused",
                      cuda_graph=True, warmup=3, steps=args.steps)
    rec = run_benchmark(cfg)
    times = rec.get("step_times_ms", [float("nan")])
    print(json.dumps(dict(variant=args.variant, preset=args.preset, context=args.context_length,
                          scope=args.compile_scope, status=rec["status"], step_mean_ms=statistics.mean(times),
                          step_median_ms=statistics.median(times), mfu=rec.get("mfu"),
                          peak_gib=rec.get("peak_memory_gib"), torch=torch.__version__)))


if __name__ == "__main__":
    main()
