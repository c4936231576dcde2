"""Requests into sentences and back: line breaks kept, long sentences split (never truncated), limits explicit."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import sentencex

MAX_CHARS = 5000  # per request on the page and the API; the message names this number
MAX_FILE_CHARS = 50_000  # per uploaded file on the page; `aiayn translate --input` has no limit
MAX_SENTENCE_TOKENS = 200  # longer sentences are split at word boundaries; the models saw ≤ ~80 in training

OPENING = "\"'‘“„«(["
# Only \n, \r\n and \r end a line. str.splitlines also breaks at these (vertical tab, form feed, the file, group
# and record separators, NEL, U+2028, U+2029): inside a line they are white space, so one line stays one line.
LINE_BREAK = re.compile(r"\r\n|\r|\n")
OTHER_BREAKS = re.compile("[\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# A code point of a UTF-16 surrogate pair, alone in a Python string (JSON's "\ud800" gives one): not text, and no
# encoding, UTF-8 first, can write it.
SURROGATE = re.compile("[\ud800-\udfff]")


class InputTooLong(ValueError):
    pass


@dataclass(frozen=True)
class Layout:
    """Where each sentence came from: ``lines[i]`` is the list of sentence indices of line i."""

    sentences: list[str]
    lines: list[list[int]]


def check_length(text: str, limit: int = MAX_CHARS, what: str = "the text") -> None:
    """What every request's text must be, one rule for the page, its API and the JSON route: at most ``limit``
    characters, and Unicode text (no lone surrogate)."""
    if len(text) > limit:
        upload = f"upload it as a .txt file (up to {MAX_FILE_CHARS} characters), " if limit < MAX_FILE_CHARS else ""
        raise InputTooLong(
            f"{what} has {len(text)} characters; at most {limit} are translated per request here — "
            f"split it, {upload}or translate a file of any size with `aiayn translate --input FILE`"
        )
    lone = SURROGATE.search(text)
    if lone is not None:
        raise ValueError(
            f"{what} is not Unicode text: character {lone.start() + 1} is a lone surrogate "
            f"(U+{ord(lone.group()):04X}), which no encoding can write"
        )


def opens_sentence(ch: str) -> bool:
    """An upper-case letter, a digit, or a letter of a script without case."""
    return ch.isdigit() or (ch.isalpha() and not ch.islower())


def starts_sentence(text: str) -> bool:
    """``opens_sentence`` holds for the first character after any opening quotes or brackets."""
    rest = text.lstrip(OPENING)
    return bool(rest) and opens_sentence(rest[0])


def split_sentences(line: str, language: str) -> list[str]:
    """Sentences of one line, every character kept (only the white space between sentences goes).

    Wikimedia's sentencex cuts by ``language``'s rules (its abbreviations, ~300 languages; a code it does not
    know gets its generic rules). A cut is kept only where white space separates the pieces and the next one
    starts like a sentence (``starts_sentence``), else the pieces are joined again: sentencex also cuts before a
    lower-case word ("FROG! stands") and inside a word ("U.S Army"). docs/onnx.md#sentences has the figures.
    sentencex builds a language's rules once per process (up to ~1 ms), then takes ~2 µs a line: no cache here.
    """
    pieces: list[str] = []
    for segment in sentencex.segment(language, line):
        if pieces and not (is_spaced(pieces[-1], segment) and starts_sentence(segment.lstrip())):
            pieces[-1] += segment
        else:
            pieces.append(segment)
    return [piece.strip() for piece in pieces if piece.strip()]


def is_spaced(before: str, after: str) -> bool:
    return before[-1:].isspace() or after[:1].isspace()


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` (a final line break adds no empty line), the other breaks turned into spaces."""
    lines = LINE_BREAK.split(OTHER_BREAKS.sub(" ", text))
    if lines[-1] == "":
        lines.pop()
    return lines


def layout(text: str | list[str], language: str) -> Layout:
    """Split into lines (unless given as lines), and lines into sentences of ``language``; blank lines stay blank."""
    sentences: list[str] = []
    lines: list[list[int]] = []
    for line in split_lines(text) if isinstance(text, str) else text:
        parts = split_sentences(line, language)
        lines.append(list(range(len(sentences), len(sentences) + len(parts))))
        sentences.extend(parts)
    return Layout(sentences, lines)


def reassemble(shape: Layout, translations: list[str]) -> str:
    return "\n".join(" ".join(translations[i] for i in line) for line in shape.lines)


def split_long(sentence: str, count_tokens: Callable[[str], int], limit: int = MAX_SENTENCE_TOKENS) -> list[str]:
    """Halve a sentence at a word boundary until every piece has at most ``limit`` tokens; nothing is dropped."""
    tokens = count_tokens(sentence)
    if tokens <= limit:
        return [sentence]
    words = sentence.split()
    if len(words) < 2:
        raise InputTooLong(
            f"a single word of {tokens} tokens is over the limit of {limit} tokens per sentence: "
            f"{sentence[:40]}…; add spaces or remove it"
        )
    middle = len(words) // 2
    head, tail = " ".join(words[:middle]), " ".join(words[middle:])
    return split_long(head, count_tokens, limit) + split_long(tail, count_tokens, limit)
