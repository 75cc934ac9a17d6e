"""Print Inductor's generated code (forward and backward) for our RMSNorm feeding a matmul at xl/2048's shape
(bf16 input, 4 x 2048 x 1600), to see how the norm's backward reduces the gain's gradient.

    TORCH_LOGS=output_code python scripts/device/inductor_norm_code.py 2> code.txt
"""

from __future__ import annotations

import torch

from cs336_basics.model import RMSNorm


def main() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(1600, device="cuda")
    x = torch.randn(4, 2048, 1600, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1600, 1600, device="cuda", dtype=torch.bfloat16)
    step = torch.compile(lambda x: (norm(x) @ w).float().square().mean())
    step(x).backward()


if __name__ == "__main__":
    main()
