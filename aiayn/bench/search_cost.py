"""`aiayn bench --search`: the host work of a decoding step, apart from ONNX Runtime's run.

Two measurements, each in a process of its own per checkout (``--baseline DIR``: the same measurement of another
checkout's code, taking turns round by round, each ratio taken within a round):

- **the search alone**: greedy and beam 4 over ``StubStep``, a step model with the bundled engine's shapes (its
  vocabulary, ids and log-probabilities of each row's best tokens as the serving graph's head returns them) whose
  answers are seeded tables read in turn, with no engine behind them; every sentence runs to ``STUB_LENGTH`` tokens
  (</s> is never among its answers), so the figure is the search's own bookkeeping per step at that many rows;
- **the serving engine's host side**: the time of its ``step_top`` and ``select`` less the decoder session's
  ``run_with_iobinding`` (binding, writing the ids, selecting rows, copying the head's outputs), per step of a
  search of test sentences on the bundled model, then on a model of the paper's base size (``base_size.py``: random
  weights, every output ``BASE_LENGTH`` tokens), one lane of one thread.

The worker is this file, run with the measured checkout's ``aiayn`` first on the path (``process.Worker``'s
``script``): it uses only what every checkout has (``greedy_search``, ``beam_search``, ``load_engine``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

STUB_LENGTH = 60  # tokens per output in the stub's searches
STUB_TABLES = 7  # distinct answers the stub cycles through, so that the beam reorders its rows
STUB_SENTENCES = {1: (1, 8, 32, 128, 512), 4: (1, 2, 8, 32, 128)}  # by beam: 1 to 512 rows
ENGINE_CONFIGS = ((1, 1), (1, 32), (4, 1), (4, 32))  # (beam, batch), as the speed table's
BASE_LENGTH = 24
MIN_SECONDS = 0.3  # each measurement repeats its search for at least this long (at least 3 times)


class StubStep:
    """A step model with the engine's shapes and no engine: each call's (rows, k) answer is the next of
    ``STUB_TABLES`` seeded tables (ids distinct per row, never </s>; log-probabilities best first)."""

    def __init__(self, vocab: int, bos: int, eos: int, pad: int, never_generate: tuple[int, ...], rows: int) -> None:
        self.bos_id, self.eos_id, self.pad_id, self.never_generate = bos, eos, pad, never_generate
        self.vocab, self.rows, self.calls = vocab, rows, 0
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def table(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(tables, rows, k) log-probabilities and ids, made once per k."""
        if k not in self.tables:
            rng = np.random.default_rng(k)
            shape = (STUB_TABLES, self.rows, k)
            values = -np.cumsum(rng.exponential(1.0, shape), axis=2).astype(np.float32)
            ids = (rng.integers(0, self.vocab, shape[:2])[:, :, None] + 7 * np.arange(k)) % self.vocab
            ids[ids == self.eos_id] = (self.eos_id + 1 + 7 * k) % self.vocab  # never </s>: every row to the limit
            self.tables[k] = values, ids.astype(np.int64)
        return self.tables[k]

    def start(self, src_ids: np.ndarray) -> int:
        return int(src_ids.shape[0])

    def step_top(self, state: int, tgt_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        values, ids = self.table(min(k, self.vocab))
        turn, self.calls = self.calls % STUB_TABLES, self.calls + 1
        return values[turn, :state], ids[turn, :state], state

    def select(self, state: int, rows: np.ndarray) -> int:
        return int(rows.size)


def repeated(run: Any) -> float:
    """The median ms per step of ``run()``, which returns the seconds it counts and the steps it took, repeated for
    ``MIN_SECONDS`` (at least 3 times)."""
    per_step, started = [], time.perf_counter()
    while len(per_step) < 3 or time.perf_counter() - started < MIN_SECONDS:
        seconds, steps = run()
        per_step.append(seconds / max(steps, 1))
    return 1000 * statistics.median(per_step)


def stub_ms(folder: Any, beam: int, sentences: int) -> float:
    """The median ms per step of a search of ``sentences`` over ``StubStep``."""
    from aiayn.search import beam_search, greedy_search

    tokens = folder.config.special_tokens
    model = StubStep(
        folder.config.vocab_size, tokens.bos, tokens.eos, tokens.pad, folder.config.never_generate, sentences * beam
    )
    src_ids = np.full((sentences, 10), 5, np.int64)

    def run() -> tuple[float, int]:
        calls, started = model.calls, time.perf_counter()
        if beam == 1:
            greedy_search(model, src_ids, STUB_LENGTH)
        else:
            beam_search(model, src_ids, beam, max_len=STUB_LENGTH)
        return time.perf_counter() - started, model.calls - calls

    run()  # the tables made once
    return repeated(run)


class TimedSession:
    """A decoder session whose ``run_with_iobinding`` adds its seconds to ``spent`` (the rest it passes on)."""

    def __init__(self, session: Any) -> None:
        self.session, self.spent = session, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def run_with_iobinding(self, binding: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.session.run_with_iobinding(binding, *args)
        finally:
            self.spent += time.perf_counter() - started


class TimedSteps:
    """An engine whose ``step_top`` and ``select`` are timed, and counted by step."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.spent, self.steps = engine, 0.0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def step_top(self, state: Any, tgt_ids: np.ndarray, k: int) -> Any:
        started = time.perf_counter()
        try:
            return self.engine.step_top(state, tgt_ids, k)
        finally:
            self.spent += time.perf_counter() - started
            self.steps += 1

    def select(self, state: Any, rows: np.ndarray) -> Any:
        started = time.perf_counter()
        try:
            return self.engine.select(state, rows)
        finally:
            self.spent += time.perf_counter() - started


class EngineHost:
    """The serving engine of a folder (one lane, one thread), its steps and its decoder's runs timed apart."""

    def __init__(self, path: str) -> None:
        from aiayn.core.folder import ModelFolder
        from aiayn.engines.load import load_engine
        from aiayn.engines.options import EngineOptions

        self.folder = ModelFolder.open(path)
        engine: Any = load_engine(self.folder, EngineOptions("onnx", "cpu", "fp32", lanes=1))
        self.session = TimedSession(engine.buffers.decoder)
        engine.buffers.decoder = self.session
        self.steps = TimedSteps(engine)

    def ms(self, sentences: list[str], beam: int, batch: int, length: int | None) -> float:
        """The median host ms per step over searches of ``sentences`` in batches of ``batch``."""
        from aiayn.engines.load import translator_for
        from aiayn.search.translator import SearchSettings

        settings = SearchSettings(beam, min_len=length or 0, max_len=length)
        translator = translator_for(self.folder, self.steps, max_sentences=batch)
        src_ids = [translator.source_ids(s) for s in sentences]

        def run() -> tuple[float, int]:
            spent, session, steps = self.steps.spent, self.session.spent, self.steps.steps
            translator.outputs(src_ids, settings)
            host = (self.steps.spent - spent) - (self.session.spent - session)
            return host, self.steps.steps - steps

        run()  # the first searches of a shape pay for allocations: not timed
        return repeated(run)


@dataclass(frozen=True)
class Row:
    """One measurement's ms per step: ours, and the baseline's with ratios of ours to it, round by round."""

    part: str  # "stub", "engine" (the bundled model) or "base" (the base size)
    beam: int
    rows: int  # the stub's rows, or the engine's batch of sentences
    ours: list[float]
    baseline: list[float]

    @property
    def ratios(self) -> list[float]:
        return [b / o for o, b in zip(self.ours, self.baseline, strict=True)]


def requests_of(sentences: list[str], quick: bool) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(part, beam, rows, request) for each measurement."""
    alone, base_alone = (10, 2) if quick else (40, 4)
    asked: list[tuple[str, int, int, dict[str, Any]]] = [
        ("stub", beam, n * beam, {"part": "stub", "beam": beam, "sentences": n})
        for beam, counts in STUB_SENTENCES.items()
        for n in counts
    ]
    for part, single in (("engine", alone), ("base", base_alone)):
        for beam, batch in ENGINE_CONFIGS:
            chosen = sentences[: single if batch == 1 else batch]
            asked.append((part, beam, batch, {"part": part, "beam": beam, "batch": batch, "sentences": chosen}))
    return asked


def measure_search_costs(
    folder: Any, sentences: list[str], rounds: int, baseline: Path | None = None, quick: bool = False
) -> list[Row]:
    """Every measurement of ``requests_of``, ``rounds`` times, ours and (if given) the baseline checkout's taking
    turns, each in a process of its own."""
    from aiayn.bench.base_size import base_folder
    from aiayn.bench.process import Worker

    asked = requests_of(sentences, quick)
    ours: dict[int, list[float]] = {i: [] for i in range(len(asked))}
    theirs: dict[int, list[float]] = {i: [] for i in range(len(asked))}
    with tempfile.TemporaryDirectory(prefix="aiayn-search-cost-") as tmp:
        base = base_folder(folder, Path(tmp) / "base")
        args = (str(folder.path.resolve()), str(base.path.resolve()))
        workers = [(ours, Worker("ours", "", *args, script=Path(__file__)))]
        if baseline is not None:
            workers.append((theirs, Worker("baseline", "", *args, cwd=str(baseline), script=Path(__file__))))
        try:
            for round_ in range(rounds):
                for i, (_, _, _, request) in enumerate(asked):
                    for j in range(len(workers)):
                        figures, worker = workers[(j + round_) % len(workers)]  # a different one first each round
                        figures[i].append(worker.ask(request)["ms"])
        finally:
            for _, worker in workers:
                worker.close()
    return [Row(part, beam, rows, ours[i], theirs[i]) for i, (part, beam, rows, _) in enumerate(asked)]


TITLES = {
    "stub": f"The search alone (a stub step model, every output {STUB_LENGTH} tokens)",
    "engine": "The serving engine's host side, bundled model (test sentences)",
    "base": f"The serving engine's host side, base size (random weights, every output {BASE_LENGTH} tokens)",
}


def search_report(rows: list[Row], baseline: bool) -> str:
    """A table per part: ms per step (median and range of the rounds) and, with a baseline, its ms and the median
    and range of the ratios baseline / ours (above 1: ours is faster)."""

    def spread(values: list[float], digits: int = 3) -> str:
        return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"

    blocks = []
    for part, title in TITLES.items():
        unit = "rows" if part == "stub" else "batch"
        head = f"| search | {unit} | ms per step |" + (" baseline ms | baseline / ours |" if baseline else "")
        lines = [f"{title}:", "", head, "|---|---|---|" + ("---|---|" if baseline else "")]
        for row in (r for r in rows if r.part == part):
            search = "greedy" if row.beam == 1 else f"beam {row.beam}"
            line = f"| {search} | {row.rows} | {spread(row.ours)} |"
            if baseline:
                line += f" {spread(row.baseline)} | {spread(row.ratios, 2)}× |"
            lines.append(line)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def worker_main() -> None:
    """This file as a worker: ``FOLDER BASE_FOLDER``, then requests ``{"part": "stub", "beam", "sentences"}`` or
    ``{"part": "engine" | "base", "beam", "batch", "sentences": [...]}``, each answered ``{"ms": ...}``."""
    from aiayn.bench.process import answer, requests
    from aiayn.core.folder import ModelFolder

    folder = ModelFolder.open(sys.argv[1])
    hosts = {"engine": EngineHost(sys.argv[1]), "base": EngineHost(sys.argv[2])}
    answer({"ready": True})
    for request in requests():
        part, beam = request["part"], request["beam"]
        if part == "stub":
            answer({"ms": stub_ms(folder, beam, request["sentences"])})
        else:
            length = BASE_LENGTH if part == "base" else None
            answer({"ms": hosts[part].ms(request["sentences"], beam, request["batch"], length)})


if __name__ == "__main__":
    worker_main()
