"""Large temporaries of a training step reuse the heap instead of fresh pages from the kernel.

glibc's malloc serves a block above its mmap threshold (at most 32 MB, adjusted at run time) with a new mapping
and unmaps it on free, so a step that allocates the same tens-of-MB tensors every time (ASTRA's classifier rows and
their gradient: 20,000 x 769 floats, 68 MB) pays a page fault per 4 KB on every step: 21 ms for each such tensor
against 8 ms to fill a reused one, measured on this project's CPU machine. Raising the mmap and trim thresholds
keeps freed blocks in the heap for the next step (what PyTorch's CPU tuning guide gets from jemalloc or tcmalloc).
The price is resident memory: up to ``keep_bytes`` of freed heap is not returned to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys
from typing import Any

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters (malloc.h)
_done = False


def _glibc_function(name: str) -> Any:
    """glibc's function ``name``, or None where the C library is not glibc (or the platform not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def reuse_freed_memory(keep_bytes: int = 1 << 30) -> bool:
    """Blocks up to ``keep_bytes`` come from the heap and up to ``keep_bytes`` of free heap top is kept; once per
    process. A no-op (False) where malloc is not glibc's."""
    global _done
    if _done:
        return True
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    value = ctypes.c_int(min(int(keep_bytes), 2**31 - 1))
    _done = bool(mallopt(_M_MMAP_THRESHOLD, value)) and bool(mallopt(_M_TRIM_THRESHOLD, value))
    if not _done:
        log.debug("mallopt refused the thresholds; freed blocks go back to the system")
    return _done


def release_freed_memory() -> bool:
    """Collect reference cycles and give the heap's free memory back to the system (glibc's ``malloc_trim``).

    Called when a training ends (``xmc.methods.harness.train_run``): the raised thresholds above would otherwise keep a
    finished run's freed tables resident, so a process that trains run after run (a notebook, ``bench.seed_study``)
    held the sum of them (a 7-seed ASTRA study reached 24 GB over 19 trainings and was killed) instead of one
    run's. False where malloc is not glibc's, or nothing was returned."""
    gc.collect()
    trim = _glibc_function("malloc_trim")
    return bool(trim(0)) if trim is not None else False

