"""What a request may ask, checked once for the page, its API and the JSON route: directions by their API value
(never a folder's path), a text's length, a beam size, an upload's encoding."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aiayn.serve.limits import Limits
from aiayn.serve.requests import (
    BadRequest,
    Request,
    beam_of,
    checked,
    direction_of,
    directions,
    read_upload,
    refusal_of,
    work_of,
)
from aiayn.serve.service import TimedOut
from aiayn.text.sentences import MAX_CHARS


def model(src: str, tgt: str, folder: str) -> Any:
    """What ``directions`` reads of a loaded model: its folder's config and name."""
    config = SimpleNamespace(src_lang=src, tgt_lang=tgt)
    return SimpleNamespace(config=config, folder=SimpleNamespace(config=config, path=Path("/models") / folder))


def test_directions_are_named_by_their_pair_and_by_their_folder_only_where_pairs_repeat() -> None:
    a, b, c = model("en", "de", "ende"), model("en", "de", "ende-2"), model("de", "en", "deen")
    served = directions({"/models/ende": a, "/models/ende-2": b, "/models/deen": c})
    assert [(d.value, d.label, d.name, d.pair) for d in served.values()] == [
        ("en-de:ende", "en → de (ende)", "/models/ende", ("en", "de")),
        ("en-de:ende-2", "en → de (ende-2)", "/models/ende-2", ("en", "de")),
        ("de-en", "de → en", "/models/deen", ("de", "en")),
    ]
    assert served["de-en"].model is c
    with pytest.raises(ValueError, match="^/x/ende and /y/ende are both en → de \\(ende\\): serve one, or rename"):
        directions({"/x/ende": model("en", "de", "ende"), "/y/ende": model("en", "de", "ende")})


def test_a_request_is_checked_once_and_says_what_is_wrong() -> None:
    served = directions({"en-de": model("en", "de", "en-de")})
    assert checked(served, "A dog.", "en-de", 2) == Request("A dog.", "en-de", 2)
    assert checked(served, None, "en-de", None) == Request("", "en-de", None)  # no text, no beam: the folder's
    assert checked(served, "x" * MAX_CHARS, "en-de", 4.0) == Request("x" * MAX_CHARS, "en-de", 4)
    with pytest.raises(BadRequest, match=f"^the text has {MAX_CHARS + 1} characters; at most {MAX_CHARS} "):
        checked(served, "x" * (MAX_CHARS + 1), "en-de", None)
    with pytest.raises(BadRequest, match="^en-fr is not in the list of choices: en-de$"):
        checked(served, "A dog.", "en-fr", None)
    with pytest.raises(BadRequest, match="^None is not in the list of choices: en-de$"):
        direction_of(served, None)
    with pytest.raises(BadRequest, match="^beam size must be a whole number from 1 to 8, got 9$"):
        checked(served, "A dog.", "en-de", 9)
    assert beam_of(None) is None and beam_of(3.0) == 3


def test_a_requests_work_is_its_sentences_once_split_whatever_its_characters() -> None:
    assert work_of(["A dog runs. A cat sleeps.", "", "Two men.\nA boat."], "en") == 2 + 1 + 2  # "" is still answered
    served = directions({"en-de": model("en", "de", "en-de")})
    three = Limits(max_sentences=3)
    assert checked(served, "A dog. A cat.\nA boat.", "en-de", None, three).text == "A dog. A cat.\nA boat."
    with pytest.raises(BadRequest, match="^the text has 4 sentences; at most 3 are translated per request here"):
        checked(served, "A dog. A cat.\nA boat. A man.", "en-de", None, three)
    many = "Go. " * (MAX_CHARS // 4)  # within the characters, but 1 250 sentences of one word
    with pytest.raises(BadRequest, match=f"^the text has {MAX_CHARS // 4} sentences; at most 256 "):
        checked(served, many, "en-de", None)
    assert checked(served, "x" * MAX_CHARS, "en-de", None).text == "x" * MAX_CHARS  # one sentence


def test_an_upload_is_utf8_with_or_without_its_mark(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes("\ufeffÄpfel\n".encode())
    assert read_upload(path) == "Äpfel\n"
    path.write_bytes("ab\xe4".encode("latin-1"))
    with pytest.raises(BadRequest, match="^the file is not UTF-8 text \\(byte 2 cannot be read\\); save it as UTF-8"):
        read_upload(path)


def test_a_request_that_raised_is_told_a_bad_inputs_message_or_only_the_kind_of_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert refusal_of(BadRequest("beam size must be a whole number from 1 to 8, got 9")) == (
        "beam size must be a whole number from 1 to 8, got 9"
    )
    assert refusal_of(ValueError("the text has 5001 characters")) == "the text has 5001 characters"
    past = "not answered within 60 s"
    assert refusal_of(TimedOut(past)) == past  # a page request past its time is told so
    assert caplog.records == []  # a bad input is the visitor's, a time limit the server's bound: nothing logged
    assert refusal_of(KeyError("/srv/models/secret")) == (
        "the server failed on this request (KeyError); try again, or another text"
    )
    (record,) = caplog.records
    assert (record.levelname, record.getMessage()) == ("ERROR", "a request failed") and record.exc_info is not None
    assert "/srv/models/secret" in caplog.text
