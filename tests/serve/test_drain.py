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
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.testclient import TestClient

from aiayn.bench.crowd import Connection, completed_data
from aiayn.bench.serving import free_port
from aiayn.engines.options import EngineOptions
from aiayn.serve.drain import Lifecycle, serve_until_stopped
from aiayn.serve.health import health_routes, unhealthy_because
from aiayn.serve.page import FALLBACK_EXAMPLES
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


def test_readiness_turns_503_when_a_search_worker_dies(bundled: dict[str, Path]) -> None:
    """Not Ray's check alone: /readyz itself asks the search workers, so that a load balancer stops sending."""
    service = TranslationService(EngineOptions(device="cpu"))
    service.model("en-de")
    lifecycle = Lifecycle()
    lifecycle.ready(functools.partial(unhealthy_because, service))
    client = TestClient(Starlette(routes=health_routes(lifecycle)))
    assert client.get("/readyz").status_code == 200
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    service.models["en-de"].batcher.workers.append(dead)
    answer = client.get("/readyz")
    assert answer.status_code == 503 and answer.headers["retry-after"]
    assert answer.json() == {"status": "unhealthy", "reason": "en-de: a search worker thread has died"}
