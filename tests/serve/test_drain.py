"""`aiayn serve` as operators run it, in a process of its own on a free loopback port: readiness 503 while the
models load, 200 when ready, 503 while draining; and a drain on SIGTERM with 200 requests in flight on the JSON
route and the page: every request accepted before the signal is answered with its translation, every one after
gets 503 with Retry-After, no connection is reset, and the process exits 0 within the grace period."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.testclient import TestClient

import aiayn.serve.drain
from aiayn.bench.crowd import Connection, completed_data
from aiayn.bench.serving import free_port
from aiayn.engines.options import EngineOptions
from aiayn.serve.doors import Doors
from aiayn.serve.drain import Lifecycle, serve_until_stopped
from aiayn.serve.health import health_routes, unhealthy_because
from aiayn.serve.limits import DEFAULT_LIMITS
from aiayn.serve.operations import Message, Operations, Receive, Scope, Send
from aiayn.serve.page import FALLBACK_EXAMPLES, build_app
from aiayn.serve.server import follow_up_events
from aiayn.serve.service import TranslationService

SENTENCES = FALLBACK_EXAMPLES["en"]  # written for the page
PAGE_REQUESTS = JSON_REQUESTS = 100
JSON_SENTENCES = 16  # per JSON request: enough work that most requests are still in flight at the signal
GRACE_S = 120
START_S = 180
BEAM = 4


def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body); a refused connection is status 0."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()
    except (ConnectionError, urllib.error.URLError):
        return 0, {}, b""


def post(port: int, path: str, body: object) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def readiness(port: int) -> str:
    """``refused`` (nothing listens), or /readyz's status and phase: ``503 loading``, ``200 ready``, ..."""
    status, _, body = get(port, "/readyz")
    return "refused" if status == 0 else f"{status} {json.loads(body)['status']}"


def accepted_json_requests(port: int) -> float:
    """JSON requests the server has taken in: those answered, and those whose sentences wait."""
    _, _, text = get(port, "/metrics")
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }
    answered = found.get(("aiayn_http_requests_total", (("route", "/v1/translate"), ("status", "200"))), 0.0)
    return answered + found.get(("aiayn_waiting", (("route", "json"),)), 0.0) / JSON_SENTENCES


async def page_request(port: int, sentence: str, joined: asyncio.Event, count: list[int]) -> str:
    connection = await Connection.open(port)
    try:
        posted = await connection.request("POST", "/gradio_api/call/translate", {"data": [sentence, "en-de", BEAM]})
        count.append(1)
        if len(count) == PAGE_REQUESTS:
            joined.set()
        event = json.loads(posted)["event_id"]
        return str(completed_data(await connection.request("GET", f"/gradio_api/call/translate/{event}"))[0])
    finally:
        connection.close()


async def json_request(port: int, sentences: list[str]) -> list[str]:
    connection = await Connection.open(port)
    try:
        body = {"sentences": sentences, "direction": "en-de", "beam": BEAM}
        return list(json.loads(await connection.request("POST", "/v1/translate", body))["translations"])
    finally:
        connection.close()


def test_readiness_and_a_drain_under_200_requests_in_flight(bundled: dict[str, Path], tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "stderr.txt"
    command = [sys.executable, "-m", "aiayn.cli", "serve", "--model", "en-de", "--port", str(port)]
    command += ["--device", "cpu", "--grace", str(GRACE_S)]
    with log.open("wb") as stderr:
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        seen, deadline = [], time.monotonic() + START_S
        while (not seen or seen[-1] != "200 ready") and time.monotonic() < deadline and server.poll() is None:
            seen.append(readiness(port))
            time.sleep(0.05)
        answered = [state for state in seen if state != "refused"]
        # Loading, then ready (the port passes from the loading server to the page's between them: refused there).
        assert answered[0] == "503 loading" and answered[-1] == "200 ready", log.read_text()
        assert set(answered) == {"503 loading", "200 ready"} and answered.index("200 ready") == len(answered) - 1
        alone = dict(
            zip(
                SENTENCES,
                json.loads(post(port, "/v1/translate", {"sentences": SENTENCES, "beam": BEAM})[2])["translations"],
                strict=True,
            )
        )

        async def drained() -> tuple[list[object], list[object], int, float]:
            joined, count = asyncio.Event(), []
            page = [
                asyncio.create_task(page_request(port, SENTENCES[i % len(SENTENCES)], joined, count))
                for i in range(PAGE_REQUESTS)
            ]
            asked = [[SENTENCES[(i + j) % len(SENTENCES)] for j in range(JSON_SENTENCES)] for i in range(JSON_REQUESTS)]
            json_tasks = [asyncio.create_task(json_request(port, sentences)) for sentences in asked]
            await asyncio.wait_for(joined.wait(), 60)
            while await asyncio.to_thread(accepted_json_requests, port) < JSON_REQUESTS:
                await asyncio.sleep(0.05)
            in_flight = sum(not task.done() for task in page + json_tasks)
            server.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            while await asyncio.to_thread(readiness, port) != "503 draining":
                await asyncio.sleep(0.02)
            later = [await asyncio.to_thread(post, port, "/v1/translate", {"sentences": SENTENCES[:1]})]
            later += [
                await asyncio.to_thread(post, port, "/gradio_api/call/translate", {"data": ["A dog.", "en-de", 4]})
            ]
            later += [await asyncio.to_thread(get, port, "/")]
            pages = await asyncio.gather(*page, return_exceptions=True)
            jsons = await asyncio.gather(*json_tasks, return_exceptions=True)
            assert all(status == 503 and headers.get("retry-after") for status, headers, _ in later), later
            return list(pages), list(jsons), in_flight, signalled

        pages, jsons, in_flight, signalled = asyncio.run(drained())
        exit_code = server.wait(timeout=GRACE_S)
        took = time.monotonic() - signalled
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    said = log.read_text()
    assert in_flight >= PAGE_REQUESTS, f"only {in_flight} requests were in flight at the signal"
    errors = [r for r in pages + jsons if isinstance(r, BaseException)]
    assert not errors, errors[:3]  # no reset connection, no refusal of an accepted request
    assert pages == [alone[SENTENCES[i % len(SENTENCES)]] for i in range(PAGE_REQUESTS)]
    expected = [
        [alone[SENTENCES[(i + j) % len(SENTENCES)]] for j in range(JSON_SENTENCES)] for i in range(JSON_REQUESTS)
    ]
    assert jsons == expected
    assert exit_code == 0 and took < GRACE_S, said
    assert "drained: every accepted request answered" in said


def signals_later(*delays: float) -> threading.Thread:
    """SIGTERM to this process after each of ``delays`` seconds (handled by the main thread, where pytest runs)."""

    def send() -> None:
        for delay in delays:
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_a_second_signal_stops_at_once_and_says_what_was_cut(capsys: pytest.CaptureFixture[str]) -> None:
    lifecycle, closed = Lifecycle(), []
    lifecycle.ready()
    lifecycle.accepted(3)  # never answered
    sender = signals_later(0.2, 0.5)
    started = time.monotonic()
    cut = serve_until_stopped(lifecycle, 60, lambda: closed.append(True))
    sender.join()
    assert cut == 3 and closed == [True] and time.monotonic() - started < 30
    assert lifecycle.not_ready_because() is not None  # draining
    assert "stopped at once: 3 request(s) cut" in capsys.readouterr().err


def test_the_grace_period_ends_a_drain_that_never_finishes(capsys: pytest.CaptureFixture[str]) -> None:
    lifecycle = Lifecycle()
    lifecycle.ready()
    lifecycle.accepted(2)
    lifecycle.answered(1)
    sender = signals_later(0.2)
    started = time.monotonic()
    assert serve_until_stopped(lifecycle, 1.0, lambda: None) == 1
    sender.join()
    assert 1.0 <= time.monotonic() - started < 30
    assert "stopped after the grace period: 1 request(s) cut" in capsys.readouterr().err


@pytest.fixture(scope="module")
def service(bundled: dict[str, Path]) -> TranslationService:
    service = TranslationService(EngineOptions(device="cpu"))
    service.model("en-de")
    return service


def test_the_follow_up_events_are_the_pages_marks_attention_and_clearing(service: TranslationService) -> None:
    app = build_app(service, ["en-de"])
    follow_ups = follow_up_events(app)
    names = sorted(app.fns[fn_id].name for fn_id in follow_ups)
    assert names == ["<lambda>", "cleared", "show_attention", "show_marks"]  # <lambda>: a failed file's
    assert not follow_ups & {fn_id for fn_id, fn in app.fns.items() if fn.api_name in ("translate", "translate_file")}


def test_readiness_turns_503_when_a_search_worker_dies(service: TranslationService) -> None:
    """Not Ray's check alone: /readyz itself asks the search workers, so that a load balancer stops sending."""
    lifecycle = Lifecycle()
    lifecycle.ready(functools.partial(unhealthy_because, service))
    client = TestClient(Starlette(routes=health_routes(lifecycle)))
    assert client.get("/readyz").status_code == 200
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    workers = service.models["en-de"].batcher.workers
    workers.append(dead)
    try:
        answer = client.get("/readyz")
    finally:
        workers.remove(dead)
    assert answer.status_code == 503 and answer.headers["retry-after"]
    assert answer.json() == {"status": "unhealthy", "reason": "en-de: a search worker thread has died"}


class Door:
    """The page server's middlewares (the operations', the doors' inside it, as ``operations.operated`` stacks them)
    over a stand-in for Gradio, on an event loop of its own, as the drain's thread sees it: each request a task; a
    join answered at once, anything else held open until ``close``d."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.held: dict[str, asyncio.Event] = {}
        self.operations = Operations(Doors(self.app, DEFAULT_LIMITS), lifecycle, None)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if not path.endswith("/queue/join"):
            await self.held.setdefault(path, asyncio.Event()).wait()
        await send({"type": "http.response.body", "body": b'{"event_id": "E"}'})

    def open(self, method: str, path: str, body: object = None, query: bytes = b"") -> Future[int]:
        """The request's status, once answered (a held one: once closed)."""
        data = b"" if body is None else json.dumps(body).encode()

        async def ask() -> int:
            sent: list[Message] = []

            async def receive() -> Message:
                return {"type": "http.request", "body": data, "more_body": False}

            async def send(message: Message) -> None:
                sent.append(message)

            scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": []}
            await self.operations(scope, receive, send)
            return int(sent[0]["status"])

        asked = asyncio.run_coroutine_threadsafe(ask(), self.loop)
        time.sleep(0.05)  # taken in
        return asked

    def ask(self, method: str, path: str, body: object = None) -> int:
        return self.open(method, path, body).result(timeout=10)

    def close(self, path: str) -> None:
        self.loop.call_soon_threadsafe(lambda: self.held.setdefault(path, asyncio.Event()).set())
        time.sleep(0.05)


def join(session: str, fn_index: int = 0) -> dict[str, object]:
    return {"data": ["A dog."], "fn_index": fn_index, "session_hash": session}


JOIN, DATA = "/gradio_api/queue/join", "/gradio_api/queue/data"


def test_no_client_holds_a_drain_past_the_accepted_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A join whose stream never opens (a tab closed between them), an upload, its progress stream and a slow
    download: none is waited for. A page request whose stream is open is, to its end."""
    monkeypatch.setattr(aiayn.serve.drain, "STREAM_OPENS_S", 0.3)
    lifecycle = Lifecycle()
    lifecycle.ready()
    door = Door(lifecycle)
    assert door.ask("POST", JOIN, join("abandoned")) == 200
    assert door.ask("POST", JOIN, join("streamed")) == 200
    stream = door.open("GET", DATA, query=b"session_hash=streamed")
    held = [door.open("POST", "/gradio_api/upload"), door.open("GET", "/gradio_api/upload_progress")]
    held.append(door.open("GET", "/gradio_api/file=/tmp/aiayn-downloads-x/y/captions.de.txt"))
    assert lifecycle.open_work == 2  # the two page requests, nothing else
    lifecycle.drain()
    assert lifecycle.wait_answered(1.5) == 1  # the abandoned one let go after STREAM_OPENS_S; the streamed waits
    door.close(DATA)
    assert stream.result(timeout=10) == 200 and lifecycle.wait_answered(1.0) == 0
    assert not any(request.done() for request in held)  # still open, and never waited for


def test_a_closed_heartbeat_lets_go_of_no_page_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tab's heartbeat closes while its page request waits in Gradio's queue, its stream open: the drain still
    waits for that request (a heartbeat taken for the session's stream would let it go)."""
    monkeypatch.setattr(aiayn.serve.drain, "STREAM_OPENS_S", 0.1)
    lifecycle = Lifecycle()
    lifecycle.ready()
    door = Door(lifecycle)
    heartbeat = door.open("GET", "/gradio_api/heartbeat/tab")
    assert door.ask("POST", JOIN, join("tab")) == 200
    stream = door.open("GET", DATA, query=b"session_hash=tab")
    door.close("/gradio_api/heartbeat/tab")
    assert heartbeat.result(timeout=10) == 200
    lifecycle.drain()
    assert lifecycle.wait_answered(0.5) == 1
    door.close(DATA)
    assert stream.result(timeout=10) == 200 and lifecycle.wait_answered(1.0) == 0


def test_an_accepted_requests_follow_up_events_are_answered_while_draining() -> None:
    """The page's marks and attention follow an accepted translation as events of their own: joined while
    draining, they are admitted, as many as the page has, from the sessions whose requests were accepted alone."""
    lifecycle = Lifecycle()
    lifecycle.ready()
    lifecycle.follow_ups = frozenset({7, 8})
    door = Door(lifecycle)
    assert door.ask("POST", JOIN, join("tab", 0)) == 200
    lifecycle.drain()
    assert door.ask("POST", JOIN, join("other", 7)) == 503  # no request of its own accepted
    assert door.ask("POST", JOIN, join("tab", 0)) == 503  # a new translation
    assert [door.ask("POST", JOIN, join("tab", fn)) for fn in (7, 8, 7)] == [200, 200, 503]  # its two, no more
    assert lifecycle.open_work == 3  # the translation and its two follow-ups: waited for
    download = door.open("GET", "/gradio_api/file=/tmp/aiayn-downloads-x/y/captions.de.txt")
    door.close("/gradio_api/file=/tmp/aiayn-downloads-x/y/captions.de.txt")
    assert download.result(timeout=10) == 200  # a translated file still downloads
    assert door.ask("GET", "/") == 503
