"""Timers, NVTX ranges, torch.profiler kernel tables and memory snapshots."""
