"""Our step with q/k/v from one matmul against three (``CausalMultiHeadSelfAttention.fused_qkv``), same process.

Runs ``bench``'s training step with the fast settings (bf16) twice per round, separate then fused projections,
and prints step time and peak memory of each; ``--rounds`` alternates them to see drift.
    python experiments/fused_qkv/fused_qkv_check.py --preset xl --context-length 512 [--steps 20] [--rounds 1]
"""

import argparse

import cs336_systems.bench.e2e as e2e
from cs336_systems.fast import fast_settings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--context-length", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    fast = fast_settings("cuda", vocab_size=10_000)
    cfg = e2e.BenchConfig(preset=args.preset, context_length=args.context_length, precision="bf16", warmup=3,
                          steps=args.steps, compile=fast.compile, compile_scope=fast.compile_scope,
                          attention=fast.attention, optimizer=fast.optimizer, loss=fast.loss,
                          cuda_graph=fast.cuda_graph)
    real = e2e.BasicsTransformerLM
    for _ in range(args.rounds):
        for fused in (False, True):
            def build(*a, fused=fused, **kw):
                model = real(*a, **kw)
                for m in model.modules():
                    if hasattr(m, "fused_qkv"):
                        m.fused_qkv = fused
                return model

            e2e.BasicsTransformerLM = build
            rec = e2e.run_benchmark(cfg)
            print(f"{args.preset}/{args.context_length} fused_qkv={fused}: step {rec['step_mean_ms']:.2f} ms "
                  f"(median {rec['step_median_ms']:.2f}), peak {rec['peak_memory_gib']:.2f} GiB, "
                  f"MFU {rec['mfu']:.3f}", flush=True)


if __name__ == "__main__":
    main()
