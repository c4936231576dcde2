"""sacreBLEU's scores as `aiayn eval` reports them: cased and lowercased BLEU, chrF, and their signatures."""

from __future__ import annotations

import pytest

from aiayn.evaluation.metrics import score


def test_scores_are_sacrebleus_cased_lowercased_and_chrf() -> None:
    same = score(["Two dogs play in the snow ."], ["Two dogs play in the snow ."])
    assert same.bleu == pytest.approx(100) and same.chrf == pytest.approx(100)
    cased = score(["TWO DOGS PLAY IN THE SNOW ."], ["Two dogs play in the snow ."])
    assert cased.bleu < 10 and cased.bleu_lowercase == pytest.approx(100)
    assert "case:mixed" in cased.bleu_signature and cased.chrf_signature.startswith("nrefs:1|case:mixed")
    assert set(cased.to_dict()) == {"bleu", "bleu_lowercase", "chrf", "bleu_signature", "chrf_signature"}
    with pytest.raises(ValueError, match="^2 translations for 1 references$"):
        score(["a", "b"], ["a"])
