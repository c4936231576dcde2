"""Sentence and line handling of the serve path: nothing lost, nothing truncated, limits explicit."""

from __future__ import annotations

import pytest

from aiayn.serve.text import MAX_CHARS, InputTooLong, check_length, layout, reassemble, split_long, split_sentences


def test_sentences_are_split_and_lines_kept() -> None:
    text = "A dog runs. Two cats sleep!\n\nIs it raining? Yes.\n"
    shape = layout(text)
    assert shape.sentences == ["A dog runs.", "Two cats sleep!", "Is it raining?", "Yes."]
    assert (
        reassemble(shape, [s.upper() for s in shape.sentences]) == "A DOG RUNS. TWO CATS SLEEP!\n\nIS IT RAINING? YES."
    )


def test_abbreviation_like_dots_inside_a_sentence_do_not_split() -> None:
    assert split_sentences("The price is 3.5 euros and it is fine.") == ["The price is 3.5 euros and it is fine."]


def test_empty_and_blank_text_give_no_sentences() -> None:
    assert layout("").sentences == [] and layout("   \n  ").sentences == []
    assert reassemble(layout("\n"), []) == ""


def test_long_sentences_are_split_at_words_not_truncated() -> None:
    sentence = " ".join(f"w{i}" for i in range(450))
    pieces = split_long(sentence, lambda s: len(s.split()), limit=100)
    assert " ".join(pieces) == sentence
    assert all(len(p.split()) <= 100 for p in pieces)


def test_a_single_overlong_word_is_refused_with_a_message() -> None:
    with pytest.raises(InputTooLong, match="exceeds the limit"):
        split_long("x" * 50, len, limit=10)


def test_request_size_limit_is_stated() -> None:
    check_length("a" * MAX_CHARS)
    with pytest.raises(InputTooLong, match=str(MAX_CHARS)):
        check_length("a" * (MAX_CHARS + 1))
