"""Concurrent requests searched together answer exactly as the same requests one at a time."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiayn.engines.options import EngineOptions
from aiayn.search.output import Output
from aiayn.search.translator import SearchSettings
from aiayn.serve.batching import SearchBatcher
from aiayn.serve.service import TranslationService

SENTENCES = [
    "Two dogs play in the snow.",
    "A man in a red shirt is riding a bike down the street.",
    "Children are playing soccer on a green field.",
    "A woman sits on a bench and reads a book.",
    "The old man is selling vegetables at the market.",
    "A group of people stand in front of a building.",
    "A girl jumps into the pool.",
    "Three musicians play guitars on a stage.",
    "A black cat sleeps on the sofa.",
    "A boy in a blue jacket climbs a tree.",
    "Two women are talking in a cafe.",
    "A dog runs along the beach with a stick.",
    "People are waiting for the train.",
    "A chef prepares food in a busy kitchen.",
    "A small child eats an ice cream.",
    "Workers repair the road.",
]


@pytest.mark.parametrize("beam", [1, 4])
def test_sixteen_visitors_at_once_get_their_one_at_a_time_answers(bundled: dict[str, Path], beam: int) -> None:
    service = TranslationService(EngineOptions(device="cpu"))
    model = service.model("en-de")
    alone = [model.run(model.prepare(s), beam).text for s in SENTENCES]
    with ThreadPoolExecutor(len(SENTENCES)) as pool:
        together = list(pool.map(lambda s: service.translate(s, "en-de", beam).text, SENTENCES))
    assert together == alone
    assert together[0] == "Zwei Hunde spielen im Schnee."


class Failing:
    lanes = 2

    def outputs(self, src_ids: object, settings: object, wanted: object) -> list[object]:
        raise ValueError("engine broke")


def test_an_error_reaches_every_waiting_request_and_the_worker_goes_on() -> None:
    batcher = SearchBatcher(Failing())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine broke"):
        batcher.outputs([[5, 3]], SearchSettings())
    with pytest.raises(ValueError, match="engine broke"):
        batcher.outputs([[6, 3]], SearchSettings())
    assert batcher.outputs([], SearchSettings()) == []


FILE, CAPTION = 7, 8  # the first token of a long file's sentences, of a caption's


class HeldFiles:
    """A translator of two lanes whose searches of a file hold their worker until ``gate`` opens."""

    lanes = 2

    def __init__(self) -> None:
        self.gate, self.started = threading.Event(), threading.Semaphore(0)

    def outputs(self, src_ids: list[list[int]], settings: object, wanted: object) -> list[Output]:
        if src_ids[0][0] == FILE:
            self.started.release()
            assert self.gate.wait(30), "the gate never opened"
        return [Output(ids[:1], 0.0, True, [0.0]) for ids in src_ids]


def test_a_caption_is_searched_while_two_files_are_searched() -> None:
    """As many long searches as lanes (two visitors' files) still leave a worker to take a caption into a search of
    its own, whose batch the lanes take in turn (tests/search/test_lanes.py), not after both files."""
    translator = HeldFiles()
    batcher = SearchBatcher(translator)  # type: ignore[arg-type]
    files = []
    for _ in range(2):  # each file taken by a worker of its own, which it holds
        files.append(batcher.submit([[FILE, 3]] * 40, SearchSettings()))
        assert translator.started.acquire(timeout=30)
    caption = batcher.submit([[CAPTION, 3]], SearchSettings())
    assert caption.result(timeout=30) == [Output([CAPTION], 0.0, True, [0.0])]  # while both files still search
    assert not any(file.done() for file in files)
    translator.gate.set()
    assert all(file.result(timeout=30) == [Output([FILE], 0.0, True, [0.0])] * 40 for file in files)
