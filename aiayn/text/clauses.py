"""Long sentences translated clause by clause: the bundled models saw single captions and stop early on more.

A sentence of three captions joined with ", and" comes back as its first clause or two and then ends (on
Multi30k val: 20.4 BLEU joined against 46.3 for the same captions translated one by one). So a sentence
longer than the model's training sentences (``ClauseSplitter.max_tokens``: the folder's ``clauses`` section,
written by `aiayn train` as the 90th percentile of its source lengths, ``train/corpus.py``) is halved before the
search at the clause boundary nearest its middle, recursively, as ``sentences.split_long`` pieces an over-long sentence:

* boundaries are a semicolon, or a comma followed by a conjunction that the pair's table knows
  (``, and`` → ``, und``); a bare comma or ``and`` split single captions too often on val and is not one;
* the boundary itself is not translated (alone, "and" comes back as "und und und."): its mark ends the left
  piece's translation and its conjunction, looked up in :data:`CONJUNCTIONS`, opens the right one's;
* the right piece is searched as a sentence (capitalized, as training captions are); its translation's first
  word goes back to lower case where the vocabulary has it so ("Ein" → "ein", "Mann" stays), and a left
  piece's translation loses the period the model ends every caption with.

Nothing is dropped: a sentence's pieces' sources, joined by spaces, are the sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiayn.core.folder import ModelFolder
from aiayn.core.tokenizer import SubwordTokenizer

# Conjunctions that may open a clause after a comma, by meaning; the first word of a language is what the
# meaning becomes in it.
MEANINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "and": {"en": ("and",), "de": ("und", "sowie"), "fr": ("et",), "cs": ("a",)},
    "but": {"en": ("but",), "de": ("aber",), "fr": ("mais",), "cs": ("ale",)},
    "or": {"en": ("or",), "de": ("oder",), "fr": ("ou",), "cs": ("nebo",)},
    "while": {"en": ("while", "whereas"), "de": ("während",), "fr": ("tandis que",), "cs": ("zatímco",)},
}
SENTENCE_END = (".", "!", "?", "…")
MIN_PIECE_TOKENS = 4  # no piece shorter than this (tokens, </s> included)
MAX_DEPTH = 2  # a sentence becomes at most 4 pieces


def conjunctions(src_lang: str, tgt_lang: str) -> dict[str, str]:
    """Source conjunction → its target word, for one language pair (empty for languages not in the table)."""
    return {
        word: words[tgt_lang][0]
        for words in MEANINGS.values()
        if src_lang in words and tgt_lang in words
        for word in words[src_lang]
    }


@dataclass(frozen=True)
class Clause:
    """A piece of a sentence: ``source_lead`` + ``text`` + ``tail`` is its source; ``lead`` is ``source_lead``
    in the target language, put before the translation of ``text``."""

    text: str
    lead: str = ""
    source_lead: str = ""
    tail: str = ""
    first: bool = True  # starts the sentence (searched as it is, translation kept as it comes)
    depth: int = 0

    def source(self) -> str:
        """The source text this piece stands for; a sentence's pieces' sources, joined by spaces, are it."""
        return " ".join(p for p in (self.source_lead, self.text + self.tail) if p)

    def query(self) -> str:
        """What the model is given: a clause that does not start the sentence is capitalized as a caption."""
        return self.text if self.first else self.text[:1].upper() + self.text[1:]


class ClauseSplitter:
    """Cuts long sentences into clauses before the search, and puts their translations back together."""

    def __init__(self, tokenizer: SubwordTokenizer, src_lang: str, tgt_lang: str, max_tokens: int | None) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens  # None: never split
        self.table = conjunctions(src_lang, tgt_lang)
        self.words = sorted(self.table, key=len, reverse=True)  # the longest first, as the regex must try them
        alternatives = "|".join(re.escape(w) for w in self.words) or "(?!)"
        self.boundary = re.compile(rf"(?P<mark>;)\s+|(?P<comma>,)\s+(?P<conj>{alternatives})\s+", re.IGNORECASE)

    @classmethod
    def of(cls, folder: ModelFolder, split: bool = True) -> ClauseSplitter:
        """The splitter for ``folder``'s model: over its ``clauses`` section's limit (never, without one or with
        ``split=False``)."""
        limit = folder.clause_limit() if split else None
        return cls(folder.tokenizer, folder.config.src_lang, folder.config.tgt_lang, limit)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode_source(text))  # </s> included, as the encoder reads it

    def split(self, sentence: str, tokens: int | None = None) -> list[Clause]:
        """``sentence`` as the clauses to search: itself, or halves of halves while it is too long. ``tokens``:
        its length (</s> included) where the caller has already encoded it."""
        return self.presplit(Clause(sentence), self.count_tokens(sentence) if tokens is None else tokens)

    def presplit(self, clause: Clause, tokens: int) -> list[Clause]:
        if self.max_tokens is None or tokens <= self.max_tokens or clause.depth >= MAX_DEPTH:
            return [clause]
        halves = self.halve(clause)
        if halves is None:
            return [clause]
        return [c for half in halves for c in self.presplit(half, self.count_tokens(half.query()))]

    def halve(self, clause: Clause) -> tuple[Clause, Clause] | None:
        """``clause`` cut at its strongest boundary (semicolon first) nearest the middle by tokens, or None."""
        text, total = clause.text, self.count_tokens(clause.text)
        options = []
        for m in self.boundary.finditer(text):
            before = self.count_tokens(text[: m.start()])
            if before >= MIN_PIECE_TOKENS and total - before >= MIN_PIECE_TOKENS:
                options.append((0 if m.group("mark") else 1, abs(before - total / 2), m))
        if not options:
            return None
        _, _, m = min(options, key=lambda option: option[:2])
        conj = m.group("conj") or ""
        depth = clause.depth + 1
        left = Clause(text[: m.start()], clause.lead, clause.source_lead, m.group("mark") or ",", clause.first, depth)
        right = Clause(text[m.end() :], self.table.get(conj.lower(), ""), conj, clause.tail, False, depth)
        return left, right

    def render(self, clause: Clause, translation: str) -> str:
        """One piece's target text: its lead, its translation set mid-sentence, its tail."""
        text = translation
        if clause.depth and not clause.text.rstrip().endswith(SENTENCE_END) and text.endswith("."):
            text = text[:-1].rstrip()  # the model ends every caption with a period
        if not clause.first and text:
            word, _, rest = text.partition(" ")
            if word != word.lower() and word[1:] == word[1:].lower() and self.tokenizer.is_word(word.lower()):
                text = f"{word.lower()} {rest}".rstrip()
        return " ".join(p for p in (clause.lead, text + clause.tail) if p)
