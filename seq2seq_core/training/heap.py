"""Freed memory handed back to the operating system after validation's search.

glibc's malloc keeps the memory of freed tensors for reuse instead of returning it, so a
training process that searches (validation, the test decode) holds the search's key/value
caches on top of its training heap: the run's peak becomes their sum. `release` asks glibc
(`malloc_trim`) to return what is free; elsewhere (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache


@lru_cache(maxsize=1)
def _trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release() -> None:
    """Return the free memory of the heap to the operating system (glibc only)."""
    trim = _trim()
    if trim is not None:
        trim(0)
