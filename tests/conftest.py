"""Test configuration: GPU tests carry the ``gpu`` (or ``multigpu``) marker and are skipped where
there is no CUDA device (CI is CPU-only)."""

from __future__ import annotations

import os

import pytest
import torch

# Small thread count: CI has 2 cores, and distributed tests run several processes at once.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
if not torch.cuda.is_available():
    # Without a GPU the Triton kernels run through the interpreter, chosen when a kernel module is imported: set
    # here, before any test imports one, so that any subset of the tests runs as the whole suite does (the flash
    # test modules also set it, for runs outside pytest's conftest).
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA GPUs")
    for item in items:
        if "multigpu" in item.keywords and n_gpus < 2:
            item.add_marker(skip_multi)
        elif "gpu" in item.keywords and n_gpus < 1:
            item.add_marker(skip_gpu)


@pytest.fixture
def seed():
    """A fresh seed per test run (printed on failure), so inputs are new random draws each time."""
    s = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    print(f"seed={s}")
    return s
