"""cs336_basics: our own from-scratch Transformer language model (the CS336 A1 interface).

The workload that ``cs336_systems`` profiles, accelerates and parallelises. This package knows
nothing about profiling or parallelism; the attention implementation is passed in by name.
"""

from cs336_basics.attention import (
    available_attention_backends,
    get_attention_backend,
    register_attention_backend,
)
from cs336_basics.model import BasicsTransformerLM

__all__ = [
    "BasicsTransformerLM",
    "available_attention_backends",
    "get_attention_backend",
    "register_attention_backend",
]
