"""The page server's memory: malloc's heaps bounded and trimmed (no-ops without glibc), matplotlib's backend named."""

from __future__ import annotations

import os

import pytest

import aiayn.serve.memory
from aiayn.serve.memory import Trimmer, bound_server_memory, return_freed_memory


def test_the_calls_run_whatever_the_c_library_and_name_matplotlibs_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MPLBACKEND", raising=False)  # put back as it was after the test
    bound_server_memory()
    return_freed_memory()
    assert os.environ["MPLBACKEND"] == "agg"


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
