"""The page server's memory: malloc's heaps bounded and trimmed (no-ops without glibc), matplotlib's backend named."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import aiayn.serve.memory
from aiayn.serve.memory import Trimmer, bound_server_memory, glibc, return_freed_memory

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
