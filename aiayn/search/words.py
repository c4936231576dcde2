"""Which words of a translation the model was unsure of: each word's log-probability from its tokens' own, as the
search's step gave them (``Output.token_log_probs``), and where those words stand in the translated text.

A word is a subword that starts one (``▁Hund``) and the subwords that follow it up to the next start (``▁Schne``,
``e``, ``.`` make ``Schnee.``); its log-probability is its tokens' sum: the probability of the whole word. A word
whose log-probability falls under the folder's ``min_word_log_prob`` (``evaluation/confidence.py``, set on val)
is marked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from aiayn.core.tokenizer import METASPACE


@dataclass(frozen=True)
class Word:
    text: str  # as the tokenizer writes it, without the word start's space
    log_prob: float  # its tokens' sum


def words(pieces: Sequence[str], log_probs: Sequence[float]) -> list[Word]:
    """The words of one output: ``pieces`` are its vocabulary entries (``▁Zwei``, ``▁Hund``, ``e``), ``log_probs``
    each one's own log-probability."""
    found: list[tuple[list[str], float]] = []
    for piece, log_prob in zip(pieces, log_probs, strict=True):
        if piece.startswith(METASPACE) or not found:
            found.append(([piece], log_prob))
        else:
            found[-1][0].append(piece)
            found[-1] = (found[-1][0], found[-1][1] + log_prob)
    texts = ("".join(parts).replace(METASPACE, " ").strip() for parts, _ in found)
    return [Word(text, log_prob) for text, (_, log_prob) in zip(texts, found, strict=True) if text]


def least_word_log_prob(found: Sequence[Word]) -> float:
    """The log-probability of the word the model was least sure of (0.0 for an output without a word)."""
    return min((word.log_prob for word in found), default=0.0)


def unsure_spans(text: str, found: Sequence[Word], min_word_log_prob: float) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` in ``text`` of the words of ``found`` under ``min_word_log_prob``, without
    the punctuation around them.

    ``found`` are the words of the outputs that make ``text``, in its order; each is looked for after the last one
    found, whole and in any case (a clause's first word comes back in lower case, ``text/clauses.py``), so a
    word the text does not hold as the tokenizer wrote it (a clause's dropped period) is skipped, not misplaced.
    """
    if all(word.log_prob >= min_word_log_prob for word in found):
        return []  # most lines: nothing to look for
    spans = (letters(text, span) for span, word in located(text, found) if word.log_prob < min_word_log_prob)
    return [(start, end) for start, end in spans if start < end]


def letters(text: str, span: tuple[int, int]) -> tuple[int, int]:
    """``span`` without the punctuation around the word (``Schnee.`` marks ``Schnee``); empty for punctuation alone."""
    start, end = span
    while start < end and not text[start].isalnum():
        start += 1
    while end > start and not text[end - 1].isalnum():
        end -= 1
    return start, end


def located(text: str, found: Sequence[Word]) -> Iterator[tuple[tuple[int, int], Word]]:
    cursor = 0
    for word in found:
        match = re.compile(rf"(?<!\w){re.escape(word.text)}(?!\w)", re.IGNORECASE).search(text, cursor)
        if match is not None:
            cursor = match.end()
            yield match.span(), word
