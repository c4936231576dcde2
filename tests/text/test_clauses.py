"""Long sentences cut at clause boundaries before the search, and their translations put back together."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.core.folder import ModelFolder
from aiayn.text.clauses import MAX_DEPTH, Clause, ClauseSplitter, conjunctions

JOINED = (
    "A group of men are loading cotton onto a truck, and a man sleeping in a green room on a couch, "
    "and a boy wearing headphones sits on a woman's shoulders."
)


@pytest.fixture(scope="module")
def en_de(bundled: dict[str, Path]) -> ModelFolder:
    return ModelFolder.open(bundled["en-de"])


def splitter(folder: ModelFolder, limit: int | None) -> ClauseSplitter:
    return ClauseSplitter(folder.tokenizer, "en", "de", limit)


def test_a_long_sentence_is_cut_at_its_conjunctions_and_nothing_is_dropped(en_de: ModelFolder) -> None:
    clauses = splitter(en_de, 21).split(JOINED)
    assert [c.source() for c in clauses] == [
        "A group of men are loading cotton onto a truck,",
        "and a man sleeping in a green room on a couch,",
        "and a boy wearing headphones sits on a woman's shoulders.",
    ]
    assert " ".join(c.source() for c in clauses) == JOINED
    assert [c.lead for c in clauses] == ["", "und", "und"] and [c.tail for c in clauses] == [",", ",", ""]
    assert clauses[1].query() == "A man sleeping in a green room on a couch"  # searched as a caption
    assert all(c.depth <= MAX_DEPTH for c in clauses)


def test_short_sentences_and_sentences_without_a_boundary_stay_whole(en_de: ModelFolder) -> None:
    long_list = "A man with a red hat a blue coat a green scarf and yellow boots walks a big brown dog in the park."
    for sentence in ("Two dogs play in the snow.", long_list):
        assert splitter(en_de, 12).split(sentence) == [Clause(sentence)]
    assert splitter(en_de, None).split(JOINED) == [Clause(JOINED)]  # a folder without a ``clauses`` section


def test_a_semicolon_is_preferred_to_a_conjunction(en_de: ModelFolder) -> None:
    sentence = "A man rides a bike, and a woman walks behind him; two children wave at them from a red car."
    halves = splitter(en_de, 12).halve(Clause(sentence))
    assert halves is not None
    left, right = halves
    assert left.tail == ";" and right.text.startswith("two children")


def test_translations_are_set_mid_sentence(en_de: ModelFolder) -> None:
    cut = splitter(en_de, 21)
    first, second, third = cut.split(JOINED)
    assert cut.render(first, "Eine Gruppe Männer lädt Baumwolle auf einen Lkw.") == (
        "Eine Gruppe Männer lädt Baumwolle auf einen Lkw,"
    )
    assert cut.render(second, "Ein Mann schläft auf einer Couch.") == "und ein Mann schläft auf einer Couch,"
    assert cut.render(third, "Menschen sitzen.") == "und Menschen sitzen."  # "menschen" is no word of its own


def test_the_pair_table() -> None:
    assert conjunctions("en", "de")["and"] == "und" and conjunctions("de", "en")["sowie"] == "and"
    assert conjunctions("en", "xx") == {}
