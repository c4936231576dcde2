"""Translation as the CLI, the page and the API see it: text in, text out, with provider and latency.

Torch-free: ONNX Runtime, NumPy and the tokenizer only.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from aiayn.core.folder import ModelFolder
from aiayn.engines import Engine
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.options import DEFAULT_OPTIONS, EngineOptions
from aiayn.search.output import Output, mean_log_prob
from aiayn.search.translator import SearchSettings
from aiayn.search.words import unsure_spans, words
from aiayn.serve.batching import SearchBatcher
from aiayn.serve.details import Details, combined
from aiayn.serve.memory import return_freed_memory
from aiayn.text.clauses import Clause, ClauseSplitter
from aiayn.text.sentences import (
    MAX_FILE_CHARS,
    MAX_SENTENCE_TOKENS,
    InputTooLong,
    Layout,
    check_length,
    layout,
    split_long,
)

# A translation with fewer tokens than this share of its source's probably left part of it out (on Multi30k val
# 5% of single captions fall under 0.7 in either direction); sources shorter than SHORT_MIN_SOURCE are not judged.
SHORT_RATIO, SHORT_MIN_SOURCE = 0.6, 12


class TimedOut(Exception):
    """A request not answered within its time limit; its searches not yet started are dropped."""


@dataclass(frozen=True)
class Deadline:
    """When a request given ``timeout_s`` from its start is past its time (None: never)."""

    timeout_s: float | None = None
    at: float = math.inf  # on time.monotonic's clock

    @classmethod
    def after(cls, timeout_s: float | None) -> Deadline:
        return cls(timeout_s, math.inf if timeout_s is None else time.monotonic() + timeout_s)

    def left(self) -> float | None:
        """The seconds left (None: no limit)."""
        return None if self.timeout_s is None else max(0.0, self.at - time.monotonic())

    def check(self) -> None:
        """``TimedOut`` once past its time: the work not started yet is not started."""
        if self.left() == 0.0:
            raise self.past()

    def past(self) -> TimedOut:
        return TimedOut(f"not answered within {self.timeout_s:g} s")

    def outputs(self, futures: list[Future[list[Output]]]) -> list[list[Output]]:
        """The searches' outputs, or ``TimedOut`` once past its time: then each is cancelled, and the batcher drops
        what it has not searched yet (a search whose every job is cancelled stops before its next length batch)."""
        if wait(futures, self.left()).not_done:
            for future in futures:
                future.cancel()
            raise self.past()
        return [future.result() for future in futures]


@dataclass(frozen=True)
class Attention:
    """Cross-attention of the last decoder layer for one sentence and its translation."""

    source_tokens: list[str]
    output_tokens: list[str]
    weights: np.ndarray  # (heads, out_len, src_len)


@dataclass(frozen=True)
class Prepared:
    """A text cut into what the search gets: token ids of each sentence, or of each piece of a long one."""

    layout: Layout
    src_ids: list[list[int]]
    sentence_of: list[int]  # piece → index of its sentence in ``layout.sentences``
    clauses: list[Clause]  # piece → the clause it searches (a whole sentence unless clauses.py split it)
    left_out: list[str]  # characters outside the vocabulary, removed from the sentences translated
    refused: dict[int, str]  # sentence index → why it cannot be translated (a single word over the token limit)

    def refusals(self) -> list[tuple[int, str]]:
        """(line index, reason) for each refused sentence, in the order of the text."""
        return [(i, self.refused[s]) for i, line in enumerate(self.layout.lines) for s in line if s in self.refused]


@dataclass(frozen=True)
class Result:
    """A translated text with what the page, the API and the CLI tell about it."""

    text: str
    provider: str
    latency_ms: float  # the search's, for every request searched together with this one
    sentences: int
    left_out: list[str]
    unchanged: int  # sentences without a single known word, passed through as they are
    short_lines: list[int]  # lines (from 0) with a sentence whose translation looks short for its source
    unsure_lines: list[int]  # lines (from 0) with a sentence the model translated with little confidence
    refused: list[tuple[int, str]]  # (line, why) of each sentence left out: a single word over the token limit
    lines: list[Details]  # what the model knows about each line
    alternatives: list[str] = field(default_factory=list)  # the beam's next best texts, where asked for (``n_best``)

    def line_texts(self) -> list[str]:
        """The translation of each line (a text of blank lines alone translates to nothing: each gets "")."""
        texts = self.text.split("\n") if self.lines else []
        return texts + [""] * (len(self.lines) - len(texts))

    def details(self) -> Details:
        """What the model knows about the whole text (``details.combined``: the JSON route's, the page's marks)."""
        return combined(self.lines, self.line_texts())


class LoadedModel:
    """One model folder ready to translate: engine, tokenizer and the translator over them. ``split_clauses=False``
    translates every sentence whole, as another runtime given the same sentences would (``text/clauses.py``)."""

    def __init__(self, folder: ModelFolder, engine: Engine[Any], split_clauses: bool = True) -> None:
        self.folder = folder
        self.config = folder.config
        self.tokenizer = folder.tokenizer
        self.engine = engine
        self.translator = translator_for(folder, engine)
        self.batcher = SearchBatcher(self.translator)
        self.search = SearchSettings.of(folder)
        self.clauses = ClauseSplitter.of(folder, split_clauses)
        self.min_mean_log_prob = folder.min_mean_log_prob()
        self.min_word_log_prob = folder.min_word_log_prob()
        self.pieces = self.tokenizer.vocabulary()  # id → vocabulary entry, for the words of an output
        self.sentence_limit = min(MAX_SENTENCE_TOKENS, self.config.max_len)

    @property
    def provider(self) -> str:
        return self.engine.provider

    def count_tokens(self, sentence: str) -> int:
        return len(self.tokenizer.encode_source(sentence))

    def prepare(self, text: str | list[str]) -> Prepared:
        """Lines → sentences → token ids. Characters the vocabulary lacks (emoji, other scripts) are taken
        out, since the model would only see <unk>; a sentence left without a letter or digit is kept as is.
        A sentence that cannot be cut to the token limit is refused alone, so the rest still translates."""
        laid_out = layout(text, self.config.src_lang)
        unknown = self.tokenizer.unknown_characters(" ".join(laid_out.sentences))
        encoded = functools.cache(self.tokenizer.encode_source)  # a piece is counted, then searched: encoded once
        src_ids: list[list[int]] = []
        sentence_of: list[int] = []
        clauses: list[Clause] = []
        left_out: set[str] = set()
        refused: dict[int, str] = {}
        for index, sentence in enumerate(laid_out.sentences):
            known = " ".join("".join(ch for ch in sentence if ch not in unknown).split())
            if not any(ch.isalnum() for ch in known):
                continue
            try:
                pieces = split_long(known, lambda piece: len(encoded(piece)), self.sentence_limit)
            except InputTooLong as err:
                refused[index] = str(err)
                continue
            left_out.update(ch for ch in sentence if ch in unknown)
            for piece in pieces:
                whole = encoded(piece)  # at most sentence_limit tokens, within the model's limit
                cut = self.clauses.split(piece, len(whole))
                src_ids += [whole] if len(cut) == 1 else [self.translator.source_ids(c.query()) for c in cut]
                sentence_of += [index] * len(cut)
                clauses += cut
        return Prepared(laid_out, src_ids, sentence_of, clauses, sorted(left_out), refused)

    def settings(self, beam_size: int | None, n_best: int = 1) -> SearchSettings:
        """The folder's search settings with ``beam_size`` (None: the folder's own), keeping the ``n_best``
        outputs of each sentence, at most as many as the beam holds."""
        settings = self.search if beam_size is None else replace(self.search, beam_size=beam_size)
        return settings if n_best == 1 else replace(settings, n_best=min(n_best, settings.beam_size))

    def run(
        self, prepared: Prepared, beam_size: int | None = None, on_batch: Callable[[int], object] | None = None
    ) -> Result:
        """Search all pieces as one batch; ``on_batch(k)`` after each batch of k pieces."""
        started = time.perf_counter()
        outputs = self.translator.outputs(prepared.src_ids, self.settings(beam_size), on_batch)
        return self.assemble(prepared, outputs, milliseconds_since(started))

    def translate(self, text: str, beam_size: int | None = None, timeout_s: float | None = None) -> Result:
        """Translate ``text`` sentence by sentence, keeping its line breaks; searched together with the
        other requests of the moment (``batching.py``); refused whole if any sentence is. Not answered within
        ``timeout_s`` (None: no limit), ``TimedOut``, and its searches not yet run are dropped."""
        deadline = Deadline.after(timeout_s)
        prepared = self.prepare(text)
        refuse_any(prepared.refusals())
        deadline.check()
        started = time.perf_counter()
        (outputs,) = deadline.outputs([self.batcher.submit(prepared.src_ids, self.settings(beam_size))])
        return self.assemble(prepared, outputs, milliseconds_since(started))

    def assemble(self, prepared: Prepared, outputs: list[Output], latency_ms: float) -> Result:
        """The pieces' outputs back into sentences and lines, with each line's details."""
        per_sentence = list(prepared.layout.sentences)
        pieces: dict[int, list[int]] = {}  # sentence → its pieces, in order
        for index in {*prepared.sentence_of, *prepared.refused}:
            per_sentence[index] = ""
        for piece, (index, clause, output) in enumerate(
            zip(prepared.sentence_of, prepared.clauses, outputs, strict=True)
        ):
            rendered = self.clauses.render(clause, self.tokenizer.decode(output.tokens))
            per_sentence[index] = f"{per_sentence[index]} {rendered}".strip()
            pieces.setdefault(index, []).append(piece)
        texts = [" ".join(per_sentence[i] for i in line) for line in prepared.layout.lines]  # ``reassemble``'s lines
        lines = [
            self.details(prepared, outputs, pieces, line, text)
            for line, text in zip(prepared.layout.lines, texts, strict=True)
        ]
        return Result(
            "\n".join(texts) if per_sentence else "",  # blank lines alone translate to nothing
            self.provider,
            latency_ms,
            len(per_sentence),
            prepared.left_out,
            sum(line.unchanged for line in lines),
            [number for number, line in enumerate(lines) if line.short],
            [number for number, line in enumerate(lines) if line.unsure],
            prepared.refusals(),
            lines,
        )

    def alternatives(self, prepared: Prepared, outputs: list[Output]) -> list[str]:
        """The text again from each piece's next best outputs (the second of every piece, then the third, ...; a
        piece with fewer keeps its best), each text once and none the same as the best's."""
        best = self.assemble(prepared, outputs, 0.0).text
        count = max((len(output.others) for output in outputs), default=0)
        texts = [
            self.assemble(prepared, [o.others[i] if i < len(o.others) else o for o in outputs], 0.0).text
            for i in range(count)
        ]
        return [text for text in dict.fromkeys(texts) if text != best]

    def details(
        self, prepared: Prepared, outputs: list[Output], pieces: dict[int, list[int]], line: list[int], text: str
    ) -> Details:
        """What the model knows about one line: ``line`` its sentences, ``pieces`` each sentence's searched pieces,
        ``text`` its translation."""
        searched = [sentence for sentence in line if sentence in pieces]
        own = [[outputs[piece] for piece in pieces[sentence]] for sentence in searched]  # each sentence's outputs
        source_tokens = [sum(len(prepared.src_ids[p]) - 1 for p in pieces[s]) for s in searched]  # without </s>
        output_tokens = [sum(len(output.tokens) for output in sentence) for sentence in own]
        threshold, word_threshold = self.min_mean_log_prob, self.min_word_log_prob
        outputs_of_line = [output for sentence in own for output in sentence]
        # A word's log-probability is at least its output's (a sum of negative terms): where no output falls under the
        # word threshold, no word can, and the line's words are not worth cutting (most lines).
        marks = word_threshold is not None and any(sum(o.token_log_probs) < word_threshold for o in outputs_of_line)
        found = [
            word
            for output in (outputs_of_line if marks else [])
            for word in words([self.pieces[i] for i in output.tokens], output.token_log_probs)
        ]
        left_out = set(prepared.left_out)
        return Details(
            sum(output.log_prob for sentence in own for output in sentence),
            sum(output.scored_tokens for sentence in own for output in sentence),
            len(line),
            sum(len(sentence) for sentence in own),
            threshold is not None and any(mean_log_prob(sentence) < threshold for sentence in own),
            any(looks_short(n, out) for n, out in zip(source_tokens, output_tokens, strict=True)),
            sum(1 for sentence in line if sentence not in pieces and sentence not in prepared.refused),
            sorted({ch for s in searched for ch in prepared.layout.sentences[s] if ch in left_out}),
            [prepared.refused[sentence] for sentence in line if sentence in prepared.refused],
            unsure_spans(text, found, word_threshold) if marks and word_threshold is not None else [],
        )

    def attention(self, src_ids: list[int], out_ids: list[int]) -> Attention:
        """A forced pass of the decoder over ``out_ids``: row i is the step that produced out_ids[i] (then </s>)."""
        decoder_in = [self.engine.bos_id, *out_ids]
        weights = self.engine.cross_attention(np.array([src_ids]), np.array([decoder_in]))[0]
        tokens = self.tokenizer.tokens
        return Attention(tokens(src_ids[:-1]) + ["</s>"], tokens(out_ids) + ["</s>"], weights)


def milliseconds_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def refuse_any(refusals: list[tuple[int, str]]) -> None:
    """A text is refused whole, naming its first sentence that cannot be translated."""
    if refusals:
        line, reason = refusals[0]
        raise InputTooLong(f"line {line + 1}: {reason}")


def looks_short(source_tokens: int, output_tokens: int) -> bool:
    """Whether a sentence's output (pieces summed) has under ``SHORT_RATIO`` of its source's tokens."""
    return source_tokens >= SHORT_MIN_SOURCE and output_tokens < SHORT_RATIO * source_tokens


def submit_together(
    prepared: list[tuple[LoadedModel, Prepared, int | None]], n_best: int = 1
) -> list[Future[list[Output]]]:
    """Each (model, prepared text, beam size) handed to its model's batcher, those of one model as one item
    (``SearchBatcher.submit_all``): a worker takes them into one search, where handed over one by one as each was
    cut, the first would be searched alone and a request's batch split in two."""
    futures: dict[int, Future[list[Output]]] = {}
    for loaded in {id(loaded): loaded for loaded, _, _ in prepared}.values():
        mine = [i for i, (owner, _, _) in enumerate(prepared) if owner is loaded]
        searches = [(prepared[i][1].src_ids, loaded.settings(prepared[i][2], n_best)) for i in mine]
        futures.update(zip(mine, loaded.batcher.submit_all(searches), strict=True))
    return [futures[i] for i in range(len(prepared))]


class TranslationService:
    """Loads models by name on first use, each with the engine ``options`` say, and serves them to many threads
    (``split_clauses``: as ``LoadedModel``)."""

    def __init__(self, options: EngineOptions = DEFAULT_OPTIONS, split_clauses: bool = True) -> None:
        self.options, self.split_clauses = options, split_clauses
        self.models: dict[str, LoadedModel] = {}
        self.lock = threading.Lock()

    def model(self, name: str) -> LoadedModel:
        with self.lock:
            if name not in self.models:
                folder = ModelFolder.open(name)
                engine = load_engine(folder, self.options)
                self.models[name] = LoadedModel(folder, engine, self.split_clauses)
                return_freed_memory()  # what building the engine's graphs took
            return self.models[name]

    def translate_many(
        self, requests: Sequence[tuple[str, str, int | None]], timeout_s: float | None = None, n_best: int = 1
    ) -> list[Result]:
        """Requests of the page or the API, each (text, model, beam size or None for the folder's), at most
        ``MAX_CHARS`` characters each:
        all handed to their model's batcher before any is waited for, so they are searched together. A sentence
        that cannot be translated (a single word over the token limit) is left out and named in ``refused``.
        The latency covers the search. Not answered within ``timeout_s`` (None: no limit), ``TimedOut``: the
        searches are cancelled, and the batcher drops what it has not searched yet. ``n_best`` above 1: each result
        with up to ``n_best - 1`` alternatives (``LoadedModel.alternatives``), never more than its beam holds."""
        deadline = Deadline.after(timeout_s)
        for text, _, _ in requests:
            check_length(text)
        started = time.perf_counter()
        pending = [(self.model(model), text, beam_size) for text, model, beam_size in requests]
        prepared = [(loaded, loaded.prepare(text), beam_size) for loaded, text, beam_size in pending]
        deadline.check()
        outputs = deadline.outputs(submit_together(prepared, n_best))
        latency_ms = milliseconds_since(started)
        results = [
            loaded.assemble(cut, out, latency_ms) for (loaded, cut, _), out in zip(prepared, outputs, strict=True)
        ]
        if n_best == 1:
            return results
        return [
            replace(result, alternatives=loaded.alternatives(cut, out))
            for result, (loaded, cut, _), out in zip(results, prepared, outputs, strict=True)
        ]

    def translate_each(
        self, requests: Sequence[tuple[str, str, int | None]], timeout_s: float | None = None
    ) -> list[Result | Exception]:
        """``translate_many``, each request's failure its own: where the requests together raise, each is asked
        again alone (within what is left of ``timeout_s``), and one that still raises gets its exception in its
        place; the others their results. Past their time, every request still unanswered gets ``TimedOut``."""
        deadline = Deadline.after(timeout_s)
        try:
            return list(self.translate_many(requests, timeout_s))
        except TimedOut as err:
            return [err] * len(requests)  # asked again, they would only be later
        except Exception as err:
            if len(requests) == 1:
                return [err]
        return [self.translate_each([request], deadline.left())[0] for request in requests]

    def translate(self, text: str, model: str, beam_size: int | None = None, timeout_s: float | None = None) -> Result:
        """One request, refused whole if any of its sentences cannot be translated (``translate_many``'s time
        limit)."""
        result = self.translate_many([(text, model, beam_size)], timeout_s)[0]
        refuse_any(result.refused)
        return result

    def attention(
        self, text: str, model: str, beam_size: int | None = None, timeout_s: float | None = None
    ) -> Attention | None:
        """The heatmap's data, asked for by the page only: the first piece of ``text`` searched again (to the
        output it had, since a search does not depend on its batch), then a forced pass of the decoder over it;
        ``TimedOut`` past ``timeout_s``."""
        deadline = Deadline.after(timeout_s)
        check_length(text)
        loaded = self.model(model)
        prepared = loaded.prepare(text)
        if not prepared.src_ids:
            return None
        first = prepared.src_ids[0]
        (outputs,) = deadline.outputs([loaded.batcher.submit([first], loaded.settings(beam_size))])
        return loaded.attention(first, outputs[0].tokens)

    def translate_file(
        self, text: str, model: str, beam_size: int | None = None, timeout_s: float | None = None
    ) -> str:
        """An uploaded file's text, at most ``MAX_FILE_CHARS`` characters, translated line by line within
        ``timeout_s`` (``LoadedModel.translate``)."""
        check_length(text, MAX_FILE_CHARS, "the file")
        return self.model(model).translate(text, beam_size, timeout_s).text
