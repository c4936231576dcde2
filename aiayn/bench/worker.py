"""One engine in a process of its own, measuring on request: the bench sends one JSON line per measurement.

Runtimes that share a process slow each other down (torch's and CTranslate2's
OpenMP pools: CTranslate2 by more than ten times here), so every engine lives in
its own process; the bench keeps them all alive and asks each in turn, round
by round, so that a slow moment of the shared machine hits every engine alike.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from aiayn.bench.engines import Translate, make_engine
from aiayn.core.folder import ModelFolder


@dataclass(frozen=True)
class Measurement:
    seconds: float
    tokens: int  # output tokens, </s> included
    latencies_ms: list[float]  # per sentence, at batch 1
    outputs: list[list[int]]
    peak_rss_mb: float


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss it does not carry over across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(translate: Translate, sentences: list[str], beam: int, batch: int) -> Measurement:
    """One timed pass over ``sentences``: one at a time at batch 1 (with each latency), else all at once."""
    latencies, outputs = [], []
    started = time.perf_counter()
    if batch == 1:
        for sentence in sentences:
            one = time.perf_counter()
            outputs += translate([sentence], beam, 1)
            latencies.append((time.perf_counter() - one) * 1000)
    else:
        outputs = translate(sentences, beam, batch)
    seconds = time.perf_counter() - started
    return Measurement(seconds, sum(len(o) + 1 for o in outputs), latencies, outputs, peak_rss_mb())


def main() -> None:
    """``python -m aiayn.bench.worker FOLDER ENGINE``, then lines ``{"sentences", "beam", "batch"}`` on stdin."""
    translate = make_engine(sys.argv[2], ModelFolder.open(sys.argv[1]))
    print(json.dumps({"ready": True}), flush=True)
    warmed: set[tuple[int, int]] = set()
    for line in sys.stdin:
        request = json.loads(line)
        beam, batch = request["beam"], request["batch"]
        if (beam, batch) not in warmed:  # the first pass of a shape pays for allocations: not timed
            translate(request["sentences"][:4], beam, batch)
            warmed.add((beam, batch))
        print(json.dumps(asdict(measure(translate, request["sentences"], beam, batch))), flush=True)


if __name__ == "__main__":
    main()
