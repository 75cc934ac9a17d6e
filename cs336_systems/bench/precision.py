"""Mixed precision, observed (handout problems ``mixed_precision_accumulation`` and
``benchmarking_mixed_precision`` (a, b)).

Nothing here is typed in: the four accumulation loops are run and their sums read back; the
dtypes of the toy model's parameters, activations, loss and gradients under autocast are read off
the tensors themselves (forward hooks); the LayerNorm question is answered by computing the
variance of large activations in fp16, bf16 and fp32.
"""

from __future__ import annotations

import torch
from torch import nn

AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def accumulation_loops(n: int = 1000, increment: float = 0.01) -> list[dict]:
    """The handout's four loops: add ``increment`` ``n`` times with the accumulator / summand dtypes below."""
    cases = [
        ("fp32 += fp32", torch.float32, torch.float32, False),
        ("fp16 += fp16", torch.float16, torch.float16, False),
        ("fp32 += fp16 (implicit upcast)", torch.float32, torch.float16, False),
        ("fp32 += fp16.to(fp32)", torch.float32, torch.float16, True),
    ]
    rows = []
    for label, acc_dtype, inc_dtype, explicit in cases:
        s = torch.tensor(0, dtype=acc_dtype)
        for _ in range(n):
            x = torch.tensor(increment, dtype=inc_dtype)
            s += x.type(torch.float32) if explicit else x
        exact = n * increment
        rows.append({"loop": label, "accumulator": str(acc_dtype).removeprefix("torch."),
                     "summand": str(inc_dtype).removeprefix("torch."), "result": float(s), "exact": exact,
                     "abs_error": abs(float(s) - exact),
                     "summand_as_stored": float(torch.tensor(increment, dtype=inc_dtype).double())})
    return rows


class ToyModel(nn.Module):
    """The handout's toy network: fc1 -> ReLU -> LayerNorm -> fc2 (no biases on the linears)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def observed_autocast_dtypes(autocast: str, device: torch.device, batch: int = 8, in_features: int = 20,
                             out_features: int = 5) -> dict:
    """Train one step of ``ToyModel`` under ``torch.autocast(dtype)`` and read off every dtype."""
    if autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"benchmarking_mixed_precision: unknown autocast dtype {autocast!r}; "
                         f"choose from {', '.join(AUTOCAST_DTYPES)}")
    model = ToyModel(in_features, out_features).to(device)
    seen: dict[str, torch.dtype] = {}
    hooks = [getattr(model, name).register_forward_hook(
        lambda _m, _i, out, name=name: seen.__setitem__(name, out.dtype)) for name in ("fc1", "relu", "ln", "fc2")]
    x = torch.randn(batch, in_features, device=device)
    y = torch.randint(0, out_features, (batch,), device=device)
    with torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[autocast]):
        param_dtypes = sorted({_name(p.dtype) for p in model.parameters()})
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    for h in hooks:
        h.remove()
    return {
        "autocast": autocast, "device": str(device),
        "parameters (inside autocast)": ",".join(param_dtypes),
        "fc1 output": _name(seen["fc1"]), "relu output": _name(seen["relu"]),
        "layernorm output": _name(seen["ln"]), "logits": _name(logits.dtype), "loss": _name(loss.dtype),
        "gradients": ",".join(sorted({_name(p.grad.dtype) for p in model.parameters()})),
    }


def layernorm_range_check(device: torch.device, scale: float = 300.0, width: int = 1024) -> list[dict]:
    """Why LayerNorm is kept in fp32 under fp16 autocast: the variance of activations of size
    ``scale`` needs x^2 ~ scale^2, beyond fp16's largest finite value (65504) once scale > 256,
    while bf16 shares fp32's exponent range (but keeps only 8 mantissa bits)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(width, generator=gen, dtype=torch.float64) * scale).to(device)
    ref = x.var(unbiased=False).item()
    rows = []
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        xd = x.to(dtype)
        var = ((xd - xd.mean()) ** 2).mean()  # computed entirely in `dtype`
        value = float(var.double())
        rows.append({"dtype": name, "input_scale": scale, "variance": value, "reference_fp64": ref,
                     "finite": bool(torch.isfinite(var).item()), "max_finite": float(torch.finfo(dtype).max),
                     "rel_error": abs(value - ref) / ref if torch.isfinite(var).item() else float("inf")})
    return rows
