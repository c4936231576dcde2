"""A request alone on the server is searched whole: its sentences go into one search, which the translator then
spreads over the idle lanes (``search/translator.py``, ``split_for_lanes``; tests/search/test_lanes.py)."""

from __future__ import annotations

import gzip
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from aiayn.engines.options import EngineOptions
from aiayn.search.translator import SearchSettings, Translator
from aiayn.serve.service import LoadedModel, Prepared, TranslationService


def test_a_lone_requests_sentences_are_searched_in_one_search(
    bundled: dict[str, Path], multi30k_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sentences = f.read().splitlines()[:8]
    service = TranslationService(EngineOptions(device="cpu"))
    model = service.model("en-de")
    alone = [service.translate(s, "en-de", 4).text for s in sentences]
    pieces = sum(len(model.prepare(s).src_ids) for s in sentences)  # a long caption is searched clause by clause
    searched: list[int] = []
    search = Translator.outputs

    def outputs(
        self: Translator, src_ids: Sequence[Sequence[int]], settings: SearchSettings, *args: Any, **kwargs: Any
    ) -> Any:
        searched.append(len(src_ids))
        return search(self, src_ids, settings, *args, **kwargs)

    def slow_prepare(self: LoadedModel, text: str | list[str]) -> Prepared:
        time.sleep(0.02)  # a long text takes a while to cut: the batcher's worker is awake before the next is cut
        return cut(self, text)

    cut = LoadedModel.prepare
    monkeypatch.setattr(model.translator, "outputs", outputs.__get__(model.translator))
    monkeypatch.setattr(LoadedModel, "prepare", slow_prepare)
    results = service.translate_many([(s, "en-de", 4) for s in sentences])
    assert searched == [pieces]  # one search, not the first sentence alone and then the rest
    assert [r.text for r in results] == alone
