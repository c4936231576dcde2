"""`aiayn bench --serve`: a crowd of visitors at once on the page's API, and one app on the JSON route.

The bench starts `aiayn serve` as a process of its own on a loopback port and drives it from this process
with a client on raw asyncio streams: each visitor keeps one HTTP/1.1 connection, and for each of its requests
posts ``/gradio_api/call/translate`` and reads the event stream of the answer to its end, one request after
another. Such a client spends well under a millisecond of CPU per request (an httpx client spent ~11 ms, which
capped any server near 85 requests/s on two cores), and it reports its own CPU per request beside the server's,
so the figures are the server's. The server's CPU and memory are read from /proc.

Before the crowd, every sentence is asked once, alone: the crowd's answers must equal those (``identical``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aiayn.bench.process import status_mb
from aiayn.bench.serving import free_port, wait_until_serving
from aiayn.core.folder import ModelFolder

VISITORS = (16, 100, 200, 500)
FLOOR_VISITORS = 200  # the goals' crowd (docs/serve.md): Gradio's floor is measured under it, where it is asked
REQUESTS_PER_VISITOR = 5  # one after another, each one sentence
BEAM = 4
SENTENCES = 100  # distinct test sentences, asked alone first, then cycled through the crowd
JSON_BATCH, JSON_BATCHES = 32, 20  # the JSON route: one client, batches one after another
OPERATIONS_ROUNDS = 3  # the metrics' and access log's cost: crowds on a server with them and one without, in turns
WITHOUT_OPERATIONS = ["--no-metrics", "--no-access-log"]
HOST = "127.0.0.1"


class HttpError(Exception):
    """A response other than 200: its status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status, self.body = status, body


class Connection:
    """One keep-alive HTTP/1.1 connection: a request written, its response read whole (plain or chunked)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection(HOST, port, limit=2**22))

    async def request(self, method: str, path: str, body: object = None) -> bytes:
        """``body``: JSON, as is if bytes."""
        payload = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(payload)}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        self.writer.write(head.encode() + b"\r\n" + payload)
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            chunks = []
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                chunks.append(await self.reader.readexactly(size))
                await self.reader.readline()
            await self.reader.readline()
            content = b"".join(chunks)
        else:
            content = await self.reader.readexactly(int(headers.get("content-length", 0)))
        if status != 200:
            raise HttpError(status, content)
        return content

    def close(self) -> None:
        self.writer.close()


def completed_data(stream: bytes) -> list[object]:
    """The outputs of the ``complete`` event of a Gradio event stream; an ``error`` event raises its message."""
    event = None
    for line in stream.decode().splitlines():
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: ") and event in ("complete", "error"):
            data = json.loads(line[len("data: ") :])
            if event == "error":
                raise RuntimeError(f"the page answered an error: {data}")
            return list(data)
    raise RuntimeError("the event stream ended without an answer")


async def ask_page(connection: Connection, sentence: str, direction: str, beam: int = BEAM) -> str:
    """One request of a visitor: posted, then its event stream read to the end."""
    posted = await connection.request("POST", "/gradio_api/call/translate", {"data": [sentence, direction, beam]})
    event_id = json.loads(posted)["event_id"]
    return str(completed_data(await connection.request("GET", f"/gradio_api/call/translate/{event_id}"))[0])


@dataclass(frozen=True)
class Outcome:
    seconds: float
    answer: str | None  # None: refused (or failed)
    refused: bool


async def visit(port: int, sentences: list[str], direction: str) -> list[Outcome]:
    connection = await Connection.open(port)
    outcomes = []
    try:
        for sentence in sentences:
            started = time.perf_counter()
            try:
                answer: str | None = await ask_page(connection, sentence, direction)
                refused = False
            except HttpError as err:
                answer, refused = None, err.status == 503
            outcomes.append(Outcome(time.perf_counter() - started, answer, refused))
    finally:
        connection.close()
    return outcomes


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU so far, all its threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CrowdRow:
    """One crowd: ``visitors`` at once, each sending REQUESTS_PER_VISITOR requests one after another."""

    visitors: int
    requests: int
    answered: int
    refused: int
    failed: int  # neither answered nor refused ("queue full"): errors, dropped connections
    identical: bool  # every answer equals the sentence's answer alone
    seconds: float
    p50_s: float
    p90_s: float
    server_cpu_ms: float  # per answer
    client_cpu_ms: float  # per request
    rss_mb: float  # the server's, after the crowd

    @property
    def answered_per_s(self) -> float:
        return self.answered / self.seconds


@dataclass(frozen=True)
class JsonRow:
    """The JSON route: one client posting JSON_BATCHES batches of JSON_BATCH sentences, one after another."""

    sentences: int
    seconds: float
    identical: bool
    server_cpu_ms: float  # per sentence

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.seconds


async def crowd(
    port: int, pid: int, visitors: int, sentences: list[str], alone: dict[str, str], direction: str
) -> CrowdRow:
    asked = [
        [sentences[(v * REQUESTS_PER_VISITOR + r) % len(sentences)] for r in range(REQUESTS_PER_VISITOR)]
        for v in range(visitors)
    ]
    server_cpu, client_cpu, started = cpu_seconds(pid), time.process_time(), time.perf_counter()
    results = await asyncio.gather(*(visit(port, mine, direction) for mine in asked), return_exceptions=True)
    seconds = time.perf_counter() - started
    server_cpu, client_cpu = cpu_seconds(pid) - server_cpu, time.process_time() - client_cpu
    visited = [(mine, r) for mine, r in zip(asked, results, strict=True) if not isinstance(r, BaseException)]
    pairs = [(s, o) for mine, outcomes in visited for s, o in zip(mine, outcomes, strict=True)]
    outcomes = [o for _, o in pairs]
    answered = [o for o in outcomes if o.answer is not None]
    latencies = sorted(o.seconds for o in answered) or [float("nan")]
    requests = visitors * REQUESTS_PER_VISITOR
    refused = sum(o.refused for o in outcomes)
    return CrowdRow(
        visitors,
        requests,
        len(answered),
        refused,
        requests - len(answered) - refused,
        all(o.answer == alone[s] for s, o in pairs if o.answer is not None),
        seconds,
        statistics.median(latencies),
        latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))],
        1000 * server_cpu / max(len(answered), 1),
        1000 * client_cpu / requests,
        status_mb("VmRSS", pid),
    )


async def json_route(port: int, pid: int, sentences: list[str], alone: dict[str, str], direction: str) -> JsonRow:
    batches = json_batches(sentences)
    connection = await Connection.open(port)
    try:
        server_cpu, started = cpu_seconds(pid), time.perf_counter()
        answers = []
        for batch in batches:
            body = {"sentences": batch, "direction": direction, "beam": BEAM}
            answers.append(json.loads(await connection.request("POST", "/v1/translate", body))["translations"])
        seconds, server_cpu = time.perf_counter() - started, cpu_seconds(pid) - server_cpu
    finally:
        connection.close()
    identical = all(a == [alone[s] for s in batch] for a, batch in zip(answers, batches, strict=True))
    count = JSON_BATCH * JSON_BATCHES
    return JsonRow(count, seconds, identical, 1000 * server_cpu / count)


def json_batches(sentences: list[str]) -> list[list[str]]:
    return [[sentences[(b * JSON_BATCH + i) % len(sentences)] for i in range(JSON_BATCH)] for b in range(JSON_BATCHES)]


async def one_at_a_time(port: int, sentences: list[str], direction: str) -> dict[str, str]:
    connection = await Connection.open(port)
    try:
        return {s: await ask_page(connection, s, direction) for s in sentences}
    finally:
        connection.close()


@dataclass(frozen=True)
class CliRow:
    """`aiayn translate --input` on the JSON route's lines, from its model loaded to its last line written."""

    sentences: int
    seconds: float
    identical: bool  # every line equals the page's answer alone

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.seconds


@dataclass(frozen=True)
class OperationsCost:
    """The same crowd on `aiayn serve` with its metrics and access log (the defaults) and without, taking turns."""

    visitors: int
    on: list[CrowdRow]
    off: list[CrowdRow]

    @property
    def ratios(self) -> list[float]:
        """Answered/s with them over without, round by round."""
        return [a.answered_per_s / b.answered_per_s for a, b in zip(self.on, self.off, strict=True)]

    @property
    def cpu_ratios(self) -> list[float]:
        """Server CPU per answer with them over without, round by round."""
        return [a.server_cpu_ms / b.server_cpu_ms for a, b in zip(self.on, self.off, strict=True)]


@dataclass(frozen=True)
class ServeBench:
    rss_ready_mb: float
    rows: list[CrowdRow]
    json_row: JsonRow
    floor: CrowdRow  # Gradio's own floor under the goal's crowd
    cli: CliRow
    operations: OperationsCost


@contextmanager
def server_process(arguments: list[str]) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``python -m ARGUMENTS... PORT-FLAGS`` serving on a free loopback port until the block ends: (port, process)."""
    port = free_port()
    command = [sys.executable, "-m", *[str(port) if a == "{port}" else a for a in arguments]]
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_until_serving(server, f"http://{HOST}:{port}/")
        yield port, server
    finally:
        server.terminate()
        server.wait(timeout=30)


def translate_file(model: str, lines: list[str]) -> tuple[float, list[str]]:
    """`aiayn translate --input` on ``lines`` in a process of its own: its lines, and its seconds from the ``model …``
    line ``cmd_translate`` prints once the model is loaded to its progress bar's one newline, once every line is
    written. The start-up is left out as seen, not as another run's time subtracted: a short file's work is smaller
    than one start-up's noise."""
    with tempfile.TemporaryDirectory(prefix="aiayn-bench-cli-") as tmp:
        source, target = Path(tmp) / "in.txt", Path(tmp) / "out.txt"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        command = [sys.executable, "-m", "aiayn.cli", "translate", "--model", model, "--input", str(source)]
        command += ["--output", str(target), "--beam", str(BEAM), "--device", "cpu"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert process.stderr is not None
        said, loaded, written = [], None, None
        for line in process.stderr:  # the bar's redraws end with a carriage return: one line from start to end
            said.append(line)
            if loaded is None and line.startswith(b"model "):
                loaded = time.perf_counter()
            elif loaded is not None and written is None:
                written = time.perf_counter()
        if process.wait() != 0 or loaded is None or written is None:
            raise RuntimeError(f"{' '.join(command)} failed:\n{b''.join(said).decode(errors='replace')}")
        return written - loaded, target.read_text(encoding="utf-8").splitlines()


CLI_RUNS = 2  # the fastest of this many runs


def measure_cli(model: str, lines: list[str], alone: dict[str, str]) -> CliRow:
    runs = [translate_file(model, lines) for _ in range(CLI_RUNS)]
    identical = all(translated == [alone[line] for line in lines] for _, translated in runs)
    return CliRow(len(lines), min(seconds for seconds, _ in runs), identical)


def measure_crowds(model: str, sentences: list[str], visitors: tuple[int, ...] = VISITORS) -> ServeBench:
    """`aiayn serve --model MODEL` in a process of its own, asked in its pair's direction; then Gradio's floor
    under the goal's crowd, and `aiayn translate --input` on the JSON route's lines, in the same run."""
    from aiayn.serve.requests import pair_value

    direction = pair_value(ModelFolder.open(model))
    sample = sentences[:SENTENCES]
    serve = ["aiayn.cli", "serve", "--model", model, "--port", "{port}", "--device", "cpu"]
    with server_process(serve) as (port, server):
        rss_ready = status_mb("VmRSS", server.pid)
        alone = asyncio.run(one_at_a_time(port, sample, direction))
        rows = [asyncio.run(crowd(port, server.pid, n, sample, alone, direction)) for n in visitors]
        json_row = asyncio.run(json_route(port, server.pid, sample, alone, direction))
    at = FLOOR_VISITORS if FLOOR_VISITORS in visitors else max(visitors)
    with server_process(["aiayn.bench.gradio_floor", "{port}"]) as (port, server):
        echoed = {s: s for s in sample}
        floor = asyncio.run(crowd(port, server.pid, at, sample, echoed, "floor"))
    cli = measure_cli(model, [line for batch in json_batches(sample) for line in batch], alone)
    operations = measure_operations(serve, at, sample, alone, direction)
    return ServeBench(rss_ready, rows, json_row, floor, cli, operations)


def measure_json_route(model: str, sentences: list[str]) -> tuple[JsonRow, CliRow]:
    """`aiayn bench --serve --quick`: only the JSON route's one client against `aiayn translate --input` on the same
    lines, in the same run (the lanes' goal: ≥ 0.8×), without the crowds."""
    from aiayn.serve.requests import pair_value

    direction = pair_value(ModelFolder.open(model))
    sample = sentences[:SENTENCES]
    serve = ["aiayn.cli", "serve", "--model", model, "--port", "{port}", "--device", "cpu"]
    with server_process(serve) as (port, server):
        alone = asyncio.run(one_at_a_time(port, sample, direction))
        json_row = asyncio.run(json_route(port, server.pid, sample, alone, direction))
    return json_row, measure_cli(model, [line for batch in json_batches(sample) for line in batch], alone)


def measure_operations(
    serve: list[str], visitors: int, sentences: list[str], alone: dict[str, str], direction: str
) -> OperationsCost:
    """``visitors`` at once on two `aiayn serve` processes, one with its metrics and access log, one without,
    taking turns (the one asked first alternating), ``OPERATIONS_ROUNDS`` times."""
    on: list[CrowdRow] = []
    off: list[CrowdRow] = []
    with server_process(serve) as with_them, server_process([*serve, *WITHOUT_OPERATIONS]) as without:
        for round_number in range(OPERATIONS_ROUNDS):
            turns = [(with_them, on), (without, off)]
            for (port, server), rows in turns if round_number % 2 == 0 else turns[::-1]:
                rows.append(asyncio.run(crowd(port, server.pid, visitors, sentences, alone, direction)))
    return OperationsCost(visitors, on, off)


def serve_report(bench: ServeBench) -> str:
    lines = [
        f"page API, {REQUESTS_PER_VISITOR} one-sentence beam-{BEAM} requests per visitor, one after another; "
        f"server RSS when ready {bench.rss_ready_mb:.0f} MiB",
        "| visitors at once | answered/s | refused | failed | p50 | p90 | server CPU per answer "
        "| client CPU per request | server RSS after | identical to alone |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*bench.rows, bench.floor]:
        who = f"{r.visitors}" if r is not bench.floor else f"{r.visitors}, Gradio's floor"
        lines.append(
            f"| {who} | {r.answered_per_s:.0f} | {r.refused} of {r.requests} | {r.failed} | {r.p50_s:.2f} s "
            f"| {r.p90_s:.2f} s | {r.server_cpu_ms:.1f} ms | {r.client_cpu_ms:.2f} ms | {r.rss_mb:.0f} MiB "
            f"| {'yes' if r.identical else 'NO'} |"
        )
    page = next(r for r in bench.rows if r.visitors == bench.floor.visitors)
    lines += [
        f"the page against Gradio's floor (the same API answering at once) at {page.visitors} visitors: "
        f"{page.answered_per_s / bench.floor.answered_per_s:.2f}× its answers/s (goal ≥ 0.5×), "
        f"{page.server_cpu_ms / bench.floor.server_cpu_ms:.2f}× its server CPU per answer (goal ≤ 2.5×)",
        *json_route_lines(bench.json_row, bench.cli),
        operations_line(bench.operations),
    ]
    return "\n".join(lines)


def json_route_lines(j: JsonRow, cli: CliRow) -> list[str]:
    """The JSON route's one client against `aiayn translate --input` on the same lines."""
    return [
        f"JSON route, one client over HTTP in another process, {JSON_BATCHES} batches of {JSON_BATCH} sentences, "
        f"beam {BEAM}: {j.sentences_per_s:.0f} sentences/s, server CPU {j.server_cpu_ms:.1f} ms per sentence, "
        f"identical to alone: {'yes' if j.identical else 'NO'}",
        f"`aiayn translate --input` on the same {cli.sentences} lines: {cli.sentences_per_s:.0f} sentences/s "
        f"(from its model loaded to its last line written), identical: {'yes' if cli.identical else 'NO'}; "
        f"the JSON route at {j.sentences_per_s / cli.sentences_per_s:.2f}× it (goal ≥ 0.8×)",
    ]


def operations_line(cost: OperationsCost) -> str:
    ratios, cpu = sorted(cost.ratios), sorted(cost.cpu_ratios)
    pairs = zip(cost.on, cost.off, strict=True)
    rates = " / ".join(f"{a.answered_per_s:.0f} vs {b.answered_per_s:.0f}" for a, b in pairs)
    answered = all(r.answered == r.requests and r.identical for r in cost.on + cost.off)
    return (
        f"metrics and access log on against off ({' '.join(WITHOUT_OPERATIONS)}), {cost.visitors} visitors, "
        f"{len(ratios)} rounds taking turns: answered/s {rates}; on/off median {statistics.median(ratios):.3f}× "
        f"({ratios[0]:.3f}–{ratios[-1]:.3f}; goal within 3 %), server CPU per answer on/off median "
        f"{statistics.median(cpu):.3f}× ({cpu[0]:.3f}–{cpu[-1]:.3f}); every request answered and identical: "
        f"{'yes' if answered else 'NO'}"
    )
