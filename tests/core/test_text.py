"""Sentence and line handling of the serve path: nothing lost, nothing truncated, limits explicit."""

from __future__ import annotations

import pytest

from aiayn.core.text import (
    MAX_CHARS,
    MAX_FILE_CHARS,
    InputTooLong,
    check_length,
    layout,
    reassemble,
    split_lines,
    split_long,
    split_sentences,
)


def test_sentences_are_split_and_lines_kept() -> None:
    text = "A dog runs. Two cats sleep!\n\nIs it raining? Yes.\n"
    shape = layout(text)
    assert shape.sentences == ["A dog runs.", "Two cats sleep!", "Is it raining?", "Yes."]
    assert (
        reassemble(shape, [s.upper() for s in shape.sentences]) == "A DOG RUNS. TWO CATS SLEEP!\n\nIS IT RAINING? YES."
    )


@pytest.mark.parametrize(
    ("line", "sentences"),
    [
        ("The price is 3.5 euros and it is fine.", ["The price is 3.5 euros and it is fine."]),
        ('He said "Go." Then he left.', ['He said "Go."', "Then he left."]),
        ("Mr. Smith and Dr. Weber talk, z.B. Bello. Gut.", ["Mr. Smith and Dr. Weber talk, z.B. Bello.", "Gut."]),
        ("Wait... what? No.", ["Wait... what?", "No."]),
        ("Hello. Привет! 2 dogs run. 狗 runs.", ["Hello.", "Привет!", "2 dogs run.", "狗 runs."]),
    ],
)
def test_sentence_ends_keep_every_character(line: str, sentences: list[str]) -> None:
    assert split_sentences(line) == sentences


def test_empty_and_blank_text_give_no_sentences() -> None:
    assert layout("").sentences == [] and layout("   \n  ").sentences == []
    assert reassemble(layout("\n"), []) == ""


def test_long_sentences_are_split_at_words_not_truncated() -> None:
    sentence = " ".join(f"w{i}" for i in range(450))
    pieces = split_long(sentence, lambda s: len(s.split()), limit=100)
    assert " ".join(pieces) == sentence
    assert all(len(p.split()) <= 100 for p in pieces)


def test_a_single_overlong_word_is_refused_with_a_message() -> None:
    with pytest.raises(InputTooLong, match="single word of 50 tokens is over the limit of 10"):
        split_long("x" * 50, len, limit=10)


def test_request_and_file_limits_are_stated() -> None:
    check_length("a" * MAX_CHARS)
    with pytest.raises(InputTooLong, match=f"{MAX_CHARS + 1} characters; at most {MAX_CHARS}"):
        check_length("a" * (MAX_CHARS + 1))
    with pytest.raises(InputTooLong, match=f"the file has .* at most {MAX_FILE_CHARS}"):
        check_length("a" * (MAX_FILE_CHARS + 1), MAX_FILE_CHARS, "the file")


@pytest.mark.parametrize("inside", ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_only_newline_and_carriage_return_break_lines(inside: str) -> None:
    assert split_lines(f"A dog runs.{inside}A cat sleeps.\r\nTwo birds.\rEnd.\n") == [
        "A dog runs. A cat sleeps.",
        "Two birds.",
        "End.",
    ]
    shape = layout(f"A dog runs.{inside}A cat sleeps.")
    assert shape.sentences == ["A dog runs.", "A cat sleeps."] and len(shape.lines) == 1
    assert split_lines("") == [] and split_lines("\n") == [""]
