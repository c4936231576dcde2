"""Freed memory handed back: a no-op where the C library is not glibc, at most once a second after searches."""

from __future__ import annotations

import pytest

import aiayn.serve.memory
from aiayn.serve.memory import Trimmer, limit_heaps, return_freed_memory


def test_the_calls_run_whatever_the_c_library() -> None:
    limit_heaps()
    return_freed_memory()


def test_the_trimmer_trims_at_most_once_an_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[None] = []
    monkeypatch.setattr(aiayn.serve.memory, "return_freed_memory", lambda: trims.append(None))
    now = [100.0]
    monkeypatch.setattr(aiayn.serve.memory.time, "monotonic", lambda: now[0])
    trim = Trimmer(interval_s=1.0)
    trim(), trim()
    now[0] += 0.5
    trim()
    assert len(trims) == 1
    now[0] += 0.5
    trim()
    assert len(trims) == 2
