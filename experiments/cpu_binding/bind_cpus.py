"""Bind each local rank to its own physical CPU cores (the CS336_BIND_CPUS=1 experiment; see README.md).

Call ``bind_cpus(local_rank, local_world_size)`` at the start of a rank, before CUDA and NCCL start their
threads (they inherit the affinity mask). Not part of the package: measured, not adopted.
"""

from __future__ import annotations

import os


def physical_cores() -> list[list[int]]:
    """The CPUs this process may run on, grouped by physical core (hyperthread siblings together), in
    order of their first CPU; from /sys (Linux). Without topology information every CPU is its own core."""
    allowed = sorted(os.sched_getaffinity(0))
    cores: dict[tuple[str, str], list[int]] = {}
    for cpu in allowed:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{base}/physical_package_id") as f:
                package = f.read().strip()
            with open(f"{base}/core_id") as f:
                core = f.read().strip()
        except OSError:
            package, core = "?", str(cpu)
        cores.setdefault((package, core), []).append(cpu)
    return sorted(cores.values())


def bind_cpus(local_rank: int, local_world_size: int) -> list[int]:
    """Restrict this process (threads started from now on) to its share of the physical cores: the cores
    are split into ``local_world_size`` contiguous groups, hyperthread siblings staying together, so no
    two ranks of a node share a core. Returns the CPUs bound. ``ValueError`` if there are fewer physical
    cores than local ranks."""
    cores = physical_cores()
    if len(cores) < local_world_size:
        raise ValueError(f"bind_cpus: {len(cores)} physical core(s) for {local_world_size} local ranks")
    per = len(cores) // local_world_size
    mine = sorted(c for core in cores[local_rank * per:(local_rank + 1) * per] for c in core)
    os.sched_setaffinity(0, mine)
    return mine


