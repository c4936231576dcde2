"""`POST /v1/translate`: many sentences in one JSON request, for apps that need no page. Torch-free.

Mounted beside the Gradio page on the same server (``app.launch(..., routes=[json_route(service)])``), it goes
straight to the service's batcher, without Gradio's queue: the sentences of one request and of every other
request of the moment are searched together. It checks what the page checks (direction, beam size, characters)
and answers a bad body with a 4xx and one message: ``{"error": "..."}``. It reads at most what it accepts: a body
over ``Limits.max_body_bytes`` is refused by its ``Content-Length`` before it is read, or as it streams, where it
comes in chunks. It admits at most ``Limits.max_waiting`` sentences at once (beyond: 503 with ``Retry-After``), and
answers each request within ``Limits.request_timeout_s`` from its arrival, a slow body's time included (past it:
503, and its searches not yet run are dropped).
Every refusal is a ``limits.Refused``, named by its ``Reason``.

    request:  {"sentences": ["Two dogs play in the snow.", ...], "direction": "en-de", "beam": 4}
    answer:   {"translations": ["Zwei Hunde spielen im Schnee.", ...], "details": [{"mean_log_prob": -0.05, ...}, ...],
               "direction": "en-de", "beam": 4}

``details[i]`` is what the model knows about ``translations[i]`` (``details.py``, docs/serve.md).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from aiayn.serve import metrics
from aiayn.serve.limits import DEFAULT_LIMITS, Limits, Reason, Refused
from aiayn.serve.requests import BadRequest, Direction, beam_of, check_work, direction_of, directions, work_of
from aiayn.serve.service import TimedOut, TranslationService
from aiayn.text.sentences import MAX_CHARS, MAX_FILE_CHARS, check_length

PATH = "/v1/translate"
MEDIA_TYPE = "application/json"


async def body_of(request: Request, limit: int) -> bytes:
    """The request's body, read only while it stays within ``limit`` bytes: refused by its ``Content-Length``
    before a byte is read, and a body sent in chunks counted as it comes and cut off at the limit."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != MEDIA_TYPE:
        sent = f"Content-Type {media_type}" if media_type else "no Content-Type"
        raise Refused(Reason.MEDIA_TYPE, f"the body must be sent as Content-Type: {MEDIA_TYPE}, not {sent}")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise Refused(Reason.TOO_LARGE, f"the body has {int(length)} bytes; at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(Reason.TOO_LARGE, f"the body has more than {limit} bytes; at most {limit}")
        chunks.append(chunk)
    return b"".join(chunks)


def json_of(body: bytes, digits: int) -> Any:
    """The body as JSON, or ``bad_json``: not JSON (or not UTF-8), nested deeper than Python parses, a number of
    more than ``digits`` digits (no field takes one: it is refused before Python makes it an integer, which from
    4 301 digits it refuses itself), a non-finite number (``1e999``, ``NaN``)."""

    def whole(text: str) -> int:
        if len(text.lstrip("-")) > digits:
            raise ValueError(f"a number of {len(text.lstrip('-'))} digits is out of range (at most {digits})")
        return int(text)

    def real(text: str) -> float:
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(f"the number {text[:digits]}{'…' if len(text) > digits else ''} is out of range")
        return number

    def constant(text: str) -> float:
        raise ValueError(f"{text} is not a JSON number")

    try:
        return json.loads(body, parse_int=whole, parse_float=real, parse_constant=constant)
    except RecursionError:
        raise Refused(Reason.BAD_JSON, "the body is not JSON this route reads: it is nested too deep") from None
    except ValueError as err:  # UnicodeDecodeError and json.JSONDecodeError among them
        raise Refused(Reason.BAD_JSON, f"the body is not JSON: {err}") from None


def parsed(
    body: bytes, served: dict[str, Direction], limits: Limits = DEFAULT_LIMITS
) -> tuple[list[str], Direction, int]:
    """(sentences, direction, beam) of a request body, or a ``Refused`` that says what is wrong with it; without a
    beam, the direction's folder's."""
    request = json_of(body, limits.max_number_digits)
    if not isinstance(request, dict):
        raise bad_field('the body must be a JSON object: {"sentences": [...], "direction": ..., "beam": ...}')
    unknown = sorted(set(request) - {"sentences", "direction", "beam"})
    if unknown:
        raise bad_field(f"unknown field(s) {', '.join(unknown)}; the fields are sentences, direction and beam")
    sentences = request.get("sentences")
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise bad_field("sentences must be a list of strings")
    if not 1 <= len(sentences) <= limits.max_sentences:
        most = limits.max_sentences
        raise bad_field(f"sentences has {len(sentences)} items; from 1 to {most} are translated per request")
    for index, sentence in enumerate(sentences):
        try:
            check_length(sentence, MAX_CHARS, f"sentences[{index}]")
        except ValueError as err:
            raise bad_field(str(err)) from None
    total = sum(map(len, sentences))
    if total > MAX_FILE_CHARS:
        raise bad_field(f"the sentences have {total} characters together; at most {MAX_FILE_CHARS} per request")
    try:
        direction = direction_of(served, request.get("direction", next(iter(served))))
        beam = beam_of(request.get("beam"))
        check_work(sentences, direction, limits.max_sentences, "sentences")  # the work, once split
    except BadRequest as err:
        raise bad_field(str(err)) from None
    return sentences, direction, direction.model.search.beam_size if beam is None else beam


def bad_field(message: str) -> Refused:
    return Refused(Reason.BAD_FIELD, message)


class Waiting:
    """The sentences the route has admitted and not yet answered, at most ``limit`` (the ``aiayn_waiting`` gauge's
    ``route="json"``). The route's handlers all run on the server's one event loop, so a count needs no lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sentences = 0

    def admit(self, count: int) -> None:
        if self.sentences + count > self.limit:
            raise Refused(
                Reason.QUEUE_FULL,
                f"the server is busy: {self.sentences} sentences wait (at most {self.limit}); try again shortly",
            )
        self.sentences += count
        metrics.waiting("json", self.sentences)

    def leave(self, count: int) -> None:
        self.sentences -= count
        metrics.waiting("json", self.sentences)


def refusal(refused: Refused, limits: Limits, unread: bool = False) -> JSONResponse:
    """A refusal's answer, and the route's one place that counts it (``aiayn_refusals_total`` by its reason): its
    status and one message; a 503 says when to try again, and one refused before its body was read whole
    (``unread``) closes the connection, so that the server reads no more of it."""
    metrics.refused(refused.reason)
    headers = {"Retry-After": str(limits.retry_after_s)} if refused.status == 503 else {}
    if unread:
        headers["Connection"] = "close"
    return JSONResponse({"error": str(refused)}, status_code=refused.status, headers=headers)


def json_route(service: TranslationService, limits: Limits = DEFAULT_LIMITS) -> APIRoute:
    """The route over the models ``service`` has loaded (the page's directions)."""
    waiting = Waiting(limits.max_waiting)
    past_time = f"not answered within {limits.request_timeout_s:g} s: the server is busy; try again shortly"

    async def translate(request: Request) -> JSONResponse:
        deadline = time.monotonic() + limits.request_timeout_s  # a slow body's time counts
        try:
            body = await asyncio.wait_for(body_of(request, limits.max_body_bytes), limits.request_timeout_s)
        except TimeoutError:
            return refusal(Refused(Reason.TIMEOUT, past_time), limits, unread=True)
        except Refused as refused:
            return refusal(refused, limits, unread=True)
        served = directions(dict(service.models))  # the page's direction values: en-de, en-es, ...
        try:
            sentences, direction, beam = parsed(body, served, limits)
            request.state.sentences, request.state.text = len(sentences), sentences  # the access log's
            work = work_of(sentences, direction.model.config.src_lang)  # what waits: sentences once split
            waiting.admit(work)
        except Refused as refused:
            return refusal(refused, limits)
        try:
            answer = await run_in_threadpool(translated, service, (sentences, direction, beam), deadline, past_time)
        except Refused as refused:
            return refusal(refused, limits)
        finally:
            waiting.leave(work)
        return JSONResponse(answer)

    return APIRoute(PATH, translate, methods=["POST"], name="translate")


def translated(
    service: TranslationService, request: tuple[list[str], Direction, int], deadline: float, past_time: str
) -> dict[str, Any]:
    """The answer to a checked request, searched within what is left of its time at ``deadline`` (its wait for a
    thread counts), or a ``Refused``: past its time (``past_time`` says so), or a line the model cannot take."""
    sentences, direction, beam = request
    try:
        results = service.translate_many([(s, direction.name, beam) for s in sentences], deadline - time.monotonic())
    except TimedOut:
        raise Refused(Reason.TIMEOUT, past_time) from None
    refused = [(i, line, why) for i, r in enumerate(results) for line, why in r.refused]
    if refused:
        index, line, why = refused[0]
        raise Refused(Reason.NOT_TRANSLATED, f"sentences[{index}], line {line + 1}: {why}")
    translations: list[Any] = [result.text for result in results]
    told = [result.details() for result in results]
    metrics.translated(direction.value, told)
    details = [one.as_json() for one in told]
    return {"translations": translations, "details": details, "direction": direction.value, "beam": beam}
