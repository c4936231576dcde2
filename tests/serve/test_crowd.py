"""The page under a crowd: batched answers equal one-at-a-time answers, a bad request in a batch gets its own
message, a full queue says so, and the JSON route translates many sentences and validates like the page.

The server runs in this process on a free loopback port; the visitors are the bench's raw asyncio client.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import pytest
from gradio_client import Client

import aiayn.serve.page
from aiayn.bench.crowd import Connection, HttpError, ask_page, crowd, one_at_a_time
from aiayn.core.folder import SEARCH_SECTION, ModelFolder
from aiayn.engines.options import EngineOptions
from aiayn.serve.api import json_route
from aiayn.serve.page import build_app
from aiayn.serve.server import launch
from aiayn.serve.service import Result, TranslationService
from aiayn.serve.status import status_line

SENTENCES = [
    "Two dogs play in the snow.",
    "A man in a red shirt is riding a bike down the street.",
    "Children are playing soccer on a green field.",
    "A woman sits on a bench and reads a book.",
    "A girl jumps into the pool.",
    "Three musicians play guitars on a stage.",
    "A black cat sleeps on the sofa.",
    "Workers repair the road.",
]


@pytest.fixture(scope="module")
def service(bundled: dict[str, Path]) -> TranslationService:
    return TranslationService(EngineOptions(device="cpu"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(service: TranslationService) -> tuple[gr.Blocks, int]:
    port = free_port()
    page = build_app(service, ["en-de"])
    launch(page, port=port, routes=[json_route(service)])
    return page, port


@pytest.fixture(scope="module")
def port(service: TranslationService) -> Iterator[int]:
    page, port = serve(service)
    yield port
    page.close()


async def ask_json(port: int, body: object) -> dict[str, object]:
    connection = await Connection.open(port)
    try:
        return dict(json.loads(await connection.request("POST", "/v1/translate", body)))
    finally:
        connection.close()


def json_error(port: int, body: object) -> tuple[int, str]:
    with pytest.raises(HttpError) as refused:
        asyncio.run(ask_json(port, body))
    return refused.value.status, str(json.loads(refused.value.body)["error"])


def test_a_crowd_gets_its_one_at_a_time_answers_from_batches(
    port: int, service: TranslationService, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = asyncio.run(one_at_a_time(port, SENTENCES, "en-de"))
    assert alone["Two dogs play in the snow."] == "Zwei Hunde spielen im Schnee."
    batches: list[int] = []
    translate_many = service.translate_many

    def recorded(requests: list[tuple[str, str, int]], timeout_s: float | None = None) -> list[Result]:
        batches.append(len(requests))
        return translate_many(requests, timeout_s)

    monkeypatch.setattr(service, "translate_many", recorded)
    row = asyncio.run(crowd(port, os.getpid(), 40, SENTENCES, alone, "en-de"))
    assert (row.answered, row.refused, row.failed) == (row.requests, 0, 0) and row.identical
    assert sum(batches) == row.requests and max(batches) > 1  # Gradio handed the handler several at once


def test_a_bad_request_in_a_batch_gets_its_own_message_and_the_others_their_answers(port: int) -> None:
    async def together() -> list[str | BaseException]:
        async def one(sentence: str, beam: object) -> str:
            connection = await Connection.open(port)
            try:
                posted = {"data": [sentence, "en-de", beam]}
                event = json.loads(await connection.request("POST", "/gradio_api/call/translate", posted))["event_id"]
                stream = await connection.request("GET", f"/gradio_api/call/translate/{event}")
                return stream.decode()
            finally:
                connection.close()

        bad = [one("A dog.", 9), one("x" * 6000, 4), one("A cat.", "abc"), one("A cow.", 10**400)]
        return await asyncio.gather(*[one(s, 4) for s in SENTENCES], *bad, return_exceptions=True)

    *good, too_wide, too_long, not_a_number, too_many_digits = asyncio.run(together())
    assert all(isinstance(s, str) and "event: complete" in s and "not translated" not in s for s in good)
    assert "Zwei Hunde spielen im Schnee." in str(good[0])
    for answer, why in [
        (too_wide, "beam size must be a whole number from 1 to 8, got 9"),
        (too_long, "has 6000 characters; at most 5000"),
        (not_a_number, "beam size must be a whole number from 1 to 8, got 'abc'"),
        (too_many_digits, "beam size must be a whole number from 1 to 8, got a whole number of more than 40 digits"),
    ]:
        assert "event: complete" in str(answer)
        translation, status = json.loads(str(answer).split("data: ")[-1])
        assert translation == "" and status.startswith("not translated: ") and why in status


def test_a_full_queue_refuses_with_http_503_and_a_message(
    service: TranslationService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aiayn.serve.page, "MAX_WAITING", 0)
    page, port = serve(service)
    try:

        async def ask() -> None:
            connection = await Connection.open(port)
            try:
                await ask_page(connection, SENTENCES[0], "en-de")
            finally:
                connection.close()

        with pytest.raises(HttpError) as refused:
            asyncio.run(ask())
    finally:
        page.close()
    assert refused.value.status == 503
    assert json.loads(refused.value.body)["detail"].startswith("Queue is full.")


def test_the_json_route_translates_many_sentences_in_order(port: int, service: TranslationService) -> None:
    answer = asyncio.run(ask_json(port, {"sentences": SENTENCES, "direction": "en-de", "beam": 4}))
    assert len(answer.pop("details")) == len(SENTENCES)  # each translation's (tests/serve/test_details.py)
    assert answer == {
        "translations": [service.translate(s, "en-de", 4).text for s in SENTENCES],
        "direction": "en-de",
        "beam": 4,
    }
    two_lines = asyncio.run(ask_json(port, {"sentences": ["A dog runs.\nA cat sleeps."], "beam": 1}))
    assert two_lines["translations"] == [service.translate("A dog runs.\nA cat sleeps.", "en-de", 1).text]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"not json", 400, "the body is not JSON"),
        ([1, 2], 422, "the body must be a JSON object"),
        ({"text": "A dog."}, 422, "unknown field(s) text"),
        ({"sentences": "A dog."}, 422, "sentences must be a list of strings"),
        ({"sentences": []}, 422, "sentences has 0 items; from 1 to 256"),
        ({"sentences": ["A dog."] * 257}, 422, "sentences has 257 items; from 1 to 256"),
        ({"sentences": ["A dog.", "x" * 6000]}, 422, "sentences[1] has 6000 characters; at most 5000"),
        ({"sentences": ["A dog."], "direction": "en-fr"}, 422, "en-fr is not in the list of choices: en-de"),
        ({"sentences": ["A dog."], "beam": 9}, 422, "beam size must be a whole number from 1 to 8, got 9"),
        ({"sentences": ["A dog."], "beam": "abc"}, 422, "beam size must be a whole number from 1 to 8, got 'abc'"),
        ({"sentences": ["A dog."], "beam": 2.7}, 422, "got 2.7"),
        ({"sentences": ["x" * 600]}, 422, "sentences[0], line 1:"),  # a single word over the token limit
        ({"sentences": ["A dog.", 3]}, 422, "sentences must be a list of strings"),
        ({"sentences": ["A dog runs. " * 400] * 11}, 422, "52800 characters together; at most 50000"),
        (b" " * 200_001, 413, "the body has 200001 bytes; at most 200000"),  # refused before it is parsed
        (b" " * 200_000, 400, "the body is not JSON"),  # at the cap: parsed
    ],
)
def test_the_json_route_refuses_a_bad_body_with_one_message(port: int, body: object, status: int, message: str) -> None:
    got_status, got = json_error(port, body)
    assert got_status == status and message in got


def test_the_heatmap_data_is_the_first_sentence_and_its_translation(service: TranslationService) -> None:
    attention = service.attention("Two dogs play in the snow. A cat sleeps.", "en-de", 4)
    assert attention is not None
    translated = service.translate("Two dogs play in the snow.", "en-de", 4).text
    assert "".join(attention.output_tokens[:-1]).replace("_", " ").strip() == translated
    assert attention.source_tokens[:3] == ["_Two", "_dogs", "_play"] and attention.output_tokens[-1] == "</s>"
    assert attention.weights.shape[1:] == (len(attention.output_tokens), len(attention.source_tokens))


def test_in_a_batch_a_sentence_that_cannot_be_translated_is_left_out_and_named(service: TranslationService) -> None:
    texts = ["A dog runs.\nA cat " + "x" * 600 + ".", "Two dogs play in the snow."]
    cut, whole = service.translate_many([(text, "en-de", 4) for text in texts])
    assert cut.text.split("\n")[0] == service.translate("A dog runs.", "en-de", 4).text and cut.refused
    assert [line for line, _ in cut.refused] == [1] and "line 2 not translated: " in status_line(cut)
    assert whole.text == "Zwei Hunde spielen im Schnee." and not whole.refused


def test_a_folders_own_beam_is_the_default_of_the_page_its_api_and_the_json_route(
    bundled: dict[str, Path], tmp_path: Path
) -> None:
    # Captions whose translations at beam 2 and at beam 4 differ (under the search's finishing rule most do not).
    sentences = [*SENTENCES, "A woman is sitting by her dried flower display at an outside market."]
    imported = tmp_path / "imported"  # as `aiayn import` writes a checkpoint's own num_beams
    shutil.copytree(bundled["en-de"], imported)
    ModelFolder.open(imported).write_section(SEARCH_SECTION, {"beam_size": 2})
    service = TranslationService(EngineOptions(device="cpu"))  # serving these two only, as `aiayn serve` would
    page = build_app(service, [str(imported), "de-en"])
    port = free_port()
    launch(page, port=port, routes=[json_route(service)])
    try:
        beam = next(b for b in page.blocks.values() if getattr(b, "elem_id", None) == "beam")
        assert isinstance(beam, gr.Slider) and beam.value == 2
        with_two = [service.translate(s, str(imported), 2).text for s in sentences]
        assert with_two != [service.translate(s, str(imported), 4).text for s in sentences]  # the beam tells
        answer = asyncio.run(ask_json(port, {"sentences": sentences, "direction": "en-de"}))
        assert len(answer.pop("details")) == len(sentences)
        assert answer == {"translations": with_two, "direction": "en-de", "beam": 2}
        client = Client(page.local_url, verbose=False)
        assert client.predict(sentences[1], "en-de", None, api_name="/translate")[0] == with_two[1]
        assert asyncio.run(ask_json(port, {"sentences": SENTENCES[:1], "direction": "de-en"}))["beam"] == 4
    finally:
        page.close()
