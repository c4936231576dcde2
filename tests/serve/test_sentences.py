"""The service cuts a text into sentences by the rules of its model's source language."""

from __future__ import annotations

from pathlib import Path


def test_the_source_language_of_the_model_decides_the_sentences(bundled: dict[str, Path]) -> None:
    from aiayn.serve.service import TranslationService

    service = TranslationService()
    de_en, en_de = service.model(str(bundled["de-en"])), service.model(str(bundled["en-de"]))
    text = "Äpfel, Birnen usw. Dann Kirschen."  # "usw." ends no sentence in German; English does not know it
    assert de_en.prepare(text).layout.sentences == [text]
    assert en_de.prepare(text).layout.sentences == ["Äpfel, Birnen usw.", "Dann Kirschen."]


def test_a_name_with_an_initial_is_translated_whole(bundled: dict[str, Path]) -> None:
    from aiayn.serve.service import TranslationService

    model = TranslationService().model(str(bundled["en-de"]))
    translated = model.translate("Several men are walking and standing in John A. Noble facility.", 4)
    assert translated.sentences == 1 and "Noble Einrichtung" in translated.text
