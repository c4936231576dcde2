"""Visitors searched together: concurrent requests share one search instead of queueing for the engine.

A decoding step costs nearly the same for 1 row as for 16 on a CPU (the
per-node overhead of ONNX Runtime dominates small batches), so the service
hands every request's source ids to worker threads; a worker takes all requests waiting at that moment, searches
their sentences as one search (grouped by search settings), and gives each request its own outputs back. Nothing
waits on purpose: a lone request starts at once, its length batches cut across every idle lane, and the ones that
arrive meanwhile form the next search. The workers are one more than the translator's lanes (of two or more; one
lane, a GPU's, has one worker, in whose thread its searches run): while every lane
searches other requests' batches (two long files), a new request is still taken into a search of its own, whose
batches take their turn in the lanes (``search.translator.Lanes``), one of each search at a time, instead of waiting
for those files to end. The search of a sentence does not depend on its batch, so answers equal one-at-a-time
answers (tested).

A caller that stops waiting (a time limit: the JSON route's, the page's) cancels its futures: a job still queued is
never searched, and a search whose every job was cancelled stops before its next length batch, so that it keeps no
lane from others.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from aiayn.search.output import Output
from aiayn.search.translator import SearchSettings, Translator
from aiayn.serve import metrics
from aiayn.serve.limits import SENTENCES_PER_SEARCH
from aiayn.serve.memory import Trimmer

# The searches' arrays handed back (else kept by malloc at the size of the largest batch): one trimmer for every
# batcher, so a page serving several models still trims at most once a second.
TRIM = Trimmer()


@dataclass
class PendingSearch:
    """One caller's sentences waiting for a search, and where their outputs go."""

    src_ids: Sequence[Sequence[int]]
    settings: SearchSettings
    done: Future[list[Output]] = field(default_factory=Future)


class SearchBatcher:
    """``Translator.outputs`` for many threads at once, searched together by worker threads (one more than the
    translator's lanes, where it has several)."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self.pending: queue.SimpleQueue[list[PendingSearch]] = queue.SimpleQueue()  # each item: one caller's jobs
        self.workers: list[threading.Thread] = []
        # One lane (a GPU's) searches in its worker's own thread: a second worker would run a second search on it.
        self.most_workers = translator.lanes + 1 if translator.lanes > 1 else 1
        self.lock = threading.Lock()

    def outputs(self, src_ids: Sequence[Sequence[int]], settings: SearchSettings) -> list[Output]:
        """The outputs of ``src_ids`` as ``Translator.outputs`` gives them, searched with other requests'."""
        return self.submit(src_ids, settings).result()

    def submit(self, src_ids: Sequence[Sequence[int]], settings: SearchSettings) -> Future[list[Output]]:
        """``outputs`` without waiting: a caller with several jobs hands them all in before it waits."""
        return self.submit_all([(src_ids, settings)])[0]

    def submit_all(
        self, searches: Sequence[tuple[Sequence[Sequence[int]], SearchSettings]]
    ) -> list[Future[list[Output]]]:
        """``submit`` for several jobs at once (a request's sentences): queued as one item, so that a worker takes
        them all into one search, however soon it wakes."""
        jobs = [PendingSearch(src_ids, settings) for src_ids, settings in searches]
        for job in jobs:
            if not job.src_ids:
                job.done.set_result([])
        waiting = [job for job in jobs if job.src_ids]
        if waiting:
            self.pending.put(waiting)
            self.start()
        return [job.done for job in jobs]

    def start(self) -> None:
        with self.lock:
            while len(self.workers) < self.most_workers:
                worker = threading.Thread(target=self.serve, name=f"aiayn-search-{len(self.workers)}", daemon=True)
                worker.start()
                self.workers.append(worker)

    def serve(self) -> None:
        while True:
            jobs = wanted(self.pending.get())
            while sum(len(job.src_ids) for job in jobs) < SENTENCES_PER_SEARCH and not self.pending.empty():
                jobs += wanted(self.pending.get())
            for settings in dict.fromkeys(job.settings for job in jobs):
                self.search([job for job in jobs if job.settings == settings], settings)
            TRIM()

    def search(self, jobs: list[PendingSearch], settings: SearchSettings) -> None:
        """One search over the sentences of ``jobs``; each job gets its own slice of the outputs (or the error). It
        stops early once every job is cancelled."""

        def awaited() -> bool:
            return not all(job.done.cancelled() for job in jobs)

        sentences = [ids for job in jobs for ids in job.src_ids]
        started = time.perf_counter()
        try:
            outputs = self.translator.outputs(sentences, settings, wanted=awaited)
        except Exception as err:  # handed to the waiting requests, which raise it in their own threads
            for job in jobs:
                answer(job.done.set_exception, err)
            return
        metrics.searched(len(sentences), time.perf_counter() - started)
        start = 0
        for job in jobs:
            answer(job.done.set_result, outputs[start : start + len(job.src_ids)])
            start += len(job.src_ids)


def wanted(jobs: list[PendingSearch]) -> list[PendingSearch]:
    """The jobs whose callers still wait for them."""
    return [job for job in jobs if not job.done.cancelled()]


def answer(setter: Callable[[Any], None], value: Any) -> None:
    """A job's result or error, unless its caller cancelled it meanwhile."""
    try:
        setter(value)
    except InvalidStateError:
        pass
