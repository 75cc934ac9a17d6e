"""Dump the Inductor code of our compiled step at a small size, to see which kernels it generates and which it hands
to ATen (issue 19: 97 ``at::native::reduce_kernel`` launches a step at xl/2048, one per RMSNorm, whose source the
profile does not name).

    TORCH_LOGS=output_code python scripts/device/inductor_code_dump.py [--preset xl --context-length 2048 --layers 2] \
        2> "$OUT/output_code.txt"
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.bench.e2e import BenchConfig, build_ours
from cs336_systems.configs import get_preset
from cs336_systems.fast import fast_settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="xl")
    p.add_argument("--context-length", type=int, default=2048)
    p.add_argument("--layers", type=int, default=2, help="blocks (the preset's shapes, fewer of them: a quick compile)")
    a = p.parse_args()
    device = torch.device("cuda")
    model_cfg = get_preset(a.preset).replace(context_length=a.context_length, num_layers=a.layers)
    fast = fast_settings(device, model_cfg.vocab_size, model_cfg.d_model, model_cfg.batch_size * a.context_length)
    cfg = BenchConfig(preset=a.preset, context_length=a.context_length, precision="bf16", compile=True,
                      compile_scope=fast.compile_scope, attention=fast.attention, optimizer=fast.optimizer,
                      loss=fast.loss, residual_dtype=fast.residual_dtype, rope=fast.rope, ffn=fast.ffn)
    _, optimizer, loss_fn, _ = build_ours(cfg, model_cfg.model_kwargs(), device)
    x = torch.randint(0, model_cfg.vocab_size, (model_cfg.batch_size, a.context_length), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        loss = loss_fn(x, x)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    print("done", fast.describe())


if __name__ == "__main__":
    main()
