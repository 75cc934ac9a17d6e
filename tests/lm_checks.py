"""Shared check of the GPU tests of the model's fused pieces: a compiled LM with a fused piece installed against the
same LM running the modules' own code."""

from __future__ import annotations

import torch
from torch import nn

from cs336_basics.model import BasicsTransformerLM

KWARGS = dict(vocab_size=512, context_length=256, d_model=256, num_layers=2, num_heads=4, d_ff=704, device="cuda",
              check_inputs=False)


def check_compiled_lm(module_type: type[nn.Module], install) -> None:
    """The LM in bf16 autocast with ``module_type``'s weights bf16 (as the fused optimizer keeps them), ours with
    ``install(model)`` applied and compiled with ``fullgraph=True``: logits within bf16 tolerance of the module's
    compiled code, and every gradient finite and aligned with the module's (cosine > 0.999)."""
    ref, ours = BasicsTransformerLM(**KWARGS), BasicsTransformerLM(**KWARGS)
    ours.load_state_dict(ref.state_dict())
    for model in (ref, ours):
        for mod in model.modules():
            if isinstance(mod, module_type):
                mod.to(torch.bfloat16)
    assert install(ours) == KWARGS["num_layers"]
    compiled = torch.compile(ours, fullgraph=True)
    tokens = torch.randint(0, KWARGS["vocab_size"], (3, 200), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = torch.compile(ref)(tokens).float(), compiled(tokens).float()
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)
    a.square().mean().backward()
    b.square().mean().backward()
    for (name, p), q in zip(ref.named_parameters(), ours.parameters(), strict=True):
        assert torch.isfinite(q.grad).all(), name
        cos = torch.nn.functional.cosine_similarity(q.grad.float().flatten(), p.grad.float().flatten(), dim=0)
        assert cos > 0.999, (name, cos.item())
