"""The service translates a long sentence clause by clause: every clause comes back."""

from __future__ import annotations

from pathlib import Path

JOINED = (
    "A group of men are loading cotton onto a truck, and a man sleeping in a green room on a couch, "
    "and a boy wearing headphones sits on a woman's shoulders."
)


def test_the_service_translates_every_clause_of_a_long_sentence(bundled: dict[str, Path]) -> None:
    from aiayn.serve.service import TranslationService

    model = TranslationService().model(str(bundled["en-de"]))
    whole = model.translate(JOINED, 4).text
    assert whole.count(", und ") == 2 and whole.endswith(".")
    assert "Kopfhörer" in whole and ("Couch" in whole or "Sofa" in whole)
    short = model.translate("Two dogs play in the snow.", 4).text
    assert short == "Zwei Hunde spielen im Schnee."
