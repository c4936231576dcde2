"""The JSON route's body, checked before any search (``api.parsed``): each refusal's status and message, and a
request's defaults (the first served direction, the folder's own beam)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aiayn.serve.api import parsed
from aiayn.serve.limits import MAX_BODY_BYTES, Refused
from aiayn.serve.requests import directions


def served() -> dict[str, Any]:
    def model(src: str, tgt: str) -> Any:
        config = SimpleNamespace(src_lang=src, tgt_lang=tgt)
        folder = SimpleNamespace(config=config, path=Path("/models") / f"{src}{tgt}")
        return SimpleNamespace(config=config, folder=folder, search=SimpleNamespace(beam_size=3))

    return dict(directions({"en-de": model("en", "de"), "de-en": model("de", "en")}))


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_body_gives_its_sentences_direction_and_beam_or_the_defaults() -> None:
    sentences, direction, beam = parsed(body(sentences=["A dog."], direction="de-en", beam=2), served())
    assert (sentences, direction.value, beam) == (["A dog."], "de-en", 2)
    sentences, direction, beam = parsed(body(sentences=["A dog.", "A cat."]), served())
    assert (sentences, direction.value, beam) == (["A dog.", "A cat."], "en-de", 3)  # the first, the folder's beam
    at_limits = body(sentences=["x" * 5000] * 10)  # 5 000 characters each, 50 000 together
    assert len(parsed(at_limits, served())[0]) == 10 and len(parsed(body(sentences=["a"] * 256), served())[0]) == 256


@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        (b" " * MAX_BODY_BYTES, 400, "the body is not JSON: "),  # at the cap: read
        (b"\xff", 400, "the body is not JSON: "),
        (b"[]", 422, 'the body must be a JSON object: {"sentences": [...], "direction": ..., "beam": ...}'),
        (body(sentences=["a"], text="a", model=1), 422, "unknown field(s) model, text; the fields are sentences, "),
        (body(sentences=["a"], api_key=["k"]), 422, "api_key must be a string"),
        (body(beam=1), 422, "sentences must be a list of strings"),
        (body(sentences=["a", None]), 422, "sentences must be a list of strings"),
        (body(sentences=[]), 422, "sentences has 0 items; from 1 to 256 are translated per request"),
        (body(sentences=["a"] * 257), 422, "sentences has 257 items; from 1 to 256 are translated per request"),
        (body(sentences=["a", "x" * 5001]), 422, "sentences[1] has 5001 characters; at most 5000"),
        (body(sentences=["x" * 5000] * 10 + ["y"]), 422, "the sentences have 50001 characters together; at most 50000"),
        # the work once split: 255 strings and one of two sentences, 257 sentences, within every count of strings
        (body(sentences=["a"] * 255 + ["A dog. A cat."]), 422, "sentences has 257 sentences; at most 256 are "),
        (body(sentences=["A dog. " * 300]), 422, "sentences has 300 sentences; at most 256 are translated per "),
        (body(sentences=["a"], direction="en-fr"), 422, "en-fr is not in the list of choices: en-de, de-en"),
        (body(sentences=["a"], beam=0), 422, "beam size must be a whole number from 1 to 8, got 0"),
    ],
)
def test_a_bad_body_is_refused_with_its_status_and_one_message(raw: bytes, status: int, message: str) -> None:
    with pytest.raises(Refused) as refused:
        parsed(raw, served())
    assert refused.value.status == status and str(refused.value).startswith(message)


class Answer:
    """A translated request as the route reads it: the text, the lines refused, the details."""

    def __init__(self, text: str, refused: list[tuple[int, str]]) -> None:
        self.text, self.refused = text, refused

    def details(self) -> Any:
        as_json = {"characters": len(self.text)}
        return SimpleNamespace(as_json=lambda: as_json, sentences=1, tokens=len(self.text.split()) + 1)


class Shouting:
    """The service as the route sees it: the served models, and ``translate_many`` writing each text in capitals,
    refusing a line that holds "!"; it keeps the requests it was given."""

    def __init__(self) -> None:
        self.models = {"models/ende": served()["en-de"].model, "models/deen": served()["de-en"].model}
        self.requests: list[list[tuple[str, str, int | None]]] = []

    def translate_many(
        self, requests: list[tuple[str, str, int | None]], timeout_s: float, n_best: int = 1
    ) -> list[Answer]:
        self.requests.append(list(requests))
        answers = []
        for text, _, _ in requests:
            lines = text.split("\n")
            refused = [(i, "a word over the limit") for i, line in enumerate(lines) if "!" in line]
            answers.append(Answer(text.upper(), refused))
        return answers


def post(service: Shouting, raw: bytes) -> tuple[int, Any]:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from aiayn.serve.api import PATH, json_route

    client = TestClient(FastAPI(routes=[json_route(service)]))  # type: ignore[arg-type]
    answer = client.post(PATH, content=raw, headers={"content-type": "application/json"})
    return answer.status_code, answer.json()


def test_the_route_translates_a_requests_sentences_together_and_answers_them_in_order() -> None:
    service = Shouting()
    status, answer = post(service, body(sentences=["A dog.", "Two cats."], direction="de-en", beam=2))
    assert status == 200 and answer == {
        "translations": ["A DOG.", "TWO CATS."],
        "details": [{"characters": 6}, {"characters": 9}],
        "direction": "de-en",
        "beam": 2,
    }
    assert service.requests == [[("A dog.", "models/deen", 2), ("Two cats.", "models/deen", 2)]]  # one call
    status, answer = post(service, body(sentences=["a"]))
    assert (status, answer["direction"], answer["beam"]) == (200, "en-de", 3)  # the first, its folder's beam
    assert service.requests[-1] == [("a", "models/ende", 3)]


def test_the_route_answers_a_bad_body_or_a_refused_line_with_its_status_and_one_message() -> None:
    service = Shouting()
    assert post(service, b" " * (MAX_BODY_BYTES + 1)) == (
        413,
        {"error": f"the body has {MAX_BODY_BYTES + 1} bytes; at most {MAX_BODY_BYTES}"},
    )
    assert post(service, body(sentences=[])) == (
        422,
        {"error": "sentences has 0 items; from 1 to 256 are translated per request"},
    )
    assert service.requests == []  # refused before any search
    refused = body(sentences=["fine", "a\nb\nno!\nyes!", "not!"])
    assert post(service, refused) == (422, {"error": "sentences[1], line 3: a word over the limit"})  # the first
