"""What the model knows about one line of a translated text: its score, its flags, how it was cut and the words
it was unsure of. One object for `aiayn translate --report` (a line of a file) and the JSON route (a sentence of
a request); the fields are documented in docs/serve.md. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Details:
    """One line, over the pieces its sentences were searched as (``service.Prepared``)."""

    log_prob: float  # the sum over its pieces' tokens, </s>'s included where a piece ended
    tokens: int  # the tokens ``log_prob`` sums over
    sentences: int  # as ``text/sentences.py`` cut the line
    clauses: int  # the pieces searched: one per sentence, more for a sentence cut into clauses or at the token limit
    unsure: bool  # a sentence's mean log-probability per token is under the folder's threshold
    short: bool  # a sentence's translation looks short for its source
    unchanged: int  # sentences without a known word, kept as they are
    left_out: list[str]  # characters outside the vocabulary, taken out before the search
    not_translated: list[str]  # why, for each sentence over the token limit (left out of the translation)
    unsure_words: list[tuple[int, int]]  # [start, end) character spans of the translation's unsure words

    @property
    def mean_log_prob(self) -> float | None:
        """The model's confidence: log-probability per token (None: nothing was searched)."""
        return self.log_prob / self.tokens if self.tokens else None

    def as_json(self) -> dict[str, Any]:
        return {
            "mean_log_prob": self.mean_log_prob,
            "log_prob": self.log_prob if self.tokens else None,
            "tokens": self.tokens,
            "unsure": self.unsure,
            "unsure_words": [list(span) for span in self.unsure_words],
            "short": self.short,
            "not_translated": self.not_translated,
            "left_out": self.left_out,
            "unchanged": self.unchanged,
            "sentences": self.sentences,
            "clauses": self.clauses,
        }


def combined(lines: Sequence[Details], texts: Sequence[str]) -> Details:
    """The details of ``texts`` joined by line breaks (a JSON request's sentence of several lines)."""
    starts = [sum(len(text) + 1 for text in texts[:i]) for i in range(len(texts))]
    return Details(
        sum(line.log_prob for line in lines),
        sum(line.tokens for line in lines),
        sum(line.sentences for line in lines),
        sum(line.clauses for line in lines),
        any(line.unsure for line in lines),
        any(line.short for line in lines),
        sum(line.unchanged for line in lines),
        sorted({ch for line in lines for ch in line.left_out}),
        [why for line in lines for why in line.not_translated],
        [(start + a, start + b) for line, start in zip(lines, starts, strict=True) for a, b in line.unsure_words],
    )
