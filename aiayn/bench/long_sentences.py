"""`aiayn bench --long`: long sentences against the same sentences translated one by one (a quality figure).

Runs of ``RUN`` consecutive captions of a split (val: test sets are for reporting) are joined into one
sentence with ", and " (", und " in German ...), their references the same way. The target is the BLEU
of the captions translated separately and then joined by the same rule; the service translates the joined
sentences with clause splitting (``text/clauses.py``) and without it (before). A translation counts as
short when it has under 80% of the tokens of the separately translated captions: the "lost content" figure.

Joining: a non-final caption loses its final period; a non-initial caption's first word goes to lower case
where the training split writes that word in lower case more often than capitalized after a sentence's first
word ("A" → "a", "Ein" → "ein", "Menschen" stays).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from aiayn.data.multi30k import ParallelCorpus
from aiayn.evaluation.metrics import score
from aiayn.serve.service import LoadedModel
from aiayn.text.clauses import ClauseSplitter, conjunctions

RUN = 3
JOINERS = {"en": ", and ", "de": ", und ", "fr": ", et ", "cs": ", a "}


def lower_words(sentences: Sequence[str]) -> frozenset[str]:
    """Capitalized words that ``sentences`` write in lower case more often, away from a sentence's start."""
    counts: Counter[str] = Counter(word for s in sentences for word in s.split()[1:])
    return frozenset(w.capitalize() for w in counts if w.islower() and counts[w] > counts[w.capitalize()])


def join(captions: Sequence[str], joiner: str, lower: frozenset[str]) -> str:
    """One sentence of several captions, joined as the module says."""
    parts = []
    for i, caption in enumerate(captions):
        text = caption.strip()
        if i < len(captions) - 1:
            text = text.removesuffix(".").rstrip()
        word, _, rest = text.partition(" ")
        if i and word in lower:
            text = f"{word.lower()} {rest}".strip()
        if text:
            parts.append(text)
    return joiner.join(parts)


def runs(sentences: Sequence[str], joiner: str, lower: frozenset[str]) -> list[str]:
    return [join(sentences[i : i + RUN], joiner, lower) for i in range(0, len(sentences), RUN)]


@dataclass(frozen=True)
class LongSentenceFigures:
    sentences: int  # joined sentences
    separate: float  # BLEU of the captions translated one by one, then joined: the target
    before: float  # joined sentences, clause splitting off
    after: float  # joined sentences, clause splitting on
    short_before: int  # outputs under 80% of the separately translated tokens
    short_after: int
    seconds: float


def measure(model: LoadedModel, corpus: ParallelCorpus, train: ParallelCorpus, beam: int) -> LongSentenceFigures:
    """The figures for ``corpus`` (val) joined in runs; ``train`` gives each language's lower-case words."""
    started = time.perf_counter()
    src_join, tgt_join = JOINERS.get(corpus.src_lang, ", "), JOINERS.get(corpus.tgt_lang, ", ")
    src_lower, tgt_lower = lower_words(train.src), lower_words(train.tgt)
    references = runs(corpus.tgt, tgt_join, tgt_lower)
    joined = runs(corpus.src, src_join, src_lower)

    def translate(lines: list[str]) -> list[str]:
        return model.run(model.prepare(lines), beam).text.split("\n")

    separate = runs(translate(list(corpus.src)), tgt_join, tgt_lower)
    after = translate(joined)
    splitting = model.clauses
    model.clauses = ClauseSplitter(model.tokenizer, corpus.src_lang, corpus.tgt_lang, None)
    try:
        before = translate(joined)
    finally:
        model.clauses = splitting

    def short(outputs: list[str]) -> int:
        tokens = model.tokenizer.encode_batch
        return sum(len(o) < 0.8 * len(s) for o, s in zip(tokens(outputs), tokens(separate), strict=True))

    return LongSentenceFigures(
        len(joined),
        score(separate, references).bleu,
        score(before, references).bleu,
        score(after, references).bleu,
        short(before),
        short(after),
        time.perf_counter() - started,
    )


def long_report(figures: LongSentenceFigures, pair: str, split: str, beam: int) -> str:
    known = ", ".join(f"{a} → {b}" for a, b in conjunctions(*pair.split("-")).items()) or "none"
    gap = figures.separate - figures.after
    return "\n".join(
        [
            f"{pair}, {split}: {figures.sentences} sentences of {RUN} captions joined, beam {beam} "
            f"({figures.seconds:.0f} s); conjunctions known: {known}",
            f"  captions one by one, then joined (target)  BLEU {figures.separate:6.2f}",
            f"  joined, translated whole (before)           BLEU {figures.before:6.2f}   "
            f"short outputs {figures.short_before}/{figures.sentences}",
            f"  joined, clause by clause (after)            BLEU {figures.after:6.2f}   "
            f"short outputs {figures.short_after}/{figures.sentences}",
            f"  gap to the target: {gap:.2f} BLEU (goal: within 2)",
        ]
    )
