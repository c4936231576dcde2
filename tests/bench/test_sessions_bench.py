"""`aiayn bench --sessions`: the page server's memory read before and after fresh visitor sessions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import aiayn.bench.sessions
from aiayn.bench.process import status_mb
from aiayn.bench.sessions import measure_sessions, sessions_report


def test_resident_memory_is_read_from_proc() -> None:
    assert 1 < status_mb("VmRSS", os.getpid()) <= status_mb("VmHWM", os.getpid()) < 24 * 1024


def test_a_few_fresh_sessions_are_served_and_reported(
    bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aiayn.bench.sessions, "WARMUP", 2)
    figure = measure_sessions(bundled["en-de"], 3)
    assert figure.sessions == 3 and figure.errors == 0 and figure.rss_before_mb > 50
    assert "3 fresh sessions after 2 to warm up" in sessions_report(figure) and "(goal: ≤ 20)" in sessions_report(
        figure
    )
