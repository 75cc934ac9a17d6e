"""``cs336-systems info``: what this machine offers."""

from __future__ import annotations

import argparse
import platform

import torch

from cs336_basics.attention import available_attention_backends


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def collect() -> dict[str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    dist = torch.distributed
    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version,
        "CUDA (torch built with)": str(torch.version.cuda),
        "cuDNN": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "not available",
        "CUDA available": str(torch.cuda.is_available()),
        "GPU count": str(torch.cuda.device_count()),
        "distributed available": str(dist.is_available()),
        "NCCL": (
            ".".join(map(str, torch.cuda.nccl.version()))
            if dist.is_available() and dist.is_nccl_available()
            else "not available"
        ),
        "gloo": str(dist.is_available() and dist.is_gloo_available()),
        "attention backends": ", ".join(available_attention_backends()),
    }
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        info[f"GPU {i}"] = (
            f"{p.name}, {p.total_memory / 2**30:.1f} GiB, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs"
        )
    return info


def run(args: argparse.Namespace) -> int:
    rows = collect()
    width = max(map(len, rows))
    for k, v in rows.items():
        print(f"{k:<{width}}  {v}")
    return 0
