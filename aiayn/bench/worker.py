"""One engine in a process of its own (``process.Worker``), measuring on request: one JSON line each."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

from aiayn.bench.engines import BenchEngine, Setup, make_engine
from aiayn.bench.process import answer, gpu_mb, requests, status_mb
from aiayn.core.folder import ModelFolder
from aiayn.serve.memory import return_freed_memory


@dataclass(frozen=True)
class Measurement:
    seconds: float
    tokens: int  # output tokens, </s> included
    latencies_ms: list[float]  # per sentence, at batch 1
    outputs: list[list[int]]
    peak_rss_mb: float
    gpu_mb: float  # on a GPU: the memory it holds there after the pass; else 0


def measure(
    engine: BenchEngine,
    sentences: list[str],
    beam: int,
    batch: int,
    lanes: int,
    length: int | None = None,
    on_gpu: bool = False,
) -> Measurement:
    """One timed pass over ``sentences``: one at a time at batch 1 in one lane (with each latency), else all at
    once in batches of ``batch`` (several lanes take them side by side); every output ``length`` tokens if given.
    Each engine tokenizes the sentences its own way before the clock starts: the time is the translation's."""
    sources = engine.prepare(sentences)
    latencies, outputs = [], []
    started = time.perf_counter()
    if batch == 1 and lanes == 1:
        for source in sources:
            one = time.perf_counter()
            outputs += engine.translate([source], beam, 1, length)
            latencies.append((time.perf_counter() - one) * 1000)
    else:
        outputs = engine.translate(sources, beam, batch, length)
    seconds = time.perf_counter() - started
    gpu = gpu_mb() if on_gpu else 0.0
    return Measurement(seconds, sum(len(o) + 1 for o in outputs), latencies, outputs, status_mb("VmHWM"), gpu)


def main() -> None:
    """``python -m aiayn.bench.worker FOLDER ENGINE LANES THREADS DEVICE``, then lines ``{"sentences", "beam",
    "batch", "length"}`` on stdin (``length``, if there, fixes every output's length). Once loaded, it says its
    resident memory and the peak the loading took."""
    setup = Setup(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    engine = make_engine(setup, ModelFolder.open(sys.argv[1]))
    return_freed_memory()  # what building the engine took, as `aiayn translate` and `aiayn serve` do after loading
    answer({"ready": True, "loaded_mb": status_mb("VmRSS"), "load_peak_mb": status_mb("VmHWM")})
    warmed: set[tuple[int, int]] = set()
    for request in requests():
        beam, batch, length = request["beam"], request["batch"], request.get("length")
        if (beam, batch) not in warmed:  # the first pass of a shape pays for allocations: not timed
            engine.translate(engine.prepare(request["sentences"][:4]), beam, batch, length)
            warmed.add((beam, batch))
        on_gpu = setup.device == "cuda"
        answer(asdict(measure(engine, request["sentences"], beam, batch, setup.lanes, length, on_gpu)))


if __name__ == "__main__":
    main()
