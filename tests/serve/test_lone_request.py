"""A request alone on the server is searched whole: its sentences go into one search, which the translator then
spreads over the idle lanes (``search/translator.py``, ``split_for_lanes``; tests/search/test_lanes.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from aiayn.search.translator import SearchSettings, Translator
from aiayn.serve.service import LoadedModel, Prepared, TranslationService

SENTENCES = [
    "Two dogs play in the snow.",
    "A man in a red shirt is riding a bike down the street.",
    "Children are playing soccer on a green field.",
    "A woman sits on a bench and reads a book.",
    "A girl jumps into the pool.",
    "Three musicians play guitars on a stage.",
    "A black cat sleeps on the sofa.",
    "Workers repair the road.",
]


def test_a_lone_requests_sentences_are_searched_in_one_search(
    bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = TranslationService(device="cpu")
    model = service.model("en-de")
    alone = [service.translate(s, "en-de", 4).text for s in SENTENCES]
    searched: list[int] = []
    search = Translator.outputs

    def outputs(self: Translator, src_ids: Sequence[Sequence[int]], settings: SearchSettings, *args: Any) -> Any:
        searched.append(len(src_ids))
        return search(self, src_ids, settings, *args)

    def slow_prepare(self: LoadedModel, text: str | list[str]) -> Prepared:
        time.sleep(0.02)  # a long text takes a while to cut: the batcher's worker is awake before the next is cut
        return cut(self, text)

    cut = LoadedModel.prepare
    monkeypatch.setattr(model.translator, "outputs", outputs.__get__(model.translator))
    monkeypatch.setattr(LoadedModel, "prepare", slow_prepare)
    results = service.translate_many([(s, "en-de", 4) for s in SENTENCES])
    assert searched == [len(SENTENCES)]  # one search, not the first sentence alone and then the rest
    assert [r.text for r in results] == alone
