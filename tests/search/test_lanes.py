"""Lanes: several batches searched at once over one engine, or one batch cut across them, give the outputs of one
lane, on real sentences; the lanes take each search's batches in turn, and a search cuts its batches only for the
lanes it finds idle (fake batches and a fake search, held by events)."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aiayn.search.translator
from aiayn.core.folder import ModelFolder
from aiayn.engines.onnx.serving.engine import ServingEngine
from aiayn.engines.placement import Placement
from aiayn.search.output import Output
from aiayn.search.translator import (
    Lanes,
    SearchSettings,
    Translator,
    busiest_lane,
    length_batches,
    split_for_lanes,
)


@pytest.mark.parametrize("beam", [1, 4])
def test_two_lanes_over_one_session_give_one_lanes_outputs(
    bundled: dict[str, Path], multi30k_dir: Path, beam: int
) -> None:
    folder = ModelFolder.open(bundled["en-de"])
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sentences = f.read().splitlines()[:120]
    engine = ServingEngine.load(folder, Placement())  # one session: both lanes run it at once
    one, two = (Translator(engine, folder.tokenizer, folder.config.max_len, 8, 4096, lanes) for lanes in (1, 2))
    ids = [one.source_ids(s) for s in sentences]
    settings = SearchSettings(beam)
    expected = one.outputs(ids, settings)
    assert two.outputs(ids, settings) == expected  # 15 batches of 8, taken by two lanes
    assert [o.tokens for o in two.outputs(ids[:1], settings)] == [expected[0].tokens]  # one batch, one lane


def test_spread_cuts_the_largest_batch_while_that_lightens_the_busiest_lane() -> None:
    assert split_for_lanes([[0, 1, 2, 3, 4]], 2) == [[0, 1, 2], [3, 4]]
    assert split_for_lanes([[0, 1, 2, 3], [4]], 4) == [[0, 1], [2, 3], [4]]  # ⌈5 / 4⌉ = 2 a lane
    assert split_for_lanes([[0], [1, 2]], 2) == [[0], [1, 2]]  # already a batch per lane
    full, short = list(range(32)), list(range(32, 40))  # a file's last batches: a full one beside a short one
    assert split_for_lanes([full, short], 2) == [full[:16], full[16:], short]
    assert split_for_lanes([full, full], 2) == [full, full]  # as many full batches as lanes: nothing to gain
    assert split_for_lanes([full + full, full[:8]], 2) == [full, full, full[:8]]  # 32 | 32 + 8, not 64 | 8
    assert split_for_lanes([full + full, full + full[:8]], 2) == [
        full + full,
        full + full[:8],
    ]  # halves would make 32 + 40
    assert split_for_lanes([[0]], 4) == [[0]]  # one sentence cannot be cut
    assert split_for_lanes([[0, 1]], 2) == [[0], [1]]
    assert split_for_lanes([[0, 1, 2, 3, 4, 5]], 3) == [[0, 1, 2], [3, 4, 5]]  # 2 | 1 | 3 on three lanes: no lighter
    lone = list(range(32))  # a lone request's batch on four lanes: every lane, not 16 | 16 on two
    assert split_for_lanes([lone], 4) == [lone[:8], lone[8:16], lone[16:24], lone[24:]]
    assert split_for_lanes([lone], 3) == [lone[:16], lone[16:]]  # 8 | 8 | 16 would be no lighter than 16 | 16
    assert split_for_lanes([], 2) == []


def test_length_batches_group_the_longest_first_within_both_caps() -> None:
    lengths = [3, 5, 1, 5, 2]  # longest first: 1, 3 (5 tokens each), 0, 4, 2
    assert length_batches(lengths, 2, 100) == [[1, 3], [0, 4], [2]]  # at most 2 sentences
    assert length_batches(lengths, 10, 10) == [[1, 3], [0, 4, 2]]  # at most 10 tokens padded to the longest: 2 × 5
    assert length_batches([4, 4, 4], 10, 11) == [[0, 1], [2]] and length_batches([4], 1, 1) == [[0]]
    assert busiest_lane([[0, 1, 2], [3], [4, 5]], 2) == 3 and busiest_lane([[0], [1], [2]], 2) == 2


@pytest.mark.parametrize("beam", [1, 4])
def test_one_batch_cut_across_two_lanes_translates_as_one_lane(
    bundled: dict[str, Path], multi30k_dir: Path, beam: int
) -> None:
    """A single batch (the page's, the JSON route's, a short file's) is halved over both lanes: the same outputs.

    What may differ, and why: a matrix product's sums depend on the rows beside them (the CPU's kernels block them
    by the batch's rows, per instruction set), so log-probabilities agree within float32 rounding, 1e-4 over a
    sentence; the tokens agree wherever no two candidates lie within that rounding of each other. Such a near-tie
    is rare but not impossible on some CPU: at most one sentence of each 32 may take the other branch of one."""
    folder = ModelFolder.open(bundled["en-de"])
    with gzip.open(multi30k_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        sentences = f.read().splitlines()[:128]
    engine = ServingEngine.load(folder, Placement(lanes=2))
    one, two = (Translator(engine, folder.tokenizer, folder.config.max_len, 64, 4096, lanes) for lanes in (1, 2))
    ids = [one.source_ids(s) for s in sentences]
    for start in range(0, len(ids), 32):
        chunk = ids[start : start + 32]
        expected, got = one.outputs(chunk, SearchSettings(beam)), two.outputs(chunk, SearchSettings(beam))
        same = [(a, b) for a, b in zip(got, expected, strict=True) if a.tokens == b.tokens]
        assert len(same) >= len(chunk) - 1
        assert max(abs(a.log_prob - b.log_prob) for a, b in same) < 1e-4


def held(order: list[str], name: str, started: threading.Semaphore, gate: threading.Event | None) -> Any:
    """A batch that notes its turn in ``order``, says it started, and holds its lane until ``gate`` opens."""

    def run() -> str:
        order.append(name)
        started.release()
        if gate is not None:
            assert gate.wait(30), "the gate never opened"
        return name

    return run


def test_the_lanes_take_each_search_in_turn_so_a_caption_does_not_wait_for_a_file() -> None:
    lanes, order, started, gate = Lanes(2), [], threading.Semaphore(0), threading.Event()
    file = lanes.run([held(order, f"file {i}", started, gate if i < 2 else None) for i in range(6)])
    for _ in range(2):  # both lanes hold the file's first two batches
        assert started.acquire(timeout=30)
    caption = lanes.run([held(order, "caption", started, None)])
    gate.set()
    assert caption[0].result(timeout=30) == "caption"
    assert [f.result(timeout=30) for f in file] == [f"file {i}" for i in range(6)]
    # After the two batches that held the lanes, at most one more of the file's before the caption's (a pool that
    # takes batches in the order they came, ``Executor.map``'s, puts it after all six).
    assert order.index("caption") <= 3 and sorted(order) == sorted([*(f"file {i}" for i in range(6)), "caption"])


def test_a_cancelled_batch_is_skipped_when_its_turn_comes() -> None:
    lanes, order, started, gate = Lanes(1), [], threading.Semaphore(0), threading.Event()
    first = lanes.run([held(order, "first", started, gate)])
    assert started.acquire(timeout=30)
    (dropped,) = lanes.run([held(order, "dropped", started, None)])
    assert dropped.cancel()
    (last,) = lanes.run([held(order, "last", started, None)])
    gate.set()
    assert first[0].result(timeout=30) == "first" and last.result(timeout=30) == "last"
    assert order == ["first", "last"]


class NoEngine:
    """What the translator asks of an engine before its search (the search itself is faked)."""

    pad_id = 0


def test_a_lone_search_fills_every_idle_lane_and_one_under_load_stays_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    lanes, searched, both = Lanes(2), [], threading.Barrier(2, timeout=30)
    monkeypatch.setattr(aiayn.search.translator, "lanes_of", lambda count: lanes)

    def search(engine: object, src: np.ndarray, max_len: object, min_len: int) -> list[Output]:
        searched.append((len(src), threading.current_thread().name))
        if len(src) < 8:
            both.wait()  # the halves are searched at once, one in each lane (else the barrier breaks)
        return [Output([int(row[0])], 0.0, True, [0.0]) for row in src]

    monkeypatch.setattr(aiayn.search.translator, "greedy_search", search)
    translator = Translator(NoEngine(), None, 100, lanes=2)  # type: ignore[arg-type]
    ids = [[i + 1, 2] for i in range(8)]
    alone = translator.outputs(ids, SearchSettings(1))
    assert [o.tokens for o in alone] == [[i + 1] for i in range(8)]
    assert sorted(n for n, _ in searched) == [4, 4]  # one length batch of 8, halved: both idle lanes take it
    assert len({lane for _, lane in searched}) == 2
    order, started, gate = [], threading.Semaphore(0), threading.Event()
    busy = lanes.run([held(order, f"other {i}", started, gate) for i in range(2)])  # others' searches hold both
    for _ in range(2):
        assert started.acquire(timeout=30)
    searched.clear()
    queue_then_open = lanes.run

    def run(batches: Any) -> Any:  # the others' batches end once this search's are queued, cut or not
        futures = queue_then_open(batches)
        gate.set()
        return futures

    monkeypatch.setattr(lanes, "run", run)
    assert translator.outputs(ids, SearchSettings(1)) == alone
    assert [f.result(timeout=30) for f in busy] == ["other 0", "other 1"]
    assert [n for n, _ in searched] == [8]  # no lane was idle: the batch stays whole (cut, it would cost more)
