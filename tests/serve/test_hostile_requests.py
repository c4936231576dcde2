"""The JSON route against a hostile or careless client, in this process over fakes of the service: every body it
cannot use answered with its 4xx (or 503) and one JSON message, named by a stable reason; at most
``Limits.max_waiting`` sentences admitted at once; a request past its time answered 503, and its searches dropped
from the batcher. (The same route in a server process, a body of 1 GB: test_hostile_server.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from test_api_body import Answer, Shouting, body

from aiayn.search.output import Output
from aiayn.search.translator import SearchSettings
from aiayn.serve import metrics
from aiayn.serve.api import PATH, json_route
from aiayn.serve.batching import SearchBatcher
from aiayn.serve.limits import DEFAULT_LIMITS, MAX_BODY_BYTES, STATUS, Limits, Reason
from aiayn.serve.service import TimedOut, TranslationService

JSON = {"content-type": "application/json"}
NOT_JSON = "the body is not JSON: "


def client(service: Any, limits: Limits = DEFAULT_LIMITS) -> TestClient:
    return TestClient(FastAPI(routes=[json_route(service, limits)]))


def refusal(answer: Any) -> tuple[int, str]:
    """A refused answer's status and message, once it is seen to be one JSON object ``{"error": ...}``."""
    assert answer.headers["content-type"] == "application/json" and list(answer.json()) == ["error"]
    return answer.status_code, answer.json()["error"]


def test_each_refusal_has_a_stable_reason_and_its_status() -> None:
    assert {reason.value: status for reason, status in STATUS.items()} == {
        "media_type": 415,
        "too_large": 413,
        "bad_json": 400,
        "bad_field": 422,
        "not_translated": 422,
        "queue_full": 503,
        "timeout": 503,
        "page_queue_full": 503,
        "draining": 503,
        "no_key": 403,
        "key_rate": 429,
        "key_chars": 413,
    }
    assert set(STATUS) == set(Reason)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"content-type": "text/plain"}, "the body must be sent as Content-Type: application/json, not Content-Type "),
        ({"content-type": "application/x-www-form-urlencoded"}, "not Content-Type application/x-www-form-urlencoded"),
        ({}, "the body must be sent as Content-Type: application/json, not no Content-Type"),
    ],
)
def test_a_body_not_sent_as_json_is_refused_with_415(headers: dict[str, str], message: str) -> None:
    service = Shouting()
    answer = client(service).post(PATH, content=body(sentences=["a"]), headers=headers)
    status, error = refusal(answer)
    assert status == 415 and message in error and service.requests == []
    assert answer.headers["connection"] == "close"  # its body unread: the server reads no more of it
    ok = client(service).post(
        PATH, content=body(sentences=["a"]), headers={"content-type": "Application/JSON; charset=utf-8"}
    )
    assert ok.status_code == 200


def test_a_body_over_the_limit_is_refused_by_its_length_or_as_it_streams() -> None:
    service = Shouting()
    over = client(service).post(PATH, content=b" " * (MAX_BODY_BYTES + 1), headers=JSON)
    assert refusal(over) == (413, f"the body has {MAX_BODY_BYTES + 1} bytes; at most {MAX_BODY_BYTES}")
    assert over.headers["connection"] == "close" and "retry-after" not in over.headers
    sent: list[int] = []

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for _ in range(MAX_BODY_BYTES // 1000 + 1):
            sent.append(1000)
            yield b" " * 1000

    status, error = refusal(client(service).post(PATH, content=chunks(), headers=JSON))
    assert (status, error) == (413, f"the body has more than {MAX_BODY_BYTES} bytes; at most {MAX_BODY_BYTES}")
    small = Limits(max_body_bytes=100)
    status, error = refusal(client(service, small).post(PATH, content=body(sentences=["a" * 100]), headers=JSON))
    assert (status, error) == (413, "the body has 119 bytes; at most 100")
    assert service.requests == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "the body is not JSON this route reads: it is nested too deep"),
        (b'{"sentences": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "the body is not JSON this route reads: it is "),
        (b'{"sentences": ["a"], "beam": ' + b"9" * 400 + b"}", NOT_JSON + "a number of 400 digits is out of range "),
        (b'{"sentences": ["a"], "beam": -' + b"1" * 5000 + b"}", NOT_JSON + "a number of 5000 digits is out of "),
        (b'{"sentences": ["a"], "beam": 1e999}', NOT_JSON + "the number 1e999 is out of range"),
        (b'{"sentences": ["a"], "beam": 1' + b"0" * 400 + b".5}", NOT_JSON + "the number 100000000000000000… is out "),
        (b'{"sentences": ["a"], "beam": 1' + b"0" * 13 + b"e999}", NOT_JSON + "the number 10000000000000e999 is out "),
        (b'{"sentences": ["a"], "beam": NaN}', NOT_JSON + "NaN is not a JSON number"),
        (b'{"sentences": ["a"], "beam": -Infinity}', NOT_JSON + "-Infinity is not a JSON number"),
        (b'{"sentences": ["a"]', NOT_JSON),
        (b'{"sentences": ["\xff"]}', NOT_JSON),
        (b"", NOT_JSON),
    ],
)
def test_a_body_that_is_not_json_the_route_reads_is_refused_with_400(raw: bytes, message: str) -> None:
    service = Shouting()
    status, error = refusal(client(service).post(PATH, content=raw, headers=JSON))
    assert status == 400 and error.startswith(message) and len(error) < 300 and "\n" not in error
    assert service.requests == []


def test_a_float_is_a_number_however_it_is_written() -> None:
    service = Shouting()
    answer = client(service).post(PATH, content=b'{"sentences": ["a"], "beam": 4.' + b"0" * 100 + b"}", headers=JSON)
    assert answer.status_code == 200 and answer.json()["beam"] == 4


def test_the_route_reads_within_the_limits_it_was_given() -> None:
    service, limits = Shouting(), Limits(max_sentences=2, max_waiting=2, max_number_digits=3)
    status, error = refusal(client(service, limits).post(PATH, content=body(sentences=["a"] * 3), headers=JSON))
    assert (status, error) == (422, "sentences has 3 items; from 1 to 2 are translated per request")
    status, error = refusal(client(service, limits).post(PATH, content=body(sentences=["a"], beam=1000), headers=JSON))
    assert (status, error) == (
        400,
        NOT_JSON + "a number of 4 digits is out of range (at most 3)",
    )


def test_a_body_in_many_chunks_is_counted_whole() -> None:
    service = Shouting()
    parts = [{"type": "http.request", "body": b" " * 1000, "more_body": True} for _ in range(MAX_BODY_BYTES // 1000)]
    parts += [{"type": "http.request", "body": b"[]", "more_body": False}]
    start, answer = asked_by_parts(json_route(service), parts)  # type: ignore[arg-type]
    assert start["status"] == 413 and json.loads(answer["body"]) == {
        "error": f"the body has more than {MAX_BODY_BYTES} bytes; at most {MAX_BODY_BYTES}"
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sentences": ["a"], "beam": True}, "beam size must be a whole number from 1 to 8, got True"),
        ({"sentences": ["a"], "beam": "4"}, "got '4'"),
        ({"sentences": ["a"], "beam": [4]}, "got [4]"),
        ({"sentences": ["a"], "beam": {"size": 4}}, "got {'size': 4}"),
        ({"sentences": ["a"], "beam": 10**18 - 1}, "got 999999999999999999"),
        ({"sentences": ["a"], "beam": -1}, "got -1"),
        ({"sentences": ["a"], "direction": 5}, "5 is not in the list of choices: en-de, de-en"),
        ({"sentences": ["a"], "direction": ["en-de"]}, "is not in the list of choices"),
        ({"sentences": ["a"], "direction": None}, "None is not in the list of choices"),
        ({"sentences": {"a": 1}}, "sentences must be a list of strings"),
        ({"sentences": [["a"]]}, "sentences must be a list of strings"),
        ({"sentences": None}, "sentences must be a list of strings"),
        ({"sentences": ["a"], "Sentences": ["b"]}, "unknown field(s) Sentences"),
        ([{"sentences": ["a"]}], "the body must be a JSON object"),
        ("a dog", "the body must be a JSON object"),
    ],
)
def test_a_field_of_the_wrong_type_or_value_is_refused_with_422(fields: Any, message: str) -> None:
    service = Shouting()
    raw = body(**fields) if isinstance(fields, dict) else json.dumps(fields).encode()
    status, error = refusal(client(service).post(PATH, content=raw, headers=JSON))
    assert status == 422 and message in error and service.requests == []


class Held(Shouting):
    """The service with every translation held until ``release`` is set; ``held`` counts those held."""

    def __init__(self) -> None:
        super().__init__()
        self.held, self.release = threading.Semaphore(0), threading.Event()

    def translate_many(
        self, requests: list[tuple[str, str, int | None]], timeout_s: float, n_best: int = 1
    ) -> list[Answer]:
        self.held.release()
        assert self.release.wait(30)
        return super().translate_many(requests, timeout_s)


def test_beyond_the_waiting_sentences_a_request_is_refused_with_503_and_retry_after() -> None:
    service, limits = Held(), Limits(max_waiting=300, retry_after_s=7)
    with client(service, limits) as route, ThreadPoolExecutor(2) as pool:
        for _ in range(2):  # the second time, as the first: what was answered left the count
            service.release = threading.Event()
            first = pool.submit(route.post, PATH, content=body(sentences=["a"] * 256), headers=JSON)
            fits = pool.submit(route.post, PATH, content=body(sentences=["b"] * 44), headers=JSON)
            assert service.held.acquire(timeout=10) and service.held.acquire(timeout=10)  # 300 sentences wait
            over = route.post(PATH, content=body(sentences=["c"]), headers=JSON)
            assert refusal(over) == (503, "the server is busy: 300 sentences wait (at most 300); try again shortly")
            assert over.headers["retry-after"] == "7" and "connection" not in over.headers  # its body was read
            service.release.set()
            assert first.result().status_code == 200 and len(first.result().json()["translations"]) == 256
            assert fits.result().status_code == 200
            too_many = route.post(PATH, content=body(sentences=["c"] * 257), headers=JSON)  # refused, never counted
            assert too_many.status_code == 422 and "retry-after" not in too_many.headers


@pytest.fixture
def counted() -> Iterator[metrics.Metrics]:
    """The process's metrics, a fresh registry of them, for one test."""
    fresh = metrics.RECORDER.metrics = metrics.Metrics()
    try:
        yield fresh
    finally:
        metrics.RECORDER.metrics = None


def test_each_refusal_is_counted_once_under_its_reason_and_the_waiting_gauge_follows_the_sentences(
    counted: metrics.Metrics,
) -> None:
    def count(reason: str) -> float:
        return counted.registry.get_sample_value("aiayn_refusals_total", {"reason": reason}) or 0.0

    def waiting() -> float | None:
        return counted.registry.get_sample_value("aiayn_waiting", {"route": "json"})

    service, limits = Held(), Limits(max_waiting=300)
    service.release.set()
    with client(service, limits) as route, ThreadPoolExecutor(1) as pool:
        sent = [
            route.post(PATH, content=body(sentences=["a"]), headers={"content-type": "text/plain"}),
            route.post(PATH, content=b" " * (MAX_BODY_BYTES + 1), headers=JSON),
            route.post(PATH, content=b"{not json", headers=JSON),
            route.post(PATH, content=body(sentences=["a"], colour=1), headers=JSON),
            route.post(PATH, content=body(sentences=["a!"]), headers=JSON),
        ]
        assert [answer.status_code for answer in sent] == [415, 413, 400, 422, 422]
        assert waiting() == 0  # the refused line's sentence was admitted, and left
        service.held, service.release = threading.Semaphore(0), threading.Event()
        held = pool.submit(route.post, PATH, content=body(sentences=["b"] * 256), headers=JSON)
        assert service.held.acquire(timeout=10) and waiting() == 256
        assert route.post(PATH, content=body(sentences=["c"] * 45), headers=JSON).status_code == 503
        service.release.set()
        assert held.result().status_code == 200 and waiting() == 0
    stalled = client(Stalled(), limits).post(PATH, content=body(sentences=["a"]), headers=JSON)
    assert stalled.status_code == 503
    reasons = ["media_type", "too_large", "bad_json", "bad_field", "not_translated", "queue_full", "timeout"]
    assert {reason: count(reason) for reason in reasons} == dict.fromkeys(reasons, 1.0)
    assert count("page_queue_full") == count("draining") == 0
    translated = counted.registry.get_sample_value("aiayn_translated_sentences_total", {"direction": "en-de"})
    assert translated == 256  # the refused request's line is not counted as translated


def test_the_waiting_bound_holds_one_request_at_least() -> None:
    with pytest.raises(ValueError, match="^--max-waiting must be at least 256 \\(one request's sentences\\), got 255$"):
        Limits(max_waiting=255)
    with pytest.raises(ValueError, match="^--request-timeout must be more than 0 seconds, got 0$"):
        Limits(request_timeout_s=0)


class Stalled(Shouting):
    """The service as a busy server's: no answer within the time it is given; it keeps the times it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float] = []

    def translate_many(
        self, requests: list[tuple[str, str, int | None]], timeout_s: float, n_best: int = 1
    ) -> list[Answer]:
        self.timeouts.append(timeout_s)
        raise TimedOut(f"not answered within {timeout_s} s")


def test_a_request_past_its_time_is_answered_503_with_retry_after() -> None:
    service = Stalled()
    answer = client(service, Limits(request_timeout_s=2.5)).post(PATH, content=body(sentences=["a"]), headers=JSON)
    status, error = refusal(answer)
    assert (status, answer.headers["retry-after"]) == (503, str(DEFAULT_LIMITS.retry_after_s))
    assert error == "not answered within 2.5 s: the server is busy; try again shortly"
    assert len(service.timeouts) == 1 and 0 < service.timeouts[0] <= 2.5  # what is left of it once a thread runs it


class Gated:
    """A translator whose searches wait for ``gate``; it records each search's sources and whether anyone still
    waited for them when it ran."""

    lanes = 1

    def __init__(self) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        self.searched: list[tuple[list[list[int]], bool]] = []

    def outputs(self, src_ids: Sequence[Sequence[int]], settings: SearchSettings, wanted: Any) -> list[Output]:
        self.entered.set()
        assert self.gate.wait(30)
        self.searched.append(([list(ids) for ids in src_ids], wanted()))
        return [Output([7], -1.0, True, [-1.0])] * len(src_ids)


class Counted:
    """A loaded model as the service uses it: a text is one source of its length, searched by ``batcher``."""

    def __init__(self, translator: Gated) -> None:
        self.batcher = SearchBatcher(translator)  # type: ignore[arg-type]

    def prepare(self, text: str) -> Any:
        return SimpleNamespace(src_ids=[[len(text), 2]])

    def settings(self, beam_size: int | None, n_best: int = 1) -> SearchSettings:
        return SearchSettings()

    def assemble(self, prepared: Any, outputs: list[Output], latency_ms: float) -> list[Output]:
        return outputs


def test_a_request_past_its_time_drops_its_searches_and_the_worker_goes_on() -> None:
    gated = Gated()
    service = TranslationService()
    service.models["m"] = Counted(gated)  # type: ignore[assignment]
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(service.translate_many, [("aaaa", "m", None)], 0.5)
        assert gated.entered.wait(30)  # its search runs (held at the gate)
        with pytest.raises(TimedOut, match="^not answered within 0.2 s$"):
            service.translate_many([("bb", "m", None)], 0.2)  # queued behind it
        with pytest.raises(TimedOut, match="^not answered within 0.5 s$"):
            running.result()
    gated.gate.set()
    assert service.translate_many([("ccc", "m", None)], 30) == [[Output([7], -1.0, True, [-1.0])]]
    # The running search learnt that nobody waits for it (the translator then skips its length batches); the
    # queued one was never searched.
    assert gated.searched == [([[4, 2]], False), ([[3, 2]], True)]
    with pytest.raises(TimedOut):
        service.translate_many([("dd", "m", None)], 0)  # no time left when its thread started: never queued
    assert gated.searched[2:] == []


def asked_by_parts(route: Any, parts: list[dict[str, Any]], length: int | None = None) -> tuple[Any, Any]:
    """``route`` asked by a client that sends its body as ``parts`` (ASGI messages), then nothing more: the answer's
    start (status, headers) and body."""
    app = FastAPI(routes=[route])
    headers = [(b"content-type", b"application/json")]
    headers += [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": "POST", "path": PATH, "headers": headers, "query_string": b""}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if parts:
            return parts.pop(0)
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0], sent[1]


def test_a_body_that_does_not_arrive_in_time_is_answered_503_and_its_connection_closed() -> None:
    route = json_route(Shouting(), Limits(request_timeout_s=0.3))  # type: ignore[arg-type]
    started = time.monotonic()
    start, answer = asked_by_parts(route, [{"type": "http.request", "body": b"{", "more_body": True}], 30)
    took = time.monotonic() - started  # a slow client: 1 byte of its 30, then nothing
    answered = {name.decode(): value.decode() for name, value in start["headers"]}
    assert (start["status"], answered["connection"], answered["retry-after"]) == (503, "close", "10")
    assert json.loads(answer["body"]) == {"error": "not answered within 0.3 s: the server is busy; try again shortly"}
    assert took < 10
