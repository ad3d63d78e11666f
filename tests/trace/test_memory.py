"""Freed memory handed back between the steps of an import (``trace/memory.py``)."""
from __future__ import annotations

import platform

import pytest

from taxmodel.trace import memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_malloc_trim_is_found_among_the_loaded_symbols():
    assert memory._TRIM is not None and memory._TRIM(0) in (0, 1)
    memory.release_freed()
