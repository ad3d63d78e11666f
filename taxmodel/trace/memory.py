"""Freed memory handed back to the system between the steps of a large import or load.

Why: allocators keep what a program frees, for its own reuse. glibc's malloc keeps freed blocks
inside its heap (every array below its mmap threshold, which grows up to 32 MiB as large arrays
are freed: every column of a few million rows), and Arrow's allocator (mimalloc or jemalloc) keeps
its own pages; neither reuses what the other keeps, and the process's memory (RSS) counts both.
A 2-rank Kineto import of 2 M kernels held about 0.7 GB of freed glibc heap when it began writing
the bundle, and loading that bundle back left about 0.5 GB of freed Arrow pages. ``release_freed``
returns both at the points where a step has just freed much: what is allocated does not change,
only what the process holds.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl, Windows).
    Looked up among the symbols the process has loaded, its C library's among them (naming the
    library with ``ctypes.util.find_library("c")`` ran ``ldconfig``: 6 ms of every start)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


_TRIM = _malloc_trim()


def release_freed() -> None:
    """Hand the memory that glibc's malloc and Arrow's pool keep after frees back to the system."""
    if _TRIM is not None:
        _TRIM(0)
    pa = sys.modules.get("pyarrow")  # nothing to give back where Arrow was never used
    if pa is not None:
        pa.default_memory_pool().release_unused()
