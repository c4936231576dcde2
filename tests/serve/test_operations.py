"""What operators read of a page server under a crowd: ``/metrics`` in Prometheus' format, parsed by
``prometheus_client``'s own parser while the crowd runs, counting after it exactly what the crowd sent and got by
status; the health routes; and the access log's lines, the user's text only when asked.

The server runs in this process on a free loopback port with the operators' middleware, its metrics in a registry
of their own; the visitors are the bench's raw asyncio client.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.middleware import Middleware

import aiayn.serve.drain
from aiayn.bench.crowd import Connection, CrowdRow, HttpError, ask_page, crowd, one_at_a_time
from aiayn.bench.serving import free_port
from aiayn.engines.options import EngineOptions
from aiayn.serve import metrics
from aiayn.serve.access_log import AccessLine, AccessLog
from aiayn.serve.api import json_route
from aiayn.serve.doors import Message, Receive, Scope, Send
from aiayn.serve.drain import Lifecycle
from aiayn.serve.health import health_routes
from aiayn.serve.operations import Operations
from aiayn.serve.page import FALLBACK_EXAMPLES, build_app
from aiayn.serve.requests import models_served
from aiayn.serve.server import launch
from aiayn.serve.service import TranslationService

SENTENCES = FALLBACK_EXAMPLES["en"]  # written for the page
VISITORS = 30  # each sends the bench's 5 requests, one after another
CALL, STREAM = "/gradio_api/call/{api_name}", "/gradio_api/call/{api_name}/{event_id}"


@dataclass
class Served:
    port: int
    lifecycle: Lifecycle
    metrics: metrics.Metrics
    log: io.StringIO
    access_log: AccessLog  # its thread writes ``log``: flushed before a test reads it afresh


@pytest.fixture(scope="module")
def served(bundled: dict[str, Path]) -> Iterator[Served]:
    fresh = metrics.Metrics()
    metrics.RECORDER.metrics = fresh
    lifecycle, log = Lifecycle(), io.StringIO()
    service = TranslationService(EngineOptions(device="cpu"))
    page, port = build_app(service, ["en-de"]), free_port()
    routes = [json_route(service), *health_routes(lifecycle), metrics.metrics_route(fresh)]
    access_log = AccessLog("json", out=log)
    middleware = [Middleware(Operations, lifecycle=lifecycle, log=access_log)]
    launch(page, port=port, routes=routes, middleware=middleware)
    lifecycle.ready()
    metrics.serving(models_served(service))
    try:
        yield Served(port, lifecycle, fresh, log, access_log)
    finally:
        page.close()
        metrics.RECORDER.metrics = None


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``/metrics`` as ``prometheus_client``'s parser reads it: (name, labels) → value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=")
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def post_json(port: int, body: bytes) -> int:
    connection = await Connection.open(port)
    try:
        await connection.request("POST", "/v1/translate", body)
        return 200
    except HttpError as err:
        return err.status
    finally:
        connection.close()


def test_a_scrape_under_load_parses_and_the_counters_equal_what_the_crowd_sent_and_got(served: Served) -> None:
    port = served.port
    before = scrape(port)
    alone = asyncio.run(one_at_a_time(port, SENTENCES, "en-de"))
    good = json.dumps({"sentences": SENTENCES[:4], "direction": "en-de"}).encode()
    bodies = [good] * 6 + [b"{not json"] * 2 + [b'{"sentences": ["a"], "colour": 1}'] * 3

    async def crowd_and_scrapes() -> tuple[CrowdRow, list[int], list[Samples]]:
        scrapes = []

        async def scraping() -> None:
            for _ in range(5):
                await asyncio.sleep(0.3)
                scrapes.append(await asyncio.to_thread(scrape, port))

        row, statuses, _ = await asyncio.gather(
            asyncio.to_thread(asyncio.run, crowd(port, os.getpid(), VISITORS, SENTENCES, alone, "en-de")),
            asyncio.gather(*(post_json(port, body) for body in bodies)),
            scraping(),
        )
        return row, list(statuses), scrapes

    row, statuses, during = asyncio.run(crowd_and_scrapes())
    asked = len(SENTENCES) + VISITORS * 5  # alone first, then the crowd: each a POST and its stream
    stream_200 = ("aiayn_http_requests_total", (("route", STREAM), ("status", "200")))
    after, deadline = scrape(port), time.monotonic() + 10
    while after.get(stream_200, 0) - before.get(stream_200, 0) < asked and time.monotonic() < deadline:
        after = scrape(port)  # a stream is counted once its last byte is sent: just after its client read it
    assert during and all(("aiayn_http_requests_total", (("route", CALL), ("status", "200"))) in s for s in during)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert row.answered == VISITORS * 5 and row.identical
    assert grew("aiayn_http_requests_total", route=CALL, status="200") == asked
    assert grew("aiayn_http_requests_total", route=STREAM, status="200") == asked
    for status in (200, 400, 422):
        sent = statuses.count(status)
        assert sent and grew("aiayn_http_requests_total", route="/v1/translate", status=str(status)) == sent
    assert grew("aiayn_http_request_duration_seconds_count", route="/v1/translate") == len(bodies)
    assert (
        grew("aiayn_refusals_total", reason="bad_json") == 2 and grew("aiayn_refusals_total", reason="bad_field") == 3
    )
    sentences = asked + 6 * 4
    assert grew("aiayn_translated_sentences_total", direction="en-de") == sentences
    assert grew("aiayn_translated_target_tokens_total", direction="en-de") > sentences  # words and </s>
    assert grew("aiayn_search_batch_sentences_sum") == sentences  # one sentence a piece: none is cut in clauses
    assert 0 < grew("aiayn_search_batch_sentences_count") < sentences  # searched together
    assert grew("aiayn_search_duration_seconds_count") == grew("aiayn_search_batch_sentences_count")
    assert value(after, "aiayn_waiting", route="page") == value(after, "aiayn_waiting", route="json") == 0
    served_models = [(dict(labels), v) for (name, labels), v in after.items() if name == "aiayn_model_info"]
    device = "CPUExecutionProvider"
    assert served_models == [
        ({"model": "en-de", "direction": "en-de", "engine": "onnx", "device": device, "variant": "fp32"}, 1)
    ]
    assert value(after, "process_resident_memory_bytes") > 0 and value(after, "process_cpu_seconds_total") > 0


def test_the_health_routes_say_ready_and_serving(served: Served) -> None:
    for path, answer in [("/healthz", {"status": "serving"}), ("/readyz", {"status": "ready"})]:
        with urllib.request.urlopen(f"http://127.0.0.1:{served.port}{path}", timeout=10) as got:
            assert (got.status, json.loads(got.read())) == (200, answer)


def test_the_access_log_has_a_line_a_request_without_the_users_text(served: Served) -> None:
    served.access_log.flush()  # the earlier tests' lines written before the log is cleared
    served.log.truncate(0)
    served.log.seek(0)
    body = json.dumps({"sentences": ["A girl jumps into the pool.", "Two dogs play."], "direction": "en-de"})
    assert asyncio.run(post_json(served.port, body.encode())) == 200
    answer = asyncio.run(page_answer(served.port, "A woman sits on a bench and reads a book."))
    assert answer
    deadline = time.monotonic() + 10  # a stream's line is written once its last byte is sent: after the client read it
    while served.log.getvalue().count("\n") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    lines = [json.loads(line) for line in served.log.getvalue().splitlines()]
    routes = [line["route"] for line in lines]
    assert routes == ["/v1/translate", CALL, STREAM]
    translate = lines[0]
    assert translate["status"] == 200 and translate["sentences"] == 2 and translate["ms"] > 0
    assert set(translate) == {"time", "method", "route", "status", "sentences", "ms"}
    assert "girl" not in served.log.getvalue() and "bench" not in served.log.getvalue()


async def page_answer(port: int, sentence: str) -> str:
    connection = await Connection.open(port)
    try:
        return await ask_page(connection, sentence, "en-de")
    finally:
        connection.close()


def test_the_access_log_has_the_users_text_only_when_asked() -> None:
    line = AccessLine("POST", "/v1/translate", 200, 12.34, 1, ["Zwei Hunde."])
    assert written(AccessLog("text"), line).endswith(" POST /v1/translate 200 sentences=1 ms=12.3\n")
    assert written(AccessLog("text", with_text=True), line).endswith(' ms=12.3 text=["Zwei Hunde."]\n')
    assert json.loads(written(AccessLog("json", with_text=True), line))["text"] == ["Zwei Hunde."]


def written(log: AccessLog, line: AccessLine) -> str:
    """What ``log`` writes of ``line``, once its thread has written it."""
    log.out = out = io.StringIO()
    log.write(line)
    assert log.flush()
    return out.getvalue()


def test_the_docs_kubernetes_probes_and_prometheus_scrape_name_what_the_server_serves() -> None:
    """docs/serve.md's Deployment runs a command the CLI takes, probes the health routes on the port it serves, and
    lets the drain end before Kubernetes' SIGKILL; its scrape asks the metrics' path."""
    import re

    import yaml

    from aiayn.cli import build_parser
    from aiayn.serve.health import LIVE_PATH, READY_PATH

    text = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text(encoding="utf-8")
    operating = text.split("## Operating it", 1)[1].split("\n## ", 1)[0]
    deployment, scrape_config = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", operating, re.S)]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["aiayn", "serve"]
    args = build_parser().parse_args(command[1:])
    (port,) = container["ports"]
    assert port["containerPort"] == args.port
    assert container["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": port["name"]}
    assert container["livenessProbe"]["httpGet"] == {"path": LIVE_PATH, "port": port["name"]}
    assert args.grace < pod["terminationGracePeriodSeconds"] and not args.no_metrics
    assert (
        deployment["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (job,) = scrape_config["scrape_configs"]
    assert job["metrics_path"] == metrics.PATH
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{args.port}"]


class Asked:
    """The middleware over an app that answers every request 200, a join with an event id: what each request got."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.events = 0

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            self.events += 1
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": json.dumps({"event_id": f"E{self.events}"}).encode()})

        self.operations = Operations(app, lifecycle, None)

    def __call__(self, method: str, path: str, query: bytes = b"") -> tuple[int, dict[str, str]]:
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": []}
        asyncio.run(self.operations(scope, receive, send))
        start = sent[0]
        return start["status"], {k.decode(): v.decode() for k, v in start.get("headers", [])}


def test_a_page_request_is_work_from_its_join_to_its_stream_and_a_drain_lets_only_streams_in() -> None:
    lifecycle = Lifecycle()
    lifecycle.ready()
    asked = Asked(lifecycle)
    assert asked("POST", "/gradio_api/call/translate")[0] == 200 and lifecycle.open_work == 1  # accepted: E1
    assert asked("POST", "/gradio_api/call/translate")[0] == 200 and lifecycle.open_work == 2  # E2
    assert asked("GET", "/gradio_api/call/translate/E1")[0] == 200 and lifecycle.open_work == 1  # answered
    lifecycle.drain()
    status, headers = asked("POST", "/v1/translate")
    assert (status, headers["retry-after"]) == (503, "5") and asked.events == 3  # refused before the app
    assert asked("POST", "/gradio_api/call/translate")[0] == 503 and lifecycle.open_work == 1
    assert asked("GET", "/readyz")[0] == 200  # the operators' routes still answer (this app says 200)
    assert asked("GET", "/gradio_api/call/translate/E2")[0] == 200 and lifecycle.open_work == 0


def test_a_page_request_whose_stream_never_opens_is_forgotten_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    lifecycle = Lifecycle()
    asked = Asked(lifecycle)
    for _ in range(3):
        asked("POST", "/gradio_api/call/translate")
    assert lifecycle.open_work == 3 and len(asked.operations.pages.events) == 3
    monkeypatch.setattr(aiayn.serve.drain, "ABANDONED_S", 0.0)
    asked("POST", "/gradio_api/call/translate")  # the three before it, never streamed, are let go
    assert lifecycle.open_work == 1 and list(asked.operations.pages.events) == ["E4"]


def test_a_page_tabs_heartbeat_is_never_work_a_drain_waits_for() -> None:
    """Gradio keeps ``/gradio_api/heartbeat/{session}`` open as long as the visitor's tab: counted as work, it held
    every drain to its grace period and was reported as a request cut."""
    lifecycle = Lifecycle()
    lifecycle.ready()
    opened = asyncio.Event()
    during: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        opened.set()
        await asyncio.sleep(0.05)  # the stream stays open; what the drain sees meanwhile:
        during.append(lifecycle.open_work)
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    scope = {"type": "http", "method": "GET", "path": "/gradio_api/heartbeat/S1", "query_string": b"", "headers": []}
    asyncio.run(Operations(app, lifecycle, None)(scope, receive, send))
    assert opened.is_set() and during == [0] and lifecycle.open_work == 0
