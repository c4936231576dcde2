"""`POST /v1/translate`: many sentences in one JSON request, for apps that need no page. Torch-free.

Mounted beside the Gradio page on the same server (``app.launch(..., routes=[json_route(service)])``), it goes
straight to the service's batcher, without Gradio's queue: the sentences of one request and of every other
request of the moment are searched together. It checks what the page checks (direction, beam size, characters)
and answers a bad body with a 4xx and one message: ``{"error": "..."}``.

    request:  {"sentences": ["Two dogs play in the snow.", ...], "direction": "en-de", "beam": 4}
    answer:   {"translations": ["Zwei Hunde spielen im Schnee.", ...], "details": [{"mean_log_prob": -0.05, ...}, ...],
               "direction": "en-de", "beam": 4}

``details[i]`` is what the model knows about ``translations[i]`` (``details.py``, docs/serve.md).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from aiayn.serve import metrics
from aiayn.serve.batching import SENTENCES_PER_SEARCH
from aiayn.serve.requests import BadRequest, Direction, beam_of, direction_of, directions
from aiayn.serve.service import TranslationService
from aiayn.text.sentences import MAX_CHARS, MAX_FILE_CHARS, check_length

PATH = "/v1/translate"
MAX_SENTENCES_PER_REQUEST = SENTENCES_PER_SEARCH  # a request's sentences fit one of the batcher's searches
MAX_BODY_BYTES = 4 * MAX_FILE_CHARS  # UTF-8 text and JSON escapes of MAX_FILE_CHARS characters
REFUSAL_REASONS = {413: "too_large", 400: "bad_json"}  # the metrics' reasons; any other refusal: bad_field


class BadBody(ValueError):
    """A body the route refuses, with its HTTP status."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def parsed(body: bytes, served: dict[str, Direction]) -> tuple[list[str], Direction, int]:
    """(sentences, direction, beam) of a request body, or a BadBody that says what is wrong with it; without a
    beam, the direction's folder's."""
    if len(body) > MAX_BODY_BYTES:
        raise BadBody(f"the body has {len(body)} bytes; at most {MAX_BODY_BYTES}", 413)
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadBody(f"the body is not JSON: {err}", 400) from None
    if not isinstance(request, dict):
        raise BadBody('the body must be a JSON object: {"sentences": [...], "direction": ..., "beam": ...}')
    unknown = sorted(set(request) - {"sentences", "direction", "beam"})
    if unknown:
        raise BadBody(f"unknown field(s) {', '.join(unknown)}; the fields are sentences, direction and beam")
    sentences = request.get("sentences")
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise BadBody("sentences must be a list of strings")
    if not 1 <= len(sentences) <= MAX_SENTENCES_PER_REQUEST:
        most = MAX_SENTENCES_PER_REQUEST
        raise BadBody(f"sentences has {len(sentences)} items; from 1 to {most} are translated per request")
    for index, sentence in enumerate(sentences):
        try:
            check_length(sentence, MAX_CHARS, f"sentences[{index}]")
        except ValueError as err:
            raise BadBody(str(err)) from None
    total = sum(map(len, sentences))
    if total > MAX_FILE_CHARS:
        raise BadBody(f"the sentences have {total} characters together; at most {MAX_FILE_CHARS} per request")
    try:
        direction = direction_of(served, request.get("direction", next(iter(served))))
        beam = beam_of(request.get("beam"))
    except BadRequest as err:
        raise BadBody(str(err)) from None
    return sentences, direction, direction.model.search.beam_size if beam is None else beam


def json_route(service: TranslationService) -> APIRoute:
    """The route over the models ``service`` has loaded (the page's directions)."""

    async def translate(request: Request) -> JSONResponse:
        served = directions(dict(service.models))  # the page's direction values: en-de, en-es, ...
        try:
            sentences, direction, beam = parsed(await request.body(), served)
        except BadBody as err:
            metrics.refused(REFUSAL_REASONS.get(err.status, "bad_field"))
            return JSONResponse({"error": str(err)}, status_code=err.status)
        request.state.sentences, request.state.text = len(sentences), sentences  # the access log's
        metrics.waiting("json", len(sentences))
        try:
            results = await run_in_threadpool(service.translate_many, [(s, direction.name, beam) for s in sentences])
        finally:
            metrics.waiting("json", -len(sentences))
        refused = [(i, line, why) for i, r in enumerate(results) for line, why in r.refused]
        if refused:
            index, line, why = refused[0]
            metrics.refused("bad_field")
            return JSONResponse({"error": f"sentences[{index}], line {line + 1}: {why}"}, status_code=422)
        translations: list[Any] = [result.text for result in results]
        told = [result.details() for result in results]
        metrics.translated(direction.value, told)
        details = [one.as_json() for one in told]
        answer = {"translations": translations, "details": details, "direction": direction.value, "beam": beam}
        return JSONResponse(answer)

    return APIRoute(PATH, translate, methods=["POST"], name="translate")
