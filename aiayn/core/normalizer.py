"""tokenizer.json as the whole text contract: everything the CLI does to a sentence's text, in the file itself.

The CLI tidies a sentence before tokenizing it: characters the vocabulary lacks are left out (the model would
only see ``<unk>``; ``serve/service.py`` names them to the user), then ``tokenizer.normalize_text``: NFKC and
runs of white space as one space, trimmed. A runtime that loads only ``tokenizer.json`` (HF tokenizers in
Python or Rust, tokenizers.js) gets the same ids from the raw sentence when the file's normalizer does the same,
in the same order (:func:`tidy_normalizer`):

1. drop the raw characters whose tidied form encodes to ``<unk>`` (before NFKC, as the service does, so that
   ``e`` + U+0301 loses its accent exactly as there);
2. code points that this Python's Unicode tables leave unassigned become U+FFFD, so a runtime with newer
   tables (Node 20's ICU) cannot NFKC them into known letters;
3. the few code points whose NFKC differs between Python's ``unicodedata`` and the tables compiled into
   HF tokenizers are replaced by Python's form;
4. NFKC;
5. every run of what ``str.split()`` splits on (tab, VT, FF, U+2028, NBSP, U+3000, ...) → one space;
6. a leading and a trailing space removed.

The vocabulary, pre-tokenizer, model and decoder are untouched, so text that the CLI already tidied gets the
same ids as before: a folder's tokenizer.json can be tidied without retraining (:func:`tidied`).
Regexes are written as character classes of the characters themselves, with only ``\\ ] [ ^ -`` escaped:
that reads the same in Oniguruma (HF tokenizers), JavaScript ``u``-mode RegExp, Rust ``regex`` and Python ``re``.
"""

from __future__ import annotations

import functools
import json
import sys
import unicodedata
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, normalizers

PLAIN_NFKC = {"type": "NFKC"}  # the normalizer of folders written before the text contract moved into the file


def normalize_text(text: str) -> str:
    """NFKC, trimmed, runs of white space as one space: the form the tokenizer round-trips exactly."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def code_points() -> list[str]:
    """Every Unicode scalar value (surrogates cannot be in a str)."""
    return [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]


def char_class(chars: Iterable[str], negate: bool = False) -> str:
    """A regex character class of ``chars``, consecutive code points merged into ranges."""

    def literal(code: int) -> str:
        ch = chr(code)
        return "\\" + ch if ch in "\\][^-" else ch

    codes = sorted({ord(c) for c in chars})
    parts: list[str] = []
    start = 0
    while start < len(codes):
        end = start
        while end + 1 < len(codes) and codes[end + 1] == codes[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{literal(codes[start])}-{literal(codes[end])}")
        else:
            parts.extend(literal(code) for code in codes[start : end + 1])
        start = end + 1
    return "[" + ("^" if negate else "") + "".join(parts) + "]"


@functools.cache
def whitespace_run() -> str:
    """A regex of one run of what ``str.split()`` splits on (built when first asked: it scans every code point)."""
    return char_class(c for c in code_points() if c.isspace()) + "+"


def kept_characters(tokenizer: Tokenizer, special_tokens: Iterable[str]) -> set[str]:
    """Raw code points the service keeps: white space, and those whose tidied form the BPE model covers.

    BPE without byte fallback gives ``<unk>`` exactly for a character outside its alphabet (the characters of
    its vocabulary entries), so this asks the alphabet instead of encoding a million texts.
    """
    special = set(special_tokens)
    alphabet = {ch for token in tokenizer.get_vocab() if token not in special for ch in token} | {" "}

    def covered(c: str) -> bool:
        tidy = normalize_text(c)
        return bool(tidy) and set(tidy) <= alphabet

    return {c for c in code_points() if c.isspace() or covered(c)}


def nfkc_differences() -> dict[str, str]:
    """Code points where Python's NFKC and HF tokenizers' NFKC disagree (different Unicode versions)."""
    theirs = normalizers.NFKC()
    ours = {c: unicodedata.normalize("NFKC", c) for c in code_points()}
    return {c: form for c, form in ours.items() if form != theirs.normalize_str(c)}


def tidy_normalizer(tokenizer: Tokenizer, special_tokens: Iterable[str]) -> normalizers.Normalizer:
    """The normalizer that does all of the CLI's text tidying (the module's steps 1-6) for this vocabulary."""
    unassigned = (c for c in code_points() if unicodedata.category(c) == "Cn")
    return normalizers.Sequence(
        [
            normalizers.Replace(Regex(char_class(kept_characters(tokenizer, special_tokens), negate=True)), ""),
            normalizers.Replace(Regex(char_class(unassigned)), "\ufffd"),
            *(normalizers.Replace(c, form) for c, form in sorted(nfkc_differences().items())),
            normalizers.NFKC(),
            normalizers.Replace(Regex(whitespace_run()), " "),
            # A regex, not normalizers.Strip: only U+0020 can be left at the ends here, and tokenizers.js'
            # Strip is JavaScript's trim(), which would also drop U+FEFF.
            normalizers.Replace(Regex("^ | $"), ""),
        ]
    )


def is_tidy(tokenizer: Tokenizer) -> bool:
    """Whether the file already carries the text contract (a normalizer beyond the plain NFKC)."""
    return json.loads(tokenizer.to_str()).get("normalizer") != PLAIN_NFKC


def tidied(tokenizer: Tokenizer, special_tokens: Iterable[str]) -> Tokenizer:
    """A copy of a plain-NFKC ``tokenizer`` with :func:`tidy_normalizer`; refuses any other normalizer, which
    this would silently replace."""
    if is_tidy(tokenizer):
        found = type(tokenizer.normalizer).__name__
        raise ValueError(f"expected the plain normalizer {PLAIN_NFKC}, found a {found}; the file is left as it is")
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.normalizer = tidy_normalizer(tokenizer, special_tokens)
    return copy
