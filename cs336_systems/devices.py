"""Device names from the command line, checked before any work.

``resolve_device("cuda")`` on a machine without a CUDA GPU, or ``"cuda:3"`` on a machine with two,
raises a ``ValueError`` that names the setting and what this machine has, so a command ends with one
line instead of a CUDA traceback deep inside the first allocation.
"""

from __future__ import annotations

import os

import torch


def available_devices() -> list[str]:
    """The device names this machine can run on: ``cpu`` and ``cuda:i`` for each visible GPU."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu"] + (["cuda"] + [f"cuda:{i}" for i in range(n)] if n else [])


def resolve_device(spec: str | torch.device | None, setting: str = "--device") -> torch.device:
    """``spec`` as a ``torch.device`` (``None``: the first GPU if there is one, else the CPU)."""
    if spec is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{setting} {spec!r} is not a device name; allowed here: "
                         f"{', '.join(available_devices())}") from err
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"{setting} {spec!r}: only cpu and cuda devices are supported; allowed here: "
                         f"{', '.join(available_devices())}")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        raise ValueError(f"{setting} {spec!r}: this machine has no CUDA GPU; allowed here: cpu")
    if device.index is not None and device.index >= n:
        raise ValueError(f"{setting} {spec!r}: this machine has {n} CUDA GPU(s); allowed here: "
                         f"{', '.join(available_devices())}")
    return device


def available_bytes(device: torch.device, local_world: int = 1) -> tuple[float, str]:
    """Bytes free for one process on ``device`` (a GPU's free memory; on the CPU, 1/``local_world`` of the RAM the
    kernel reports available) and how to say where, for a message."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return float(free), f"{device} has"
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        avail = float(info["MemAvailable"])
    except (OSError, KeyError, ValueError):
        avail = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return avail / local_world, "this machine has" + (f" (1/{local_world} of its RAM per rank)" if local_world > 1
                                                      else "")
