"""Translation quality with sacreBLEU: detokenized cased BLEU, lowercased BLEU and chrF. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import sacrebleu


@dataclass(frozen=True)
class Scores:
    bleu: float
    bleu_lowercase: float
    chrf: float
    bleu_signature: str
    chrf_signature: str

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} translations for {len(references)} references")
    cased = sacrebleu.metrics.BLEU()
    lowercase = sacrebleu.metrics.BLEU(lowercase=True)
    chrf = sacrebleu.metrics.CHRF()
    refs = [list(references)]
    return Scores(
        bleu=cased.corpus_score(list(hypotheses), refs).score,
        bleu_lowercase=lowercase.corpus_score(list(hypotheses), refs).score,
        chrf=chrf.corpus_score(list(hypotheses), refs).score,
        bleu_signature=str(cased.get_signature()),
        chrf_signature=str(chrf.get_signature()),
    )
