"""The page server's memory: freed memory handed back to the system, where glibc's malloc would keep it.

glibc keeps what a process frees for its next allocations, in one heap ("arena") per thread that allocated,
up to eight per core: a page server whose many threads (Gradio's, ONNX Runtime's, the batchers') each touched
a few large batches keeps all those heaps resident, and building the serving graphs at start (tens of MiB,
freed at once) leaves holes that are never given back either. So the service asks for at most
``MALLOC_ARENAS`` heaps before its threads start, and returns the free pages of every heap after a model loads
and after a search (at most once every ``TRIM_EVERY_S``: a trim takes ~2 ms, 10% of a small batch's search).
Elsewhere than glibc (macOS, musl) these are no-ops. And Gradio asks matplotlib (where it is installed, as
with the ``[train]`` extra) for its backend around every event, which imports pyplot (+15 MiB) unless a backend
is named: the server names Agg. docs/speed.md, Memory, has the figures.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from functools import cache
from typing import Any

M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h
MALLOC_ARENAS = 2  # the heaps of a page server with any number of threads (docs/speed.md, Memory)
TRIM_EVERY_S = 1.0


@cache
def glibc() -> Any | None:
    """The C library, if it is glibc (the only one with ``malloc_trim``), else None."""
    name = ctypes.util.find_library("c")
    try:
        library = ctypes.CDLL(name)
    except OSError:
        return None
    return library if hasattr(library, "malloc_trim") and hasattr(library, "mallopt") else None


def bound_server_memory() -> None:
    """At most ``MALLOC_ARENAS`` malloc heaps for the whole process, and matplotlib's backend named; call it
    before threads start."""
    os.environ.setdefault("MPLBACKEND", "agg")
    library = glibc()
    if library is not None:
        library.mallopt(M_ARENA_MAX, MALLOC_ARENAS)


def return_freed_memory() -> None:
    """The free pages of every malloc heap back to the system (well under a millisecond when little is free)."""
    library = glibc()
    if library is not None:
        library.malloc_trim(0)


class Trimmer:
    """``return_freed_memory`` at most once every ``interval_s`` however often it is called."""

    def __init__(self, interval_s: float = TRIM_EVERY_S) -> None:
        self.interval_s = interval_s
        self.trimmed_at = float("-inf")

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self.trimmed_at >= self.interval_s:
            self.trimmed_at = now
            return_freed_memory()
