"""The clause splitter's rules, one at a time, on a tokenizer that counts words (a token per word, and </s>):
where a sentence is cut, which boundary wins, how deep it goes, and how a piece's translation is set back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.core.folder import ModelFolder
from aiayn.text.clauses import MIN_PIECE_TOKENS, Clause, ClauseSplitter


class Words:
    """A token per word, and </s>; its vocabulary: the lower-case words given."""

    def __init__(self, vocabulary: Sequence[str] = ()) -> None:
        self.vocabulary = set(vocabulary)

    def encode_source(self, text: str) -> list[int]:
        return [0] * (len(text.split()) + 1)

    def is_word(self, word: str) -> bool:
        return word in self.vocabulary


def splitter(limit: int | None, vocabulary: Sequence[str] = ()) -> ClauseSplitter:
    tokenizer: Any = Words(vocabulary)
    return ClauseSplitter(tokenizer, "en", "de", limit)


def sources(clauses: list[Clause]) -> list[str]:
    return [c.source() for c in clauses]


def test_a_boundary_is_taken_where_each_piece_keeps_its_minimum_and_nearest_the_middle() -> None:
    # "a b c, and d e f g h" : 3 words before the comma = 3 + </s> = 4 tokens = MIN_PIECE_TOKENS, exactly.
    assert MIN_PIECE_TOKENS == 4
    assert sources(splitter(4).split("a b c, and d e f g h")) == ["a b c,", "and d e f g h"]
    assert sources(splitter(4).split("a b, and c d e f g h")) == ["a b, and c d e f g h"]  # left piece too short
    assert sources(splitter(4).split("a b c d e f, and g h")) == ["a b c d e f, and g h"]  # right piece too short
    # Of two boundaries, the one nearer the middle by tokens.
    near_end = "a b c d e f g h i j, and k l m n o p q r s t u v w, and x y z"
    assert sources(splitter(20).split(near_end)) == ["a b c d e f g h i j,", "and k l m n o p q r s t u v w, and x y z"]


def test_a_semicolon_wins_over_a_nearer_conjunction_and_two_equal_ones_go_to_the_first() -> None:
    text = "a b c d; e f g h i, and j k l m n o p q"  # 19 tokens: the semicolon's 5 before, the comma's 10
    assert sources(splitter(15).split(text)) == ["a b c d;", "e f g h i, and j k l m n o p q"]
    equal = "a b c d e, and f g h i j, and k l m n o"  # both boundaries 1 token from the middle
    assert sources(splitter(14).split(equal)) == ["a b c d e,", "and f g h i j, and k l m n o"]


def test_a_conjunction_is_found_whatever_its_case_and_a_semicolon_leads_with_nothing() -> None:
    clauses = splitter(4).split("a b c, And d e f g")
    assert sources(clauses) == ["a b c,", "And d e f g"] and clauses[1].lead == "und"
    right = splitter(4).split("a b c; d e f g")[1]
    assert (right.lead, right.source_lead, right.source()) == ("", "", "d e f g")
    assert splitter(4).render(right, "Ein Hund.") == "Ein Hund"


def test_splitting_stops_at_the_limit_and_at_four_pieces() -> None:
    text = "a b c d e, and f g h i j"  # 12 tokens
    assert len(splitter(12).split(text)) == 1 and len(splitter(11).split(text)) == 2
    assert splitter(4).split(text, tokens=3) == [Clause(text)]  # the caller's count is taken, not made again
    many = ", and ".join(f"a{i} b{i} c{i} d{i}" for i in range(8))  # 8 clauses of 4 words
    pieces = splitter(4).split(many)
    assert len(pieces) == 4 and " ".join(sources(pieces)) == many
    # The right half's own left half keeps the conjunction that opened it.
    assert pieces[2].source().startswith("and a4") and pieces[2].lead == "und"


def test_a_piece_is_searched_as_a_caption_and_its_translation_set_mid_sentence() -> None:
    assert Clause("a dog runs").query() == "a dog runs"  # the sentence's start is given as it is
    assert Clause("a dog runs", first=False).query() == "A dog runs"
    split = splitter(4, vocabulary=["ein", "a", "hund"])
    left = Clause("a b c", tail=",", depth=1)
    assert split.render(left, "Ein Hund .") == "Ein Hund,"  # the caption's period goes, and the space before it
    assert split.render(Clause("a b c. ", tail=",", depth=1), "Ein Hund.") == "Ein Hund.,"  # its own period stays
    right = Clause("d e f", lead="und", source_lead="and", first=False, depth=1)
    assert split.render(right, "Ein Hund.") == "und ein Hund"
    assert split.render(right, "A dog.") == "und a dog"
    assert split.render(right, "Hund.") == "und hund"
    assert split.render(right, "Mann.") == "und Mann"  # not a lower-case word of the vocabulary: kept


def test_a_folders_splitter_takes_its_limit_and_its_pair(bundled: dict[str, Path]) -> None:
    folder = ModelFolder.open(bundled["de-en"])
    limit = folder.clause_limit()
    splitter = ClauseSplitter.of(folder)
    assert limit is not None and splitter.max_tokens == limit and splitter.tokenizer is folder.tokenizer
    assert splitter.table["und"] == "and"  # de → en
    assert ClauseSplitter.of(folder, split=False).max_tokens is None
