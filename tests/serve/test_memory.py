"""The page server's memory: malloc's heaps bounded and trimmed (no-ops without glibc), matplotlib's backend named;
and the server, the service and the batcher making those calls where they should."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import aiayn.serve.batching
import aiayn.serve.drain
import aiayn.serve.memory
import aiayn.serve.service
from aiayn.core.folder import ModelFolder
from aiayn.engines import Engine
from aiayn.engines.load import load_engine
from aiayn.engines.options import EngineOptions
from aiayn.search.output import Output
from aiayn.search.translator import SearchSettings
from aiayn.serve.batching import SearchBatcher
from aiayn.serve.memory import M_ARENA_MAX, MALLOC_ARENAS, Trimmer, bound_server_memory, glibc, return_freed_memory
from aiayn.serve.server import GRADIO_SETTINGS, serve
from aiayn.serve.service import TranslationService

# A page server's burst in miniature: 8 long-lived threads (Gradio's, the batchers') each search a large batch in
# turn: 8 MB of malloc'd blocks (50 kB each, under malloc's mmap threshold, so they come from a heap), freed but the
# last, which keeps the freed space below it from the heap's top, as a live object does in a server. Prints the
# resident MiB the burst left, and what is left once return_freed_memory() has run.
BURST = """
import sys, threading
from aiayn.serve.memory import bound_server_memory, return_freed_memory

def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

THREADS = 8
if sys.argv[1] == "bounded":
    bound_server_memory()
kept, finish = [], threading.Event()
turns = [threading.Event() for _ in range(THREADS + 1)]
turns[0].set()

def visitor(i):
    turns[i].wait()
    blocks = [b"\\x01" * 50_000 for _ in range(160)]
    kept.append(blocks.pop())
    del blocks
    turns[i + 1].set()
    finish.wait()

before = resident_mib()
threads = [threading.Thread(target=visitor, args=(i,)) for i in range(THREADS)]
for thread in threads:
    thread.start()
turns[THREADS].wait()
after = resident_mib()
return_freed_memory()
print(after - before, resident_mib() - before)
finish.set()
"""


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


@pytest.mark.skipif(glibc() is None, reason="malloc's heaps are bounded and trimmed only with glibc")
def test_after_a_burst_the_bounded_heaps_hold_less_and_a_trim_gives_it_back() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # malloc's own settings left out

    def burst(mode: str) -> tuple[float, float]:
        done = subprocess.run([sys.executable, "-c", BURST, mode], env=env, capture_output=True, text=True, check=True)
        resident, trimmed = map(float, done.stdout.split())
        return resident, trimmed

    unbounded, unbounded_trimmed = burst("unbounded")
    bounded, bounded_trimmed = burst("bounded")
    # One heap per thread keeps each thread's 8 MB (61 MiB measured); two heaps share them, each thread reusing
    # what the one before freed (16 MiB measured). The bounds leave room for any glibc's bookkeeping.
    assert unbounded > 40, "the burst did not leave its freed blocks resident: the test measures nothing here"
    assert bounded < unbounded / 2
    assert max(unbounded_trimmed, bounded_trimmed) < 5  # malloc_trim(0) returns the free pages of every heap


class Glibc:
    """glibc's two calls recorded in ``events``, beside what a test records there, instead of made."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.trimmed = threading.Event()

    def mallopt(self, parameter: int, value: int) -> int:
        self.events.append(("mallopt", parameter, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.events.append(("malloc_trim", pad))
        self.trimmed.set()
        return 1


BOUND, TRIM = ("mallopt", M_ARENA_MAX, MALLOC_ARENAS), ("malloc_trim", 0)


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> Glibc:
    """The C library that ``serve.memory`` calls, recording: what the code calls, wherever it imported from."""
    fake = Glibc()
    monkeypatch.setattr(aiayn.serve.memory, "glibc", lambda: fake)
    return fake


@pytest.fixture
def loads(libc: Glibc, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's engine loads, each recorded in ``libc.events`` as it starts (ONNX Runtime's threads with it)."""

    def load(folder: ModelFolder, options: EngineOptions) -> Engine[Any]:
        libc.events.append(f"load {folder.path.name}")
        return load_engine(folder, options)

    monkeypatch.setattr(aiayn.serve.service, "load_engine", load)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.usefixtures("loads")
def test_the_server_bounds_the_heaps_before_any_model_loads(
    bundled: dict[str, Path], libc: Glibc, monkeypatch: pytest.MonkeyPatch
) -> None:

    for name, value in {**GRADIO_SETTINGS, "MPLBACKEND": "agg"}.items():  # serve sets them: put back after the test
        monkeypatch.setenv(name, os.environ.get(name, value))
    # serve returns once the page has started, as if stopped at once: no signal to wait for
    monkeypatch.setattr(aiayn.serve.drain, "serve_until_stopped", lambda lifecycle, grace_s, close: close() or 0)
    serve(["en-de"], "127.0.0.1", free_port(), options=EngineOptions(device="cpu"))
    assert libc.events[:2] == [BOUND, "load en-de"]


@pytest.mark.usefixtures("loads")
def test_the_service_hands_back_what_loading_a_model_freed(bundled: dict[str, Path], libc: Glibc) -> None:
    service = TranslationService(EngineOptions(device="cpu"))
    service.model("en-de")
    service.model("en-de")  # loaded once, trimmed once
    assert libc.events == ["load en-de", TRIM]


class Echo:
    """A translator whose outputs are its sources, each search recorded in ``events``."""

    lanes = 1

    def __init__(self, events: list[object]) -> None:
        self.events = events

    def outputs(
        self, src_ids: Sequence[Sequence[int]], settings: SearchSettings, wanted: Callable[[], bool] | None = None
    ) -> list[Output]:
        self.events.append("search")
        return [Output(list(ids), 0.0, True, [0.0] * len(ids)) for ids in src_ids]


def test_a_batcher_hands_back_what_its_search_freed(libc: Glibc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiayn.serve.batching.TRIM, "trimmed_at", float("-inf"))  # due, whatever trimmed before
    batcher = SearchBatcher(Echo(libc.events))  # type: ignore[arg-type]
    assert batcher.outputs([[5, 3]], SearchSettings())[0].tokens == [5, 3]
    assert libc.trimmed.wait(timeout=10), "no trim after the search"  # the worker trims after it answers
    assert libc.events == ["search", TRIM]
