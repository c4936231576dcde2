"""The service translates a long sentence clause by clause: every clause comes back."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_a_translation_short_for_its_source_is_named_not_silent(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiayn.cli import main
    from aiayn.search.output import Output
    from aiayn.serve.service import SHORT_RATIO, LoadedModel, Prepared, Result, TranslationService
    from aiayn.serve.status import status_line

    model = TranslationService().model(str(bundled["en-de"]))

    def outputs(out_ids: list[list[int]]) -> list[Output]:
        return [Output(ids, 0.0, True, [0.0] * len(ids)) for ids in out_ids]

    def short_lines(prepared: Prepared, out_ids: list[list[int]]) -> list[int]:
        return model.assemble(prepared, outputs(out_ids), 1.0).short_lines

    prepared = model.prepare(f"Two dogs play.\n{JOINED}")
    sources = [len(ids) - 1 for ids in prepared.src_ids]  # the joined sentence is 3 pieces, each judged summed
    assert len(sources) == 4 and sum(sources[1:]) >= 12
    full = [[5] * n for n in sources]
    assert short_lines(prepared, full) == []
    cut = [full[0], *([5] * int(SHORT_RATIO * n - 1) for n in sources[1:])]
    assert short_lines(prepared, cut) == [1]
    assert short_lines(prepared, [[5], *full[1:]]) == []  # a short source is not judged

    translated = model.translate(f"Two dogs play.\n{JOINED}", 4)
    assert translated.short_lines == []  # clause by clause, nothing is lost
    result = Result("", "CPU", 1.0, 2, [], 0, short_lines=[1], unsure_lines=[], refused=[], lines=[])
    assert "line(s) 2: the translation looks short for its source" in status_line(result)
    monkeypatch.setattr(
        LoadedModel,
        "run",
        lambda self, p, beam, on_batch=None: self.assemble(p, outputs(cut), 1.0),
    )
    assert main(["translate", "--model", str(bundled["en-de"]), f"Two dogs play.\n{JOINED}"]) == 0
    assert "line(s) 2: the translation looks short for its source" in capsys.readouterr().err
