"""``torch.profiler`` without its native start/stop lines.

Kineto prints ``profiler_start`` / ``profiler_stop`` (and, on some builds, stage) lines straight to the
process's stderr file descriptor, which no Python logging setting reaches. :func:`quiet_profile`
silences file descriptor 2 only while the profiler starts and stops, so a command's normal output
stays clean and any error raised by the profiled code itself is still printed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null for the block (C++ logging included); keep blocks short."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def quiet_profile(**kwargs) -> Iterator[torch.profiler.profile]:
    """``with quiet_profile(activities=..., profile_memory=True) as prof:`` like ``torch.profiler.profile``."""
    prof = torch.profiler.profile(**kwargs)
    with native_stderr_silenced():
        prof.start()
    try:
        yield prof
    finally:
        with native_stderr_silenced():
            prof.stop()
