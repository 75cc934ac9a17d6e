"""Fused pieces of a training step: the LM head with its loss, and the AdamW update with bf16 weight copies."""
