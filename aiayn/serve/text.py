"""Requests into sentences and back: line breaks kept, long sentences split (never truncated), limits explicit."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_CHARS = 5000  # per request: the page and the API refuse more, with this number in the message
MAX_SENTENCE_TOKENS = 200  # longer sentences are split at word boundaries; the model was trained on ≤ ~80

# A sentence ends at . ! ? (with closing quotes or brackets) followed by space and an upper-case letter or digit.
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]»“”]*\s+(?=[\"'(«„“]?[A-ZÀ-ÖØ-ÞĀ-ſ0-9])")


class InputTooLong(ValueError):
    pass


@dataclass(frozen=True)
class Layout:
    """Where each sentence came from: ``lines[i]`` is the list of sentence indices of line i."""

    sentences: list[str]
    lines: list[list[int]]


def check_length(text: str) -> None:
    if len(text) > MAX_CHARS:
        raise InputTooLong(
            f"the text has {len(text)} characters; at most {MAX_CHARS} are translated per request — "
            "split it, or translate a file with `aiayn translate --input FILE`"
        )


def split_sentences(line: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(line.strip()) if s.strip()]


def layout(text: str) -> Layout:
    """Split into lines, and lines into sentences; blank lines stay blank."""
    sentences: list[str] = []
    lines: list[list[int]] = []
    for line in text.splitlines():
        parts = split_sentences(line)
        lines.append(list(range(len(sentences), len(sentences) + len(parts))))
        sentences.extend(parts)
    return Layout(sentences, lines)


def reassemble(shape: Layout, translations: list[str]) -> str:
    return "\n".join(" ".join(translations[i] for i in line) for line in shape.lines)


def split_long(sentence: str, count_tokens: Callable[[str], int], limit: int = MAX_SENTENCE_TOKENS) -> list[str]:
    """Halve a sentence at a word boundary until every piece has at most ``limit`` tokens."""
    words = sentence.split()
    if count_tokens(sentence) <= limit or len(words) < 2:
        if count_tokens(sentence) > limit:
            raise InputTooLong(f"a single word of {count_tokens(sentence)} tokens exceeds the limit of {limit}")
        return [sentence]
    middle = len(words) // 2
    head, tail = " ".join(words[:middle]), " ".join(words[middle:])
    return split_long(head, count_tokens, limit) + split_long(tail, count_tokens, limit)
