"""What the model knows about each line, for programs: `aiayn translate --report` (JSON Lines, every line, flags as
the notes say, scores as the search gives them), the JSON route's ``details``, and the unsure words' spans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import aiayn.cli.serve as cli_serve
from aiayn.cli import main
from aiayn.engines.options import EngineOptions
from aiayn.search.output import mean_log_prob
from aiayn.search.words import Word, least_word_log_prob, unsure_spans, words
from aiayn.serve.api import json_route
from aiayn.serve.service import LoadedModel, TranslationService

LINES = [
    "Two dogs play in the snow.",
    "John and Mary visit Berlin on 3 March 2024.",
    "",
    "A man 🙂 rides a bike. A woman reads.",
    "x" * 600,  # a single word over the token limit: not translated
    "A girl jumps into the pool.",
]


@pytest.fixture(scope="module")
def service() -> TranslationService:
    return TranslationService(EngineOptions(device="cpu"))


def test_words_are_their_subwords_and_sum_their_log_probabilities() -> None:
    found = words(["▁Zwei", "▁Hund", "e", "▁im", "▁Schne", "e", "."], [-0.1, -0.2, -0.3, -0.4, -1.0, -2.0, -0.5])
    assert [w.text for w in found] == ["Zwei", "Hunde", "im", "Schnee."]
    assert [w.log_prob for w in found] == pytest.approx([-0.1, -0.5, -0.4, -3.5])
    text = "Zwei Hunde spielen im Schnee."  # "spielen" was another piece's, "im" comes after it
    assert unsure_spans(text, found, -0.45) == [(5, 10), (22, 28)]  # the word, not its period
    assert unsure_spans(text, found, -5.0) == []
    # A clause's first word back in lower case is still found; a word the text lacks is skipped, not misplaced.
    assert unsure_spans("ein Hund", [Word("Ein", -3.0), Word("Katze", -3.0), Word("Hund", -3.0)], -1.0) == [
        (0, 3),
        (4, 8),
    ]
    assert unsure_spans("Einhorn ein", [Word("ein", -3.0)], -1.0) == [(8, 11)]  # whole words only
    assert unsure_spans(text, found, -0.4) == [(5, 10), (22, 28)]  # "im", at the threshold, is not under it
    assert least_word_log_prob(found) == -3.5 and least_word_log_prob([]) == 0.0  # no word: nothing unsure
    quoted = [Word('"Hund"', -3.0), Word("!", -3.0)]  # the word without its quotes; punctuation alone: no span
    assert unsure_spans('Ein "Hund" bellt !', quoted, -1.0) == [(5, 9)]
    assert unsure_spans("Hund und Hund", [Word("Hund", -0.1), Word("Hund", -3.0)], -1.0) == [(9, 13)]  # the second


def test_the_report_has_every_line_in_order_with_the_notes_flags(
    bundled: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target, report = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "report.jsonl"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    monkeypatch.setattr(cli_serve, "CHUNK_LINES", 4)  # two chunks: the report goes on across them
    command = ["translate", "--input", str(source), "--output", str(target), "--report", str(report), "--no-clauses"]
    assert main([*command, "--device", "cpu"]) == 2  # line 5 is not translated
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [line["line"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert [line["translation"] for line in lines] == target.read_text(encoding="utf-8").split("\n")[:-1]
    assert {(line["engine"], line["variant"], line["beam"]) for line in lines} == {("onnx", "fp32", 4)}
    unsure = [line["line"] for line in lines if line["unsure"]]
    assert unsure == [2] and f"line(s) {', '.join(map(str, unsure))}: the model is unsure" in err
    assert [line["left_out"] for line in lines][3] == ["🙂"] and "left out: 🙂" in err
    assert lines[4]["not_translated"] and f"line 5 not translated: {lines[4]['not_translated'][0]}" in err
    assert lines[4]["mean_log_prob"] is None and lines[4]["tokens"] == 0
    assert [(line["sentences"], line["clauses"]) for line in lines] == [(1, 1), (1, 1), (0, 0), (2, 2), (1, 0), (1, 1)]
    assert lines[2] == {**lines[2], "translation": "", "mean_log_prob": None, "unsure": False, "short": False}
    assert f"every line's score, flags and unsure words: {report}" in err
    # Each single-sentence line's score is the search's own, as `aiayn eval` scores the sentence.
    model = TranslationService(EngineOptions(device="cpu"), split_clauses=False).model("en-de")
    outputs = model.translator.outputs([model.translator.source_ids(LINES[i]) for i in (0, 1, 5)], model.settings(4))
    for line, output in zip([lines[0], lines[1], lines[5]], outputs, strict=True):
        assert line["mean_log_prob"] == mean_log_prob([output]) and line["log_prob"] == output.log_prob
        assert line["tokens"] == output.scored_tokens


def test_a_report_that_cannot_be_written_is_one_line(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["translate", "--report", "/no/such/dir/r.jsonl", "--device", "cpu", "A dog."]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("aiayn translate: error: --report /no/such/dir/r.jsonl")


def test_the_json_route_answers_each_translations_details(service: TranslationService) -> None:
    service.model("en-de")
    client = TestClient(FastAPI(routes=[json_route(service)]))
    sentences = [LINES[0], LINES[1], "A dog runs.\nJohn and Mary visit Berlin on 3 March 2024.", " \n "]
    answer = client.post("/v1/translate", json={"sentences": sentences, "beam": 4}).json()
    assert answer["translations"] == [service.translate(s, "en-de", 4).text for s in sentences]
    details: list[dict[str, Any]] = answer["details"]
    assert [d["unsure"] for d in details] == [False, True, True, False]
    assert details[3]["mean_log_prob"] is None and details[3]["sentences"] == 0  # blank lines: nothing searched
    model = service.model("en-de")
    one = model.run(model.prepare(LINES[1]), 4).lines[0]
    assert details[1] == one.as_json()
    assert details[2]["sentences"] == 2 and details[2]["tokens"] > one.tokens
    for text, d in zip(answer["translations"], details, strict=True):
        for start, end in d["unsure_words"]:  # spans of whole words of the translation
            assert text[start:end].strip() == text[start:end] and text[start:end]


def test_marked_words_are_low_probability_words_of_the_translation(service: TranslationService) -> None:
    model: LoadedModel = service.model("en-de")
    assert model.min_word_log_prob is not None and model.min_word_log_prob < 0
    done = model.run(model.prepare(["John and Mary visit Berlin.", LINES[0]]), 4)
    marked, sure = done.lines
    assert marked.unsure_words and not sure.unsure_words
    translation = done.text.split("\n")[0]
    assert all(translation[a:b].strip() for a, b in marked.unsure_words)
