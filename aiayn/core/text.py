"""Requests into sentences and back: line breaks kept, long sentences split (never truncated), limits explicit."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_CHARS = 5000  # per request on the page and the API; the message names this number
MAX_FILE_CHARS = 50_000  # per uploaded file on the page; `aiayn translate --input` has no limit
MAX_SENTENCE_TOKENS = 200  # longer sentences are split at word boundaries; the models saw ≤ ~80 in training

# A sentence ends at . ! ? … (then closing quotes or brackets) followed by white space;
# the next sentence must start like one (see ``starts_sentence``).
SENTENCE_END = re.compile(r"[.!?…]+[\"'’”»)\]]*\s+")
OPENING = "\"'‘“„«(["
ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "vs", "etc", "nr", "bzw", "ca", "z.b", "u.a", "usw"})
# Only \n, \r\n and \r end a line. str.splitlines also breaks at these (vertical tab, form feed, the file, group
# and record separators, NEL, U+2028, U+2029): inside a line they are white space, so one line stays one line.
LINE_BREAK = re.compile(r"\r\n|\r|\n")
OTHER_BREAKS = re.compile("[\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


class InputTooLong(ValueError):
    pass


@dataclass(frozen=True)
class Layout:
    """Where each sentence came from: ``lines[i]`` is the list of sentence indices of line i."""

    sentences: list[str]
    lines: list[list[int]]


def check_length(text: str, limit: int = MAX_CHARS, what: str = "the text") -> None:
    if len(text) > limit:
        upload = f"upload it as a .txt file (up to {MAX_FILE_CHARS} characters), " if limit < MAX_FILE_CHARS else ""
        raise InputTooLong(
            f"{what} has {len(text)} characters; at most {limit} are translated per request here — "
            f"split it, {upload}or translate a file of any size with `aiayn translate --input FILE`"
        )


def starts_sentence(text: str) -> bool:
    """An upper-case letter, a digit, or a letter of a script without case (after any opening quotes)."""
    rest = text.lstrip(OPENING)
    return bool(rest) and (rest[0].isdigit() or (rest[0].isalpha() and not rest[0].islower()))


def ends_in_abbreviation(text: str) -> bool:
    words = text.split()
    return bool(words) and words[-1].lower() in ABBREVIATIONS


def split_sentences(line: str) -> list[str]:
    """Sentences of one line, every character kept (only the white space between sentences goes)."""
    pieces, start = [], 0
    for end in SENTENCE_END.finditer(line):
        before = line[start : end.start()]
        if not starts_sentence(line[end.end() :]) or (end.group().startswith(".") and ends_in_abbreviation(before)):
            continue
        pieces.append(line[start : end.end()].strip())
        start = end.end()
    pieces.append(line[start:].strip())
    return [piece for piece in pieces if piece]


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` (a final line break adds no empty line), the other breaks turned into spaces."""
    lines = LINE_BREAK.split(OTHER_BREAKS.sub(" ", text))
    if lines[-1] == "":
        lines.pop()
    return lines


def layout(text: str | list[str]) -> Layout:
    """Split into lines (unless given as lines), and lines into sentences; blank lines stay blank."""
    sentences: list[str] = []
    lines: list[list[int]] = []
    for line in split_lines(text) if isinstance(text, str) else text:
        parts = split_sentences(line)
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
