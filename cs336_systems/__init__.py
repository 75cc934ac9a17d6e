"""cs336_systems: make Transformer LM training fast, and measure it honestly.

Subpackages: ``attention`` (backends incl. FlashAttention-2), ``profiling`` (timers, NVTX,
torch.profiler), ``bench`` (one sweep per handout problem), ``parallel`` (DDP variants, sharding),
``report`` (records -> REPORT.md). ``configs`` holds the model presets.
"""

__version__ = "0.1.0"
