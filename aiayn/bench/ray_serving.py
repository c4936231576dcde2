"""`aiayn bench --ray`: `aiayn serve --ray --replicas 2` against one `aiayn serve` process, the JSON route's
throughput in alternating rounds.

Both serve the model at once, each a process of its own (the Ray one starts a Ray cluster of this machine, whose
proxy, page replica and two translation replicas share its cores), and take turns round by round. Two loads, each
a crowd of clients on raw asyncio streams sending requests one after another: apps that send batches (10 clients,
batches of 32 sentences) and visitors that send one sentence (50 clients). Every answer must be the one the
sentence gets alone from `aiayn serve`.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass

from aiayn.bench.crowd import BEAM, SENTENCES, Connection, server_process
from aiayn.core.folder import ModelFolder
from aiayn.serve.requests import pair_value

ROUNDS = 3
REPLICAS = 2
Answers = list[tuple[str, str]]  # (sentence, its answer), one per sentence asked
FAILED = "failed: "  # what a failed request's sentences are answered with


@dataclass(frozen=True)
class Load:
    name: str
    clients: int
    requests_per_client: int
    sentences_per_request: int


LOADS = (Load("batches of 32", 10, 5, 32), Load("one sentence", 50, 10, 1))


@dataclass(frozen=True)
class RayRow:
    load: Load
    ray_per_s: list[float]  # sentences/s, a round each
    one_process_per_s: list[float]
    identical: bool

    @property
    def ratios(self) -> list[float]:
        return [r / o for r, o in zip(self.ray_per_s, self.one_process_per_s, strict=True)]


async def json_crowd(port: int, load: Load, sentences: list[str], direction: str) -> tuple[float, Answers]:
    """``load`` on the JSON route: sentences/s, and (sentence, answer) for every sentence asked; a request that
    fails gives each of its sentences ``FAILED`` and the error, and its client goes on on a new connection."""
    answers: Answers = []

    async def client(number: int) -> None:
        connection = await Connection.open(port)
        try:
            for request in range(load.requests_per_client):
                first = (number * load.requests_per_client + request) * load.sentences_per_request
                asked = [sentences[(first + i) % len(sentences)] for i in range(load.sentences_per_request)]
                body = {"sentences": asked, "direction": direction, "beam": BEAM}
                try:
                    got = json.loads(await connection.request("POST", "/v1/translate", body))["translations"]
                except Exception as err:  # counted, as the crowd's own failures are: it ends no client
                    got = [f"{FAILED}{err!r}"] * len(asked)
                    connection.close()
                    connection = await Connection.open(port)
                answers.extend(zip(asked, got, strict=True))
        finally:
            connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(load.clients)))
    return len(answers) / (time.perf_counter() - started), answers


def measure_ray(model: str, sentences: list[str]) -> list[RayRow]:
    direction = pair_value(ModelFolder.open(model))
    sample = sentences[:SENTENCES]
    common = ["--model", model, "--port", "{port}", "--device", "cpu"]
    one = ["aiayn.cli", "serve", *common]
    ray = ["aiayn.cli", "serve", "--ray", "--replicas", str(REPLICAS), *common]
    per_s: dict[tuple[str, str], list[float]] = {}
    seen: dict[str, set[str]] = {}
    with server_process(one) as (one_port, _), server_process(ray) as (ray_port, _):
        for round_number in range(ROUNDS):
            order = [("ray", ray_port), ("one", one_port)]
            for who, port in order if round_number % 2 == 0 else order[::-1]:
                for load in LOADS:
                    rate, answers = asyncio.run(json_crowd(port, load, sample, direction))
                    per_s.setdefault((who, load.name), []).append(rate)
                    for sentence, answer in answers:
                        seen.setdefault(sentence, set()).add(answer)
    identical = all(len(got) == 1 and not next(iter(got)).startswith(FAILED) for got in seen.values())
    return [RayRow(load, per_s["ray", load.name], per_s["one", load.name], identical) for load in LOADS]


def ray_report(rows: list[RayRow]) -> str:
    lines = [
        f"the JSON route through Ray's proxy, {REPLICAS} translation replicas on a Ray cluster of this machine, "
        f"against one `aiayn serve` process; {ROUNDS} rounds, taking turns; beam {BEAM}",
        "| load | Ray, sentences/s | one process, sentences/s | Ray / one process: median (range) | identical |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        ratios = row.ratios
        load = f"{row.load.clients} clients, {row.load.name}"
        lines.append(
            f"| {load} | {statistics.median(row.ray_per_s):.0f} | {statistics.median(row.one_process_per_s):.0f} "
            f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) "
            f"| {'yes' if row.identical else 'NO'} |"
        )
    return "\n".join(lines)
