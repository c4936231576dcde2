"""`aiayn bench --memory`: a few requests of each kind on a real `aiayn serve` process, read back as the report."""

from __future__ import annotations

from pathlib import Path

import pytest

import aiayn.bench.memory
from aiayn.bench.memory import measure_memory, memory_report, request_text

SOURCES = {
    "en-de": ["Two dogs play in the snow.", "A girl jumps into the pool.", "A black cat sleeps on the sofa."],
    "de-en": ["Zwei Hunde spielen im Schnee.", "Ein Mädchen springt in den Pool.", "Eine Katze schläft."],
}


def test_requests_take_turns_over_directions_and_beams() -> None:
    asked = [request_text(SOURCES, n) for n in range(4)]
    assert [(direction, beam) for _, direction, beam in asked] == [
        ("en-de", 4),
        ("de-en", 4),
        ("en-de", 1),
        ("de-en", 1),
    ]
    assert "\n" in request_text(SOURCES, 3)[0] and ", and " in request_text(SOURCES, 3)[0]  # a paragraph


def test_a_few_requests_are_served_and_reported(bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiayn.bench.memory, "REQUESTS", 24)
    monkeypatch.setattr(aiayn.bench.memory, "MARKS", (12, 24))
    figure = measure_memory(SOURCES)  # request 0, 10 and 20 ask for the heatmap too; 3, 7, ... go to /v1/translate
    assert figure.errors == 0 and list(figure.after_mb) == [12, 24] and figure.peak_mb >= figure.ready_mb > 50
    assert "MiB after 12, " in memory_report(figure) and "MiB after 24 requests, peak" in memory_report(figure)
