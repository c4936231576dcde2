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
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from aiayn.search.translator import MAX_BEAM
from aiayn.serve import metrics
from aiayn.serve.limits import DEFAULT_LIMITS, Limits, Reason, Refused, json_of, too_large
from aiayn.serve.requests import BadRequest, Direction, beam_of, check_work, direction_of, directions, work_of
from aiayn.serve.service import TimedOut, TranslationService
from aiayn.text.sentences import MAX_CHARS, MAX_FILE_CHARS, check_length

Read = TypeVar("Read")  # what a door reads of a body: its bytes, or its fields

PATH = "/v1/translate"
MEDIA_TYPE = "application/json"


async def body_of(request: Request, limit: int) -> bytes:
    """The request's body, read only while it stays within ``limit`` bytes: refused by its ``Content-Length``
    before a byte is read, and a body sent in chunks counted as it comes and cut off at the limit."""
    media_type = media_type_of(request)
    if media_type != MEDIA_TYPE:
        sent = f"Content-Type {media_type}" if media_type else "no Content-Type"
        raise Refused(Reason.MEDIA_TYPE, f"the body must be sent as Content-Type: {MEDIA_TYPE}, not {sent}")
    return await bounded_body(request, limit)


def media_type_of(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


async def bounded_body(request: Request, limit: int) -> bytes:
    """The body of any media type, read as ``body_of`` reads it: at most ``limit`` bytes."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit, int(length))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def parsed(
    body: bytes, served: dict[str, Direction], limits: Limits = DEFAULT_LIMITS
) -> tuple[list[str], Direction, int]:
    """(sentences, direction, beam) of a request body, or a ``Refused`` that says what is wrong with it; without a
    beam, the direction's folder's."""
    request = json_of(body, limits.max_number_digits)
    if not isinstance(request, dict):
        raise bad_field('the body must be a JSON object: {"sentences": [...], "direction": ..., "beam": ...}')
    unknown = sorted(set(request) - {"sentences", "direction", "beam", "api_key"})  # a key: ``api_keys.py``'s
    if unknown:
        raise bad_field(f"unknown field(s) {', '.join(unknown)}; the fields are sentences, direction and beam")
    check_api_key(request)
    sentences = request.get("sentences")
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise bad_field("sentences must be a list of strings")
    check_texts(sentences, limits, "sentences")
    try:
        direction = direction_of(served, request.get("direction", next(iter(served))))
        beam = beam_of(request.get("beam"))
        check_work(sentences, direction, limits.max_sentences, "sentences")  # the work, once split
    except BadRequest as err:
        raise bad_field(str(err)) from None
    return sentences, direction, direction.model.search.beam_size if beam is None else beam


def check_api_key(fields: dict[str, Any]) -> None:
    """A body's ``api_key``, where it names one, a string (``api_keys.py`` reads it; without ``--api-keys`` it is
    ignored, yet still what ``API_KEY_SCHEMA`` says)."""
    if not isinstance(fields.get("api_key", ""), str):
        raise bad_field("api_key must be a string")


def check_texts(texts: list[str], limits: Limits, field: str) -> None:
    """A request's texts within the route's limits (how many, each one's and their characters together), or a
    ``Refused`` naming them as ``field`` (``sentences``; LibreTranslate's ``q``)."""
    if not 1 <= len(texts) <= limits.max_sentences:
        most = limits.max_sentences
        raise bad_field(f"{field} has {len(texts)} items; from 1 to {most} are translated per request")
    for index, text in enumerate(texts):
        try:
            check_length(text, MAX_CHARS, f"{field}[{index}]")
        except ValueError as err:
            raise bad_field(str(err)) from None
    total = sum(map(len, texts))
    if total > MAX_FILE_CHARS:
        raise bad_field(f"the {field} have {total} characters together; at most {MAX_FILE_CHARS} per request")


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
    status and one message; a 503 or 429 says when to try again, and one refused before its body was read whole
    (``unread``) closes the connection, so that the server reads no more of it."""
    metrics.refused(refused.reason)
    wait_s = refused.retry_after_s or limits.retry_after_s
    headers = {"Retry-After": str(wait_s)} if refused.status in (429, 503) else {}
    if unread:
        headers["Connection"] = "close"
    return JSONResponse({"error": str(refused)}, status_code=refused.status, headers=headers)


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string", "description": "what was wrong, in one line"}},
    "additionalProperties": False,
}
API_KEY_SCHEMA = {"type": "string", "description": "the caller's key, with --api-keys (api_keys.py); else ignored"}
ANSWER_SCHEMA = {
    "type": "object",
    "required": ["translations", "details", "direction", "beam"],
    "properties": {
        "translations": {"type": "array", "items": {"type": "string"}},
        "details": {"type": "array", "items": {"type": "object"}, "description": "details.py, one a translation"},
        "direction": {"type": "string"},
        "beam": {"type": "integer", "minimum": 1, "maximum": MAX_BEAM},
    },
}


def request_schema(limits: Limits, served: list[str]) -> dict[str, Any]:
    """The body the route reads, with its limits (the characters of all sentences together: in words alone)."""
    direction: dict[str, Any] = {"type": "string", "description": "default: the first served direction"}
    return {
        "type": "object",
        "required": ["sentences"],
        "additionalProperties": False,
        "properties": {
            "sentences": {
                "type": "array",
                "minItems": 1,
                "maxItems": limits.max_sentences,
                "items": {"type": "string", "maxLength": MAX_CHARS},
                "description": f"at most {MAX_FILE_CHARS} characters together; no lone surrogate",
            },
            "direction": direction | ({"enum": served} if served else {}),
            "api_key": API_KEY_SCHEMA,
            "beam": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": MAX_BEAM,
                "description": "the beam size; default (or null): the direction's folder's",
            },
        },
    }


def error_answer(why: str, retry: bool = False) -> dict[str, Any]:
    """An OpenAPI answer of a refusal: ``{"error": ...}``, with ``Retry-After`` where ``retry``."""
    answer: dict[str, Any] = {"description": why, "content": {MEDIA_TYPE: {"schema": ERROR_SCHEMA}}}
    header = {"description": "seconds to wait before asking again", "schema": {"type": "string"}}
    return answer | ({"headers": {"Retry-After": header}} if retry else {})


def refusals_described(limits: Limits, media_type: str = MEDIA_TYPE) -> dict[int, dict[str, Any]]:
    """Every refusal a JSON door answers, by its status (403 and 429: with ``--api-keys`` alone, ``api_keys.py``)."""
    return {
        400: error_answer("not JSON, nested too deep, or a number out of range"),
        403: error_answer("no valid API key (--api-keys)"),
        413: error_answer(f"a body over {limits.max_body_bytes} bytes, or over the key's characters"),
        415: error_answer(f"not sent as Content-Type: {media_type}"),
        422: error_answer("a field missing, unknown or wrong, or a line the model cannot take"),
        429: error_answer("over the key's rate (--api-keys)", retry=True),
        503: error_answer("busy, past its time limit, or draining", retry=True),
    }


def described(limits: Limits, served: list[str]) -> dict[str, Any]:
    """The route's OpenAPI description: its body and every answer, each refusal by its status."""
    return {
        "responses": {
            200: {"description": "the translations", "content": {MEDIA_TYPE: {"schema": ANSWER_SCHEMA}}},
            **refusals_described(limits),
        },
        "openapi_extra": {
            "requestBody": {"required": True, "content": {MEDIA_TYPE: {"schema": request_schema(limits, served)}}}
        },
    }


def past_time_of(limits: Limits) -> str:
    return f"not answered within {limits.request_timeout_s:g} s: the server is busy; try again shortly"


async def read_within(request: Request, limits: Limits, read: Callable[[Request, int], Awaitable[Read]]) -> Read:
    """The body as ``read`` reads it, within ``limits.max_body_bytes`` and the request's time; else a ``Refused``,
    to be answered as unread (the connection closed)."""
    try:
        return await asyncio.wait_for(read(request, limits.max_body_bytes), limits.request_timeout_s)
    except TimeoutError:
        raise Refused(Reason.TIMEOUT, past_time_of(limits)) from None


async def answered(
    request: Request,
    limits: Limits,
    read: Callable[[Request, int], Awaitable[Read]],
    answer: Callable[[Read, float], Awaitable[Any]],
) -> JSONResponse:
    """A JSON door's answer: its body as ``read`` reads it (``read_within``), then ``answer(what was read, the
    deadline)``; each refusal answered in one line (``refusal``), one before the body was read whole as unread."""
    deadline = time.monotonic() + limits.request_timeout_s  # a slow body's time counts
    try:
        body = await read_within(request, limits, read)
    except Refused as refused:
        return refusal(refused, limits, unread=True)
    try:
        return JSONResponse(await answer(body, deadline))
    except Refused as refused:
        return refusal(refused, limits)


async def searched_within(
    service: TranslationService,
    waiting: Waiting,
    request: tuple[list[str], Direction, int],
    deadline: float,
    limits: Limits,
    field: str = "sentences",
    n_best: int = 1,
) -> dict[str, Any]:
    """``translated`` in a thread, the request's work (its sentences once split) counted among ``waiting`` until it
    is answered."""
    sentences, direction, _ = request
    work = work_of(sentences, direction.model.config.src_lang)  # what waits: sentences once split
    waiting.admit(work)
    try:
        past_time = past_time_of(limits)
        return await run_in_threadpool(translated, service, request, deadline, past_time, field, n_best)
    finally:
        waiting.leave(work)


def json_route(
    service: TranslationService, limits: Limits = DEFAULT_LIMITS, waiting: Waiting | None = None
) -> APIRoute:
    """The route over the models ``service`` has loaded (the page's directions); its sentences counted among
    ``waiting``, the JSON doors' one count (``libretranslate.json_doors``; None: a count of its own)."""
    admitted = waiting or Waiting(limits.max_waiting)

    async def translate(request: Request) -> JSONResponse:
        async def answer(body: bytes, deadline: float) -> dict[str, Any]:
            served = directions(dict(service.models))  # the page's direction values: en-de, en-es, ...
            sentences, direction, beam = parsed(body, served, limits)
            request.state.sentences, request.state.text = len(sentences), sentences  # the access log's
            return await searched_within(service, admitted, (sentences, direction, beam), deadline, limits)

        return await answered(request, limits, body_of, answer)

    served = list(directions(dict(service.models)))
    return APIRoute(PATH, translate, methods=["POST"], name="translate", **described(limits, served))


def translated(
    service: TranslationService,
    request: tuple[list[str], Direction, int],
    deadline: float,
    past_time: str,
    field: str = "sentences",
    n_best: int = 1,
) -> dict[str, Any]:
    """The answer to a checked request, searched within what is left of its time at ``deadline`` (its wait for a
    thread counts), or a ``Refused``: past its time (``past_time`` says so), or a line the model cannot take (named
    ``field[i]``); with ``n_best`` above 1, each translation's alternatives too (``alternatives``)."""
    sentences, direction, beam = request
    try:
        wanted = [(s, direction.name, beam) for s in sentences]
        results = service.translate_many(wanted, deadline - time.monotonic(), n_best)
    except TimedOut:
        raise Refused(Reason.TIMEOUT, past_time) from None
    refused = [(i, line, why) for i, r in enumerate(results) for line, why in r.refused]
    if refused:
        index, line, why = refused[0]
        raise Refused(Reason.NOT_TRANSLATED, f"{field}[{index}], line {line + 1}: {why}")
    translations: list[Any] = [result.text for result in results]
    told = [result.details() for result in results]
    metrics.translated(direction.value, told)
    details = [one.as_json() for one in told]
    answer = {"translations": translations, "details": details, "direction": direction.value, "beam": beam}
    return answer | ({"alternatives": [result.alternatives for result in results]} if n_best > 1 else {})
