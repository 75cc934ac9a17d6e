"""Loss check of the fast training step: the same model, data and seed trained with the unfused path
(LM head + cross_entropy, cs336 AdamW; autocast's fp32 residual stream) and with the fused one
(linear_cross_entropy, FusedAdamW with bf16 weight copies under bf16, the fast settings' attention, compilation
and residual stream dtype, or ``--residual-dtype``), step by step.

Data: a learnable synthetic language (each token follows a fixed random successor of the previous one with
probability 0.9, else a uniform draw), so the losses fall well below log(V) and the comparison means
something. Writes one record per run (final loss = mean of the last 10 steps) to results/training_step/.

    python scripts/device/step_loss_check.py --preset small --precision bf16 --steps 300
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch

import cs336_systems.attention  # noqa: F401  (registers flash_auto and our kernels where the package is not installed)
from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.optimizer import AdamW
from cs336_systems.configs import get_preset
from cs336_systems.fast import fast_settings
from cs336_systems.fused.adamw import FusedAdamW, low_precision_params
from cs336_systems.fused.linear_cross_entropy import defer_lm_head, linear_cross_entropy
from cs336_systems.records import write_records


def batches(vocab: int, batch: int, context: int, steps: int, device: torch.device, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    successor = torch.randperm(vocab, generator=gen)
    for _ in range(steps):
        seq = torch.empty(batch, context + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, vocab, (batch,), generator=gen)
        noise = torch.rand(batch, context, generator=gen) > 0.9
        random_next = torch.randint(0, vocab, (batch, context), generator=gen)
        for t in range(context):
            seq[:, t + 1] = torch.where(noise[:, t], random_next[:, t], successor[seq[:, t]])
        seq = seq.to(device)
        yield seq[:, :-1], seq[:, 1:]


def train(fused: bool, args, device: torch.device) -> list[float]:
    torch.manual_seed(args.seed)
    cfg = get_preset(args.preset)
    context = args.context_length or cfg.context_length
    cfg = cfg.replace(context_length=context)
    fast = fast_settings(device)
    model = BasicsTransformerLM(**cfg.model_kwargs(), attention_backend=fast.attention if fused else "reference",
                                check_inputs=False, device=device)
    bf16 = args.precision == "bf16"
    if fused:
        defer_lm_head(model)
        opt = FusedAdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                         compute_dtype=torch.bfloat16 if bf16 else None,
                         low_precision=low_precision_params(model, args.residual_dtype) if bf16 else ())
        if fast.compile:
            for block in model.layers:
                block.compile()
    else:
        opt = AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    losses = []
    for x, y in batches(cfg.vocab_size, args.batch_size, context, args.steps, device):
        with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            out = model(x)
            loss = linear_cross_entropy(out, model.lm_head.weight, y) if fused else cross_entropy(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="small")
    p.add_argument("--context-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--residual-dtype", default=None, choices=["fp32", "bf16"],
                   help="the fused path's residual stream under bf16 (default: the fast settings')")
    p.add_argument("--results-dir", default="results")
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.residual_dtype = args.residual_dtype or fast_settings(device).residual_dtype
    runs = {name: train(name == "fused", args, device) for name in ("unfused", "fused")}
    final = {k: statistics.fmean(v[-10:]) for k, v in runs.items()}
    rel = abs(final["fused"] - final["unfused"]) / final["unfused"]
    rows = [{"check": "loss", "path": k, **{a: getattr(args, a) for a in ("preset", "context_length", "batch_size",
                                                                           "precision", "steps", "lr", "seed")},
             "residual_dtype": args.residual_dtype if k == "fused" and args.precision == "bf16" else "fp32",
             "first_loss": v[0], "final_loss_last10": final[k], "losses": v,
             "relative_difference": rel, "within_1_percent": rel < 0.01} for k, v in runs.items()]
    path = write_records("training_step", rows, args.results_dir, device=device)
    print(f"loss check {args.preset} {args.precision} {args.steps} steps: unfused {final['unfused']:.4f} "
          f"(from {runs['unfused'][0]:.3f}), fused (residual {args.residual_dtype}) {final['fused']:.4f}, relative "
          f"difference {rel:.2e} -> {path}")


if __name__ == "__main__":
    main()
