"""A page search has the JSON route's time limit (``Limits.request_timeout_s``, `--request-timeout`): past it, the
request gets its refusal line and its search stops before its next length batch, since nobody waits for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from aiayn.engines.options import EngineOptions
from aiayn.search.output import Output
from aiayn.serve import metrics
from aiayn.serve.downloads import Downloads
from aiayn.serve.limits import Limits
from aiayn.serve.page import Handlers
from aiayn.serve.requests import directions
from aiayn.serve.service import TimedOut, TranslationService

PAST = "not answered within 0.2 s"


class EndlessSearch:
    """A translator's ``outputs`` that goes on, length batch after length batch, while anybody waits for it."""

    def __init__(self) -> None:
        self.stopped = threading.Semaphore(0)  # released by each search that saw nobody wait any more

    def __call__(
        self,
        src_ids: Sequence[Sequence[int]],
        settings: object,
        on_batch: object = None,
        wanted: Callable[[], bool] | None = None,
    ) -> list[Output]:
        for _ in range(3000):  # 30 s at most: without a time limit, the request is answered after them
            if wanted is not None and not wanted():
                self.stopped.release()
                break
            time.sleep(0.01)  # one length batch
        return [Output([], 0.0, False, [])] * len(src_ids)


@pytest.fixture(scope="module")
def service(bundled: dict[str, Path]) -> TranslationService:
    service = TranslationService(EngineOptions(device="cpu"))
    service.model("en-de")
    return service


def test_a_page_request_past_its_time_is_told_so_and_its_search_stops(
    service: TranslationService, monkeypatch: pytest.MonkeyPatch
) -> None:
    search = EndlessSearch()
    monkeypatch.setattr(service.model("en-de").translator, "outputs", search)
    monkeypatch.setattr(metrics.RECORDER, "metrics", counted := metrics.Metrics())
    page = Handlers(service, directions(dict(service.models)), Downloads(), Limits(request_timeout_s=0.2))
    texts, statuses = page.translate(["Two dogs play in the snow."], ["en-de"], [4])
    assert (texts, statuses) == ([""], [f"not translated: {PAST}"])
    assert search.stopped.acquire(timeout=30)  # its search stopped: nobody waits for it
    assert counted.registry.get_sample_value("aiayn_refusals_total", {"reason": "timeout"}) == 1  # counted once


@pytest.mark.parametrize("ask", ["file", "attention", "marks"])
def test_a_page_file_heatmap_or_marks_past_its_time_stops_its_search(
    service: TranslationService, monkeypatch: pytest.MonkeyPatch, ask: str
) -> None:
    search = EndlessSearch()
    monkeypatch.setattr(service.model("en-de").translator, "outputs", search)
    text, asked = "Two dogs play in the snow.\nA cat sleeps.", service.translate_file
    calls: dict[str, Callable[[], Any]] = {
        "file": lambda: asked(text, "en-de", 4, 0.2),
        "attention": lambda: service.attention(text, "en-de", 4, 0.2),
        "marks": lambda: service.translate(text, "en-de", 4, 0.2),
    }
    with pytest.raises(TimedOut, match=f"^{PAST}$"):
        calls[ask]()
    assert search.stopped.acquire(timeout=30)
    page = Handlers(service, directions(dict(service.models)), Downloads(), Limits(request_timeout_s=0.2))
    if ask == "attention":  # the page shows no heatmap rather than an error
        assert page.show_attention(text, "en-de", 4, "mean")[0] is None
    elif ask == "marks":
        assert page.show_marks(text, "en-de", 4) == []
