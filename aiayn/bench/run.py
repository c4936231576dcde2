"""`aiayn bench`: decoding speed of every engine on the same weights, sentences and threads, in one run.

Engines (``engines.py``): the tutorials' way (PyTorch eager, the whole prefix
re-decoded at every step), our PyTorch engine with the KV cache, our ONNX
Runtime engine (fp32, int8) and CTranslate2 (fp32, int8) on an export of the
same weights, in two framings: every engine on one thread, and every engine at
its best use of two cores (ours in lanes, CTranslate2 as workers or as threads).
Each setup lives in a process of its own (``worker.py``); they take turns,
round by round, at greedy and beam 4, batch 1 and 32, so that the shared
machine's slow moments fall on all of them. Ratios against a peer are taken
within each round; the report gives their median and range.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.bench.conditions import Quiet, Round, Watch, ends_with_warning, format_header, machine_header, spread
from aiayn.bench.engines import CONFIGS, FRAMINGS, NO_CACHE, THREADS, Framing, Setup, prepare
from aiayn.bench.process import Worker
from aiayn.bench.serving import BEAM as SERVING_BEAM
from aiayn.bench.serving import ServingRound, measure_serving
from aiayn.core.folder import ModelFolder
from aiayn.evaluation.metrics import score

SERVING_SENTENCES = 16


@dataclass(frozen=True)
class Plan:
    rounds: int
    sentences: int
    tutorial_sentences: int  # the tutorials' way re-decodes every prefix: a smaller sample
    serving_rounds: int


FULL = Plan(rounds=5, sentences=300, tutorial_sentences=40, serving_rounds=3)
QUICK = Plan(rounds=2, sentences=40, tutorial_sentences=10, serving_rounds=1)


@dataclass(frozen=True)
class Row:
    engine: str
    search: str
    batch: int
    sentences: int
    sentences_per_s: float  # medians over the rounds
    tokens_per_s: float
    p50_ms: float | None
    p90_ms: float | None
    peak_rss_mb: float
    bleu: float


@dataclass(frozen=True)
class Ratio:
    framing: str
    ours: str
    peer: str  # the peer setup with the higher median throughput in this configuration
    search: str
    batch: int
    median: float  # throughput ours / peer, each round's own; median and range over the rounds
    low: float
    high: float


@dataclass(frozen=True)
class Serving:
    requests: int
    one_by_one_s: float  # medians over the rounds
    together_s: float
    ratio_median: float
    ratio_low: float
    ratio_high: float
    errors: int
    identical: bool


def search_name(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam {beam}"


def summarize(
    engine: str, beam: int, batch: int, runs: list[dict[str, Any]], refs: list[str], folder: ModelFolder
) -> Row:
    seconds = statistics.median(run["seconds"] for run in runs)
    first = runs[0]
    latencies = np.array([ms for run in runs for ms in run["latencies_ms"]])
    sentences = len(first["outputs"])
    return Row(
        engine=engine,
        search=search_name(beam),
        batch=batch,
        sentences=sentences,
        sentences_per_s=sentences / seconds,
        tokens_per_s=first["tokens"] / seconds,
        p50_ms=float(np.percentile(latencies, 50)) if latencies.size else None,
        p90_ms=float(np.percentile(latencies, 90)) if latencies.size else None,
        peak_rss_mb=max(run["peak_rss_mb"] for run in runs),
        bleu=score([folder.tokenizer.decode(o) for o in first["outputs"]], refs[:sentences]).bleu,
    )


def throughputs(runs: list[dict[str, Any]]) -> list[float]:
    return [run["tokens"] / run["seconds"] for run in runs]


Measured = dict[tuple[str, int, int], list[dict[str, Any]]]  # (setup, beam, batch) → each round's measurement


def ratios(measured: Measured, framings: tuple[Framing, ...], configs: tuple[tuple[int, int], ...]) -> list[Ratio]:
    """Ours against the best of its peers, per configuration: the throughput ratio of every round, as median and
    range; the peer is the one of ``peers`` with the higher median throughput there."""
    out = []
    for framing in framings:
        for ours, peers in framing.comparisons:
            for beam, batch in configs:
                a = measured.get((ours, beam, batch))
                runs = {peer: measured[peer, beam, batch] for peer in peers if (peer, beam, batch) in measured}
                if not a or not runs:
                    continue
                peer = max(runs, key=lambda p: statistics.median(throughputs(runs[p])))
                per_round = [x / y for x, y in zip(throughputs(a), throughputs(runs[peer]), strict=True)]
                middle, low, high = statistics.median(per_round), min(per_round), max(per_round)
                out.append(Ratio(framing.name, ours, peer, search_name(beam), batch, middle, low, high))
    return out


def serving_summary(rounds: list[ServingRound]) -> Serving:
    ratio = [r.ratio for r in rounds]
    return Serving(
        requests=SERVING_SENTENCES,
        one_by_one_s=statistics.median(r.one_by_one_s for r in rounds),
        together_s=statistics.median(r.together_s for r in rounds),
        ratio_median=statistics.median(ratio),
        ratio_low=min(ratio),
        ratio_high=max(ratio),
        errors=sum(r.errors for r in rounds),
        identical=all(r.identical for r in rounds),
    )


@dataclass(frozen=True)
class BenchResult:
    rows: list[Row]
    ratios: list[Ratio]
    serving: Serving | None
    rounds: int
    watched: list[Round] = field(default_factory=list)  # each round's load and the bench's share of the CPU


def setups_of(framings: tuple[Framing, ...]) -> list[Setup]:
    return list(dict.fromkeys(setup for framing in framings for setup in framing.setups))


def measure_rounds(
    folder: Path,
    setups: list[Setup],
    rounds: int,
    configs: tuple[tuple[int, int], ...],
    request: Callable[[str, int, int], dict[str, Any] | None],
    watch: Watch | None = None,
) -> tuple[Measured, dict[str, dict[str, Any]]]:
    """Each setup in a process of its own on ``folder``, asked ``request(setup label, beam, batch)`` (None: not
    this one) in turn, configuration by configuration, round by round; with what each said once loaded. ``watch``
    records each round's load once its workers are loaded."""
    measured: Measured = {}
    workers = []
    try:
        for s in setups:
            args = (str(folder.resolve()), s.engine, str(s.lanes), str(s.threads), s.device)
            # A baseline's worker imports the aiayn of its checkout: `python -m` puts its working folder first.
            workers.append(Worker(s.label, "aiayn.bench.worker", *args, cwd=s.checkout or None))
        if watch is not None:
            watch.start()
        for round_ in range(rounds):
            for beam, batch in configs:
                for i in range(len(workers)):
                    worker = workers[(i + round_) % len(workers)]  # a different engine goes first each round
                    asked = request(worker.name, beam, batch)
                    if asked is not None:
                        measured.setdefault((worker.name, beam, batch), []).append(worker.ask(asked))
            if watch is not None:
                watch.round_done()
    finally:
        for worker in workers:
            worker.close()
    return measured, {worker.name: worker.ready for worker in workers}


def run_bench(
    folder: ModelFolder,
    src: list[str],
    refs: list[str],
    plan: Plan = FULL,
    framings: tuple[Framing, ...] = FRAMINGS,
    configs: tuple[tuple[int, int], ...] = CONFIGS,
    with_serving: bool = True,
    watch: Watch | None = None,
) -> BenchResult:
    """Every setup of every framing in its own process, taking turns round by round, in each (beam, batch) of
    ``configs``; the serving row (the page server on the CPU) after, ``with_serving``. ``watch``: how each round's
    machine was (by default the real one's load, on the bench's ``THREADS`` cores)."""
    setups = setups_of(framings)
    watch = Watch(THREADS) if watch is None else watch

    def request(name: str, beam: int, batch: int) -> dict[str, Any]:
        n = plan.tutorial_sentences if name.startswith(NO_CACHE) else max(plan.sentences, batch)
        return {"sentences": src[:n], "beam": beam, "batch": batch}

    with tempfile.TemporaryDirectory() as tmp:
        copy = prepare(folder, Path(tmp) / "model")
        measured, _ = measure_rounds(copy.path, setups, plan.rounds, configs, request, watch)
        serving = measure_serving(copy.path, src[:SERVING_SENTENCES], plan.serving_rounds) if with_serving else []
    rows = [summarize(e, beam, batch, runs, refs, folder) for (e, beam, batch), runs in measured.items()]
    order = {setup.label: i for i, setup in enumerate(setups)}
    rows.sort(key=lambda r: (order[r.engine], r.search, r.batch))
    summary = serving_summary(serving) if serving else None
    return BenchResult(rows, ratios(measured, framings, configs), summary, plan.rounds, watch.rounds)


def format_table(rows: list[Row]) -> str:
    lines = [
        "| engine, lanes×threads | search | batch | sentences | sent/s | tokens/s | p50 ms | p90 ms | peak RSS MB "
        "| BLEU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p50 = f"{r.p50_ms:.1f}" if r.p50_ms is not None else "–"
        p90 = f"{r.p90_ms:.1f}" if r.p90_ms is not None else "–"
        lines.append(
            f"| {r.engine} | {r.search} | {r.batch} | {r.sentences} | {r.sentences_per_s:.1f} | {r.tokens_per_s:.0f} "
            f"| {p50} | {p90} | {r.peak_rss_mb:.0f} | {r.bleu:.2f} |"
        )
    return "\n".join(lines)


def format_ratios(ratios: list[Ratio]) -> str:
    return "\n".join(
        f"- {r.framing}: {r.ours} / {r.peer}, {r.search}, batch {r.batch}: {r.median:.2f}× "
        f"(range {r.low:.2f}–{r.high:.2f})"
        for r in ratios
    )


def quiet_of(watched: list[Round], ratios: Sequence[Ratio], cores: int = THREADS) -> Quiet:
    """How alone the rounds of ``watched`` were, and how far ``ratios``' rounds spread."""
    return Quiet(cores, watched, spread((r.median, r.low, r.high) for r in ratios))


@dataclass(frozen=True)
class Appended:
    """Rows of the same run printed after the table (the base size's): their text and JSON, rounds and ratios."""

    text: str
    json: dict[str, Any]
    watched: list[Round]
    ratios: list[Ratio]


def report(
    result: BenchResult, json_path: Path | None, appended: Appended | None = None, header: dict[str, Any] | None = None
) -> str:
    """The machine header, the table, the ratios and the serving row, then ``appended``'s text (its JSON, rounds and
    ratios join this run's); ending with the warning where the rounds were not alone or their ratios spread.
    ``header``: ``machine_header()``'s by default."""
    header = machine_header() if header is None else header
    watched, all_ratios = result.watched, result.ratios
    if appended is not None:
        watched, all_ratios = watched + appended.watched, all_ratios + appended.ratios
    quiet = quiet_of(watched, all_ratios)
    text = (
        f"{format_header(header)}; lanes × intra-op threads per engine\n\n{format_table(result.rows)}\n\n"
        "Throughput ratios (target tokens/s, ours / peer; median and range over "
        f"{result.rounds} interleaved rounds; lanes×threads after each name):\n{format_ratios(result.ratios)}"
    )
    if result.serving is not None:
        s = result.serving
        text += (
            f"\n\nServing ({s.requests} one-sentence API requests, beam {SERVING_BEAM}): "
            f"one by one {s.one_by_one_s:.2f} s, "
            f"all at once {s.together_s:.2f} s: {s.ratio_median:.2f}× the throughput (range {s.ratio_low:.2f}–"
            f"{s.ratio_high:.2f}), {s.errors} errors, answers {'identical' if s.identical else 'DIFFERENT'}"
        )
    if json_path is not None:
        json_path.write_text(
            json.dumps(
                {
                    "machine": header,
                    "conditions": quiet.to_json(),
                    "rounds": result.rounds,
                    "rows": [asdict(r) for r in result.rows],
                    "ratios": [
                        {
                            "framing": r.framing,
                            "ours": r.ours,
                            "ctranslate2" if r.peer.startswith("ctranslate2") else "peer": r.peer,
                            "search": r.search,
                            "batch": r.batch,
                            "ratio": r.median,
                            "min": r.low,
                            "max": r.high,
                        }
                        for r in result.ratios
                    ],
                    "serving": asdict(result.serving) if result.serving else None,
                    "base_size": appended.json if appended is not None else None,
                },
                indent=2,
            )
        )
    return ends_with_warning(f"{text}\n\n{appended.text}" if appended is not None else text, quiet.warning)
