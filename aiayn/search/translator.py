"""Text in, text out over any engine: tokenize, batch by length, search, detokenize. NumPy only.

Lanes: an engine that runs several searches at once on one copy of its weights (ONNX Runtime's ``run``
releases the GIL; each batch binds its own buffers) takes ``lanes`` length batches at a time, one per
thread (``Lanes``). The lanes are shared fairly and used fully: a search alone has its batches cut where that
lightens the busiest of the lanes idle at its start (``split_for_lanes``), so a lone request fills every idle lane;
and the lanes take the waiting batches of every search in turn, one batch of each search at a time, so a search
of many batches (a long file) holds no more than its share while another's caption waits. A sentence's search does
not depend on the sentences batched with it, so the outputs do not depend on the lanes, their number or their turns.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Protocol, Self, TypeVar

import numpy as np

from aiayn.search.beam import LENGTH_NORMALIZATIONS, Hypothesis, beam_search, beam_search_nbest
from aiayn.search.greedy import EXTRA_LEN, greedy_search
from aiayn.search.output import Output
from aiayn.search.step import StepModel

# A length batch holds at most this many sentences and this many padded source tokens.
LENGTH_BATCH_SENTENCES, LENGTH_BATCH_TOKENS = 64, 4096


T = TypeVar("T")

MAX_BEAM = 8  # the widest beam a user may ask for: the page's slider, --beam, the JSON route
SHOWN_CHARS = 40  # of a refused value in its message


class TextCodec(Protocol):
    def encode_source(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HasSearchDefaults(Protocol):
    """A model folder, as far as the search is concerned (``core.folder.ModelFolder``)."""

    def search_defaults(self) -> dict[str, Any]: ...


def beam_size_of(value: object) -> int:
    """A beam size as a user, a request or a folder gave it: a whole number from 1 to ``MAX_BEAM`` (2.0 is 2), else
    one message for every way it can be wrong (text, None, 2.7, 0, 9)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 1 <= value <= MAX_BEAM  # first: a huge integer has no float, NaN is never in range
        or not float(value).is_integer()
    ):
        raise ValueError(f"beam size must be a whole number from 1 to {MAX_BEAM}, got {shown(value)}")
    return int(value)


def shown(value: object) -> str:
    """A refused value as its message names it: its ``repr``, cut at ``SHOWN_CHARS`` (an integer too long to write
    out, by its size)."""
    if isinstance(value, int) and abs(value) >= 10**SHOWN_CHARS:
        return f"a whole number of more than {SHOWN_CHARS} digits"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


@dataclass(frozen=True)
class SearchSettings:
    """§6.1: beam 4, length penalty α = 0.6, output at most input length + 50. Beam 1 is greedy.
    An imported checkpoint brings its own beam and normalisation (``power``: Hugging Face's |Y|^α).
    ``min_len`` and ``max_len`` bound every output whatever its input (CTranslate2's min_decoding_length and
    max_decoding_length); equal, they fix its length, as the bench's random base-size model needs."""

    beam_size: int = 4
    length_penalty: float = 0.6
    max_extra_len: int = EXTRA_LEN
    length_normalization: str = "gnmt"  # one of beam.LENGTH_NORMALIZATIONS
    min_len: int = 0
    max_len: int | None = None
    n_best: int = 1  # outputs kept per sentence, the best and its ``others``: at most the beam's size

    def __post_init__(self) -> None:
        beam_size_of(self.beam_size)
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"n_best must be from 1 to the beam size {self.beam_size}, got {self.n_best}")
        if self.length_normalization not in LENGTH_NORMALIZATIONS:
            raise ValueError(
                f"length normalization {self.length_normalization!r} is not one of {', '.join(LENGTH_NORMALIZATIONS)}"
            )
        if self.max_extra_len < 1:
            raise ValueError(f"max_extra_len must be at least 1, got {self.max_extra_len}")
        if self.min_len < 0:
            raise ValueError(f"min_len must be at least 0, got {self.min_len}")
        if self.max_len is not None and self.max_len < max(1, self.min_len):
            raise ValueError(f"max_len must be at least 1 and at least min_len ({self.min_len}), got {self.max_len}")

    @classmethod
    def of(cls, folder: HasSearchDefaults, **changes: Any) -> Self:
        """``folder``'s decoding defaults (its length penalty, if tuned on val; an imported checkpoint's beam and
        normalisation), then ``changes``: a change of None is the folder's default."""
        return cls(**{**folder.search_defaults(), **{k: v for k, v in changes.items() if v is not None}})


def with_others(hypotheses: list[Hypothesis]) -> Output:
    """A sentence's n-best as one output: the best, the rest its ``others`` (none found: empty, as ``beam_search``)."""
    if not hypotheses:
        return Output([], -np.inf, False, [])
    return replace(hypotheses[0], others=tuple(hypotheses[1:]))


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> np.ndarray:
    """Right-pad token id lists into one (batch, max_len) int64 array."""
    batch = np.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return batch


def length_batches(lengths: Sequence[int], max_sentences: int, max_tokens: int) -> list[list[int]]:
    """Indices grouped by similar length (longest first), capped by sentences and padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if (
            batches
            and len(batches[-1]) < max_sentences
            and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= max_tokens
        ):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def busiest_lane(batches: list[list[int]], lanes: int) -> int:
    """The sentences of the busiest lane when the pool hands ``batches`` out in order, each to the lane free first."""
    loads = [0] * lanes
    for batch in batches:
        loads[loads.index(min(loads))] += len(batch)
    return max(loads)


def split_for_lanes(batches: list[list[int]], lanes: int) -> list[list[int]]:
    """``batches`` with the largest halved (its two halves stay similar in length) for as long as that lightens the
    busiest lane: a single batch, or a full one beside a short one, no longer leaves a core waiting, while batches
    that already keep every lane busy stay whole. While a lane is idle, a cut that gains nothing yet is kept if the
    next ones gain: a lone request's batch of 32 on four lanes becomes four of 8 (16 | 16, then 8 | 8 | 16 on three
    lanes, then 8 | 8 | 8 | 8), not 16 | 16 on two. A sentence's search does not depend on its batch, so the outputs
    stay the same."""
    batches, busiest = list(batches), busiest_lane(batches, lanes)
    while (lighter := lighter_cut(batches, busiest, lanes)) is not None:
        batches, busiest = lighter, busiest_lane(lighter, lanes)
    return batches


def lighter_cut(batches: list[list[int]], busiest: int, lanes: int) -> list[list[int]] | None:
    """``batches`` with their largest halved, again while a lane is idle, until that lightens the busiest lane
    (None: it does not)."""
    cut = batches
    while (largest := max(cut, key=len, default=[])) and len(largest) > 1:
        at, half = cut.index(largest), (len(largest) + 1) // 2
        cut = [*cut[:at], largest[:half], largest[half:], *cut[at + 1 :]]
        if busiest_lane(cut, lanes) < busiest:
            return cut
        if len(cut) >= lanes:
            return None  # no idle lane left for a later cut to use
    return None


class Lanes:
    """``count`` threads that search length batches: the batches of every search waiting are taken in turn, one of
    each search at a time (round-robin), a search with batches left going to the back of the line. A caption's
    single batch thus waits for at most one batch of each search ahead of it, never for a whole file's."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.turns: deque[deque[Callable[[], None]]] = deque()  # each search's batches not yet started, in turn
        self.busy = 0  # lanes searching a batch now
        self.changed = threading.Condition()
        self.threads: list[threading.Thread] = []

    def idle(self) -> int:
        """The lanes a search started now would find free: none busy and no batch waiting for them."""
        with self.changed:
            return max(0, self.count - self.busy - sum(map(len, self.turns)))

    def run(self, batches: Sequence[Callable[[], T]]) -> list[Future[T]]:
        """Each of one search's ``batches`` searched when its turn comes; a future per batch, in order (a
        cancelled future's batch is skipped)."""
        futures: list[Future[T]] = [Future() for _ in batches]
        if not batches:
            return futures
        with self.changed:
            self.turns.append(deque(settled(future, batch) for future, batch in zip(futures, batches, strict=True)))
            while len(self.threads) < self.count:
                thread = threading.Thread(target=self.serve, name=f"aiayn-lane_{len(self.threads)}", daemon=True)
                thread.start()
                self.threads.append(thread)
            self.changed.notify(len(batches))
        return futures

    def serve(self) -> None:
        while True:
            with self.changed:
                while not self.turns:
                    self.changed.wait()
                waiting = self.turns.popleft()
                batch = waiting.popleft()
                if waiting:
                    self.turns.append(waiting)  # its next batch after one of every other search's
                self.busy += 1
            try:
                batch()
            finally:
                with self.changed:
                    self.busy -= 1


def settled(future: Future[T], batch: Callable[[], T]) -> Callable[[], None]:
    """``batch`` run into ``future``, unless the future was cancelled before its turn."""

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(batch())
        except BaseException as err:  # handed to the waiting caller, which raises it in its own thread
            future.set_exception(err)

    return run


@functools.cache
def lanes_of(count: int) -> Lanes:
    """The process's ``count`` lanes, shared by every translator (a page serving two models, its batcher's
    workers): the lanes are the cores, so at most ``count`` batches run at once however many models and callers."""
    return Lanes(count)


# Threads do not survive a fork: a process forked after a search (a server's worker, a test runner's) makes its own
# lanes (each search asks for them) instead of waiting forever on the parent's.
os.register_at_fork(after_in_child=lanes_of.cache_clear)


class Translator:
    """Runs the one search over an engine; the PyTorch and ONNX paths differ only in ``engine``."""

    def __init__(
        self,
        engine: StepModel[Any],
        tokenizer: TextCodec,
        max_src_len: int,
        max_sentences: int = LENGTH_BATCH_SENTENCES,
        max_tokens: int = LENGTH_BATCH_TOKENS,
        lanes: int = 1,
    ) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_src_len = max_src_len
        self.max_sentences = max_sentences
        self.max_tokens = max_tokens
        self.lanes = lanes

    def source_ids(self, text: str) -> list[int]:
        """Subwords of ``text`` followed by </s>, as in training; refuses a sentence over the model's limit."""
        ids = self.tokenizer.encode_source(text)
        if len(ids) > self.max_src_len:
            raise ValueError(
                f"a sentence of {len(ids)} tokens is longer than this model's limit of {self.max_src_len}; "
                "split it into shorter sentences"
            )
        return ids

    def outputs(
        self,
        src_ids: Sequence[Sequence[int]],
        settings: SearchSettings,
        on_batch: Callable[[int], object] | None = None,
        wanted: Callable[[], bool] | None = None,
    ) -> list[Output]:
        """The search's output (ids and log-probability) for each source id list; ``on_batch(n)`` reports progress.
        Where ``wanted()`` says False before a length batch starts, that batch is not searched (its outputs empty):
        nobody waits for them any more."""
        outputs: list[Output] = [Output([], 0.0, False, [])] * len(src_ids)
        lanes = lanes_of(self.lanes) if self.lanes > 1 else None  # one lane: the caller's thread
        batches = length_batches([len(s) for s in src_ids], self.max_sentences, self.max_tokens)
        if lanes is not None:
            batches = split_for_lanes(batches, max(1, lanes.idle()))

        def search(batch: list[int]) -> list[Output]:
            if wanted is not None and not wanted():
                return [outputs[i] for i in batch]
            padded = pad_batch([src_ids[i] for i in batch], self.engine.pad_id)
            max_len = (padded != self.engine.pad_id).sum(axis=1) + settings.max_extra_len  # (batch,)
            if settings.max_len is not None:
                max_len = np.minimum(max_len, settings.max_len)
            if settings.beam_size == 1:
                return greedy_search(self.engine, padded, max_len, settings.min_len)
            search_args = (settings.beam_size, settings.length_penalty, max_len, settings.length_normalization)
            if settings.n_best == 1:
                return beam_search(self.engine, padded, *search_args, settings.min_len)
            best = beam_search_nbest(self.engine, padded, *search_args, settings.min_len)  # the same search
            return [with_others(hyps[: settings.n_best]) for hyps in best]

        if lanes is None:
            searched: Iterable[list[Output]] = map(search, batches)
        else:
            futures = lanes.run([functools.partial(search, batch) for batch in batches])
            searched = (future.result() for future in futures)
        for batch, results in zip(batches, searched, strict=True):
            for i, result in zip(batch, results, strict=True):
                outputs[i] = result
            if on_batch is not None:
                on_batch(len(batch))
        return outputs

    def translate_ids(
        self,
        src_ids: Sequence[Sequence[int]],
        settings: SearchSettings,
        on_batch: Callable[[int], object] | None = None,
    ) -> list[list[int]]:
        """Output ids (no <s>, </s>) for each source id list; ``on_batch(n)`` reports progress."""
        return [output.tokens for output in self.outputs(src_ids, settings, on_batch)]

    def translate(
        self,
        texts: Sequence[str],
        settings: SearchSettings = SearchSettings(),
        on_batch: Callable[[int], object] | None = None,
    ) -> list[str]:
        """Translate sentences; an empty or blank one gives an empty translation."""
        wanted = [i for i, text in enumerate(texts) if text.strip()]
        out_ids = self.translate_ids([self.source_ids(texts[i]) for i in wanted], settings, on_batch)
        translations = [""] * len(texts)
        for i, ids in zip(wanted, out_ids, strict=True):
            translations[i] = self.tokenizer.decode(ids)
        return translations
