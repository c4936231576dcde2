"""`aiayn bench --long`: captions joined as the module says, and the figures it prints."""

from __future__ import annotations

from pathlib import Path

from aiayn.bench.long_sentences import RUN, join, long_report, lower_words, measure, runs
from aiayn.data.multi30k import ParallelCorpus

CAPTIONS = [
    "A man rides a red bike.",
    "A woman walks a brown dog in the park.",
    "Two children play with a ball on the grass.",
    "A man sings.",
]
GERMAN = [
    "Ein Mann fährt ein rotes Fahrrad.",
    "Eine Frau führt einen braunen Hund im Park aus.",
    "Zwei Kinder spielen mit einem Ball auf dem Rasen.",
    "Ein Mann singt.",
]


def test_captions_are_joined_with_the_lower_case_the_corpus_uses() -> None:
    lower = lower_words(["The dog sees a cat.", "A cat sees a dog.", "The Menschen sees Menschen."])
    assert "A" in lower and "Menschen" not in lower
    assert join(CAPTIONS[:3], ", and ", lower) == (
        "A man rides a red bike, and a woman walks a brown dog in the park, "
        "and Two children play with a ball on the grass."
    )
    assert runs(CAPTIONS, ", and ", lower)[1] == "A man sings." and len(runs(CAPTIONS, ", and ", lower)) == 2
    assert RUN == 3


def test_the_figures_of_a_small_split(bundled: dict[str, Path]) -> None:
    from aiayn.serve.service import TranslationService

    model = TranslationService().model(str(bundled["en-de"]))
    corpus = ParallelCorpus(CAPTIONS, GERMAN, "en", "de", "val")
    figures = measure(model, corpus, corpus, 1)
    assert figures.sentences == 2 and 0 <= figures.before <= 100 and 0 <= figures.after <= 100
    assert figures.separate > 20 and figures.short_after <= figures.short_before
    text = long_report(figures, "en-de", "val", 1)
    assert "(target)" in text and "(before)" in text and "(after)" in text and "and → und" in text
