"""LibreTranslate's doors over a stand-in service (``test_api_body.Shouting``, which writes each text in capitals):
what each way of sending a request reads (JSON, a form, query parameters, a field sent twice), HTML's markup kept
around its translated text, and every bad request refused in one line with its status, before any search. The
doors in a served `aiayn serve`, asked by the apps' clients: test_libretranslate.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from test_api_body import Shouting

from aiayn.serve.libretranslate import html_parts, json_doors, rejoined
from aiayn.serve.limits import DEFAULT_LIMITS, MAX_BODY_BYTES


def doors(service: Shouting) -> TestClient:
    return TestClient(FastAPI(routes=json_doors(service, DEFAULT_LIMITS)))  # type: ignore[arg-type]


def test_json_a_form_and_query_parameters_are_read_alike() -> None:
    service = Shouting()
    client = doors(service)
    asked = {"q": "a dog", "source": "en", "target": "de"}
    assert client.post("/translate", json=asked).json() == {"translatedText": "A DOG"}
    assert client.post("/translate", data=asked).json() == {"translatedText": "A DOG"}
    assert client.post("/translate", params=asked).json() == {"translatedText": "A DOG"}  # deep-translator's way
    twice = client.post(
        "/translate",
        content="q=a&q=b&source=de&target=en",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert twice.json() == {"translatedText": ["A", "B"]}
    assert service.requests[-1] == [("a", "models/deen", 3), ("b", "models/deen", 3)]  # one search, its folder's beam


def test_html_keeps_its_markup_and_translates_only_the_text_between() -> None:
    fragment = '<p title="x">Tom &amp; Jerry</p> <br/><!-- a note --><style>p { color: red }</style><b>run</b>'
    parts = html_parts(fragment)
    assert [text for is_text, text in parts if is_text] == ["Tom & Jerry", "run"]
    assert rejoined(parts, ["Tom & Jerry", "run"]) == fragment
    answer = doors(Shouting()).post(
        "/translate", json={"q": fragment, "source": "en", "target": "de", "format": "html"}
    )
    expected = '<p title="x">TOM &amp; JERRY</p> <br/><!-- a note --><style>p { color: red }</style><b>RUN</b>'
    assert answer.json() == {"translatedText": expected}


@pytest.mark.parametrize(
    ("request_of", "status", "message"),
    [
        ({"json": {"source": "en", "target": "de"}}, 422, "Invalid request: missing q parameter"),
        ({"json": {"q": [], "source": "en", "target": "de"}}, 422, "Invalid request: missing q parameter"),
        ({"json": {"q": "a", "target": "de"}}, 422, "Invalid request: missing source parameter"),
        ({"json": {"q": [1], "source": "en", "target": "de"}}, 422, "q must be a string or a list of strings"),
        (
            {
                "content": b'{"q": "dog \\ud800", "source": "en", "target": "de"}',
                "headers": {"content-type": "application/json"},
            },
            422,
            "q[0] holds a lone surrogate",
        ),
        ({"json": {"q": "a", "source": "en", "target": "de", "x": 1}}, 422, "unknown field(s) x; the fields are q,"),
        ({"json": {"q": "a", "source": "fr", "target": "de"}}, 422, "source fr is not supported to de; the sources"),
        (
            {"json": {"q": "a", "source": "en", "target": "de", "alternatives": "abc"}},
            422,
            "Invalid request: alternatives parameter is not a number",
        ),
        (
            {"json": {"q": "a", "source": "en", "target": "de", "alternatives": 2**53}},
            422,
            f"Invalid request: alternatives parameter is not a number from 0 to {2**53 - 1}",
        ),
        ({"json": {"q": "a", "source": "en", "target": "de", "alternatives": "²"}}, 422, "Invalid request: altern"),
        ({"json": {"q": "a", "source": "en", "target": "de", "alternatives": 1.5}}, 422, "Invalid request: altern"),
        ({"json": {"q": "a", "source": "en", "target": "de", "alternatives": True}}, 422, "Invalid request: altern"),
        ({"json": {"q": "a", "source": "en", "target": "de", "format": {}}}, 422, "{} format is not supported"),
        ({"json": {"q": "a", "source": "en", "target": "de", "api_key": 1}}, 422, "api_key must be a string"),
        (
            {"json": {"q": "a", "source": "en", "target": "de", "format": "html", "alternatives": 2}},
            422,
            "alternatives go with format text",
        ),
        ({"json": {"q": ["a"] * 257, "source": "en", "target": "de"}}, 422, "q has 257 items; from 1 to 256"),
        ({"json": {"q": "<b>a</b>" * 257, "source": "en", "target": "de", "format": "html"}}, 422, "q has 257 items"),
        (
            {
                "content": b'{"q": "a", "source": "en", "target": "de", "x": 1e999}',
                "headers": {"content-type": "application/json"},
            },
            400,
            "the body is not JSON: the number",
        ),
        ({"content": b"[1]", "headers": {"content-type": "application/json"}}, 400, "the body must be a JSON object"),
        (
            {"content": b"q=%ff", "headers": {"content-type": "application/x-www-form-urlencoded"}},
            400,
            "the form is not UTF-8",
        ),
        (
            {"content": b"<q/>", "headers": {"content-type": "text/xml"}},
            415,
            "the body must be sent as Content-Type: application/json or application/x-www-form-urlencoded",
        ),
        (
            {"content": b" " * (MAX_BODY_BYTES + 1), "headers": {"content-type": "application/json"}},
            413,
            "the body has",
        ),
    ],
)
def test_a_bad_request_is_refused_in_one_line_before_any_search(
    request_of: dict[str, Any], status: int, message: str
) -> None:
    service = Shouting()
    answer = doors(service).post("/translate", **request_of)
    assert answer.status_code == status and list(answer.json()) == ["error"]
    assert answer.json()["error"].startswith(message) and service.requests == []


@pytest.mark.parametrize(
    "fields", [{"alternatives": None}, {"alternatives": ""}, {"alternatives": 0.0}, {"format": None}, {"format": ""}]
)
def test_what_the_schema_allows_beside_the_plain_values_reads_as_their_default(fields: dict[str, Any]) -> None:
    """As /openapi.json describes the body (Schemathesis sends these): null and "" are no alternatives and text."""
    answer = doors(Shouting()).post("/translate", json={"q": "a dog", "source": "en", "target": "de", **fields})
    assert answer.json() == {"translatedText": "A DOG"}


def test_the_languages_are_the_served_pairs() -> None:
    answer = doors(Shouting()).get("/languages")
    assert json.loads(answer.text) == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": ["en"]},
    ]
