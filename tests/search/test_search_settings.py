"""The search's numbers, each stated once: §6.1's defaults, the length penalty's two formulas, what a setting and
a source may be, and a sentence's confidence."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from aiayn.search import Output, length_penalty_of, mean_log_prob
from aiayn.search.translator import SearchSettings, Translator, beam_size_of


def test_the_papers_beam_4_and_alpha_0_6_are_the_settings_defaults() -> None:
    assert (SearchSettings().beam_size, SearchSettings().length_penalty, SearchSettings().max_extra_len) == (4, 0.6, 50)


def test_the_length_penalty_is_gnmts_or_hugging_faces() -> None:
    assert length_penalty_of(7, 0.6) == pytest.approx(2.0**0.6)  # ((5 + 7) / 6)^α
    assert length_penalty_of(7, 0.6, "gnmt") == pytest.approx(2.0**0.6)
    assert length_penalty_of(7, 0.6, "power") == pytest.approx(7.0**0.6)  # |Y|^α
    with pytest.raises(ValueError, match="^unknown length normalization 'x'; choose one of gnmt, power$"):
        length_penalty_of(7, 0.6, "x")


def test_a_beam_size_is_a_whole_number_from_1_to_8() -> None:
    assert [beam_size_of(v) for v in (1, 8, 2.0)] == [1, 8, 2]
    for bad in (True, "2", 2.5, 0, 9, None, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=f"^beam size must be a whole number from 1 to 8, got {bad!r}$"):
            beam_size_of(bad)
    # A request's JSON may hold an integer too large for a float, or text of any length: one short line each.
    cases = [
        (10**400, "a whole number of more than 40 digits"),
        (-(10**40), "a whole number of more than 40 digits"),  # 41 digits
        (10**39, "1" + "0" * 39),  # 40 digits: written out
        ("x" * 100, "'" + "x" * 39 + "…"),
        ("x" * 38, "'" + "x" * 38 + "'"),  # 40 characters: whole
    ]
    for bad, shown in cases:
        with pytest.raises(ValueError) as refused:
            beam_size_of(bad)
        assert str(refused.value) == f"beam size must be a whole number from 1 to 8, got {shown}"


def test_settings_at_their_limits_hold_and_past_them_say_which() -> None:
    SearchSettings(max_extra_len=1, max_len=1)
    SearchSettings(min_len=3, max_len=3)
    refusals = [
        ({"length_normalization": "x"}, "length normalization 'x' is not one of gnmt, power"),
        ({"max_extra_len": 0}, "max_extra_len must be at least 1, got 0"),
        ({"min_len": -1}, "min_len must be at least 0, got -1"),
        ({"max_len": 0}, "max_len must be at least 1 and at least min_len (0), got 0"),
        ({"min_len": 2, "max_len": 1}, "max_len must be at least 1 and at least min_len (2), got 1"),
    ]
    for changes, message in refusals:
        with pytest.raises(ValueError) as refused:
            SearchSettings(**changes)  # type: ignore[arg-type]
        assert str(refused.value) == message


def test_a_sentences_confidence_is_its_log_probability_per_scored_token() -> None:
    pieces = [Output([5, 6], -3.0, True, [-1.0, -1.5]), Output([7], -1.0, False, [-1.0])]  # 3 + 1 scored tokens
    assert mean_log_prob(pieces) == -1.0 and mean_log_prob([]) == 0.0


class Characters:
    """A token per character, and </s>."""

    def encode_source(self, text: str) -> list[int]:
        return [3] * len(text) + [2]

    def decode(self, ids: Sequence[int]) -> str:
        return "x" * len(ids)


def test_a_source_at_the_models_limit_is_taken_and_one_over_it_refused() -> None:
    translator = Translator(None, Characters(), 5)  # type: ignore[arg-type]
    assert translator.source_ids("abcd") == [3, 3, 3, 3, 2]
    with pytest.raises(ValueError) as refused:
        translator.source_ids("abcde")
    assert str(refused.value) == (
        "a sentence of 6 tokens is longer than this model's limit of 5; split it into shorter sentences"
    )
    with pytest.raises(ValueError, match="^lanes must be at least 1, got 0$"):
        Translator(None, Characters(), 5, lanes=0)  # type: ignore[arg-type]
