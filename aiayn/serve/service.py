"""Translation as the CLI, the page and the API see it: text in, text out, with provider and latency.

Torch-free: ONNX Runtime, NumPy and the tokenizer only.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from aiayn.core.folder import ModelFolder
from aiayn.engines import Engine
from aiayn.engines.load import load_engine, search_settings_for, translator_for
from aiayn.search.output import Output, mean_log_prob
from aiayn.serve.batching import SearchBatcher
from aiayn.serve.memory import return_freed_memory
from aiayn.text.clauses import Clause, ClauseSplitter
from aiayn.text.sentences import (
    MAX_FILE_CHARS,
    MAX_SENTENCE_TOKENS,
    InputTooLong,
    Layout,
    check_length,
    layout,
    reassemble,
    split_long,
)

MAX_BEAM = 8
# A translation with fewer tokens than this share of its source's probably left part of it out (on Multi30k val
# 5% of single captions fall under 0.7 in either direction); sources shorter than SHORT_MIN_SOURCE are not judged.
SHORT_RATIO, SHORT_MIN_SOURCE = 0.6, 12


@dataclass(frozen=True)
class Attention:
    """Cross-attention of the last decoder layer for one sentence and its translation."""

    source_tokens: list[str]
    output_tokens: list[str]
    weights: np.ndarray  # (heads, out_len, src_len)


@dataclass(frozen=True)
class Prepared:
    """A text cut into what the search gets: token ids of each sentence, or of each piece of a long one."""

    shape: Layout
    src_ids: list[list[int]]
    owner: list[int]  # piece → index of its sentence in ``shape.sentences``
    clauses: list[Clause]  # piece → the clause it searches (a whole sentence unless clauses.py split it)
    left_out: list[str]  # characters outside the vocabulary, removed from the sentences translated
    refused: dict[int, str]  # sentence index → why it cannot be translated (a single word over the token limit)

    def refusals(self) -> list[tuple[int, str]]:
        """(line index, reason) for each refused sentence, in the order of the text."""
        return [(i, self.refused[s]) for i, line in enumerate(self.shape.lines) for s in line if s in self.refused]


@dataclass(frozen=True)
class Result:
    """A translated text with what the page, the API and the CLI tell about it."""

    text: str
    provider: str
    latency_ms: float  # the search's, for every request searched together with this one
    sentences: int
    left_out: list[str]
    kept: int  # sentences without a single known word, passed through as they are
    short_lines: list[int]  # lines (from 0) with a sentence whose translation looks short for its source
    unsure_lines: list[int]  # lines (from 0) with a sentence the model translated with little confidence
    refused: list[tuple[int, str]]  # (line, why) of each sentence left out: a single word over the token limit


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
        self.search = search_settings_for(folder)
        self.clauses = ClauseSplitter.of(folder, split_clauses)
        self.min_mean_log_prob = folder.min_mean_log_prob()
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
        shape = layout(text, self.config.src_lang)
        unknown = self.tokenizer.unknown_characters(" ".join(shape.sentences))
        src_ids: list[list[int]] = []
        owner: list[int] = []
        clauses: list[Clause] = []
        left_out: set[str] = set()
        refused: dict[int, str] = {}
        for index, sentence in enumerate(shape.sentences):
            known = " ".join("".join(ch for ch in sentence if ch not in unknown).split())
            if not any(ch.isalnum() for ch in known):
                continue
            try:
                pieces = split_long(known, self.count_tokens, self.sentence_limit)
            except InputTooLong as err:
                refused[index] = str(err)
                continue
            left_out.update(ch for ch in sentence if ch in unknown)
            for piece in pieces:
                whole = self.translator.source_ids(piece)
                cut = self.clauses.split(piece, len(whole))
                src_ids += [whole] if len(cut) == 1 else [self.translator.source_ids(c.query()) for c in cut]
                owner += [index] * len(cut)
                clauses += cut
        return Prepared(shape, src_ids, owner, clauses, sorted(left_out), refused)

    def run(self, prepared: Prepared, beam_size: int, on_batch: Callable[[int], object] | None = None) -> Result:
        """Search all pieces as one batch; ``on_batch(k)`` after each batch of k pieces."""
        settings = replace(self.search, beam_size=beam_size)
        started = time.perf_counter()
        outputs = self.translator.outputs(prepared.src_ids, settings, on_batch)
        return self.assemble(prepared, outputs, milliseconds_since(started))

    def translate(self, text: str, beam_size: int) -> Result:
        """Translate ``text`` sentence by sentence, keeping its line breaks; searched together with the
        other requests of the moment (``batching.py``); refused whole if any sentence is."""
        prepared = self.prepare(text)
        refuse_any(prepared.refusals())
        settings = replace(self.search, beam_size=beam_size)
        started = time.perf_counter()
        outputs = self.batcher.outputs(prepared.src_ids, settings)
        return self.assemble(prepared, outputs, milliseconds_since(started))

    def submit(self, text: str, beam_size: int) -> tuple[Prepared, Future[list[Output]]]:
        """``text`` prepared and handed to the batcher, not waited for (``TranslationService.translate_many``)."""
        prepared = self.prepare(text)
        return prepared, self.batcher.submit(prepared.src_ids, replace(self.search, beam_size=beam_size))

    def assemble(self, prepared: Prepared, outputs: list[Output], latency_ms: float) -> Result:
        """The pieces' outputs back into sentences and lines."""
        out_ids = [output.tokens for output in outputs]
        per_sentence = list(prepared.shape.sentences)
        for index in {*prepared.owner, *prepared.refused}:
            per_sentence[index] = ""
        for index, clause, ids in zip(prepared.owner, prepared.clauses, out_ids, strict=True):
            piece = self.clauses.render(clause, self.tokenizer.decode(ids))
            per_sentence[index] = f"{per_sentence[index]} {piece}".strip()
        return Result(
            reassemble(prepared.shape, per_sentence) if per_sentence else "",
            self.provider,
            latency_ms,
            len(per_sentence),
            prepared.left_out,
            len(per_sentence) - len(set(prepared.owner)) - len(prepared.refused),
            short_lines(prepared, out_ids),
            unsure_lines(prepared, outputs, self.min_mean_log_prob),
            prepared.refusals(),
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


def short_lines(prepared: Prepared, out_ids: list[list[int]]) -> list[int]:
    """Lines with a sentence whose output has under ``SHORT_RATIO`` of its source's tokens (pieces summed)."""
    source: Counter[int] = Counter()
    output: Counter[int] = Counter()
    for sentence, src, out in zip(prepared.owner, prepared.src_ids, out_ids, strict=True):
        source[sentence] += len(src) - 1  # without </s>
        output[sentence] += len(out)
    short = {i for i, n in source.items() if n >= SHORT_MIN_SOURCE and output[i] < SHORT_RATIO * n}
    return [number for number, line in enumerate(prepared.shape.lines) if short.intersection(line)]


def unsure_lines(prepared: Prepared, outputs: list[Output], min_mean_log_prob: float | None) -> list[int]:
    """Lines with a sentence whose translation (pieces together) has a mean log-probability per token under the
    folder's threshold (``confidence`` in config.json): the model itself doubts it, as it does on text unlike its
    training data; none for a folder without a threshold."""
    if min_mean_log_prob is None:
        return []
    pieces: dict[int, list[Output]] = {}
    for sentence, output in zip(prepared.owner, outputs, strict=True):
        pieces.setdefault(sentence, []).append(output)
    unsure = {i for i, own in pieces.items() if mean_log_prob(own) < min_mean_log_prob}
    return [number for number, line in enumerate(prepared.shape.lines) if unsure.intersection(line)]


class TranslationService:
    """Loads models by name on first use and serves them to many threads (``split_clauses``: as ``LoadedModel``)."""

    def __init__(
        self,
        engine: str = "onnx",
        device: str = "auto",
        cores: int | None = None,
        split_clauses: bool = True,
        variant: str = "fp32",
    ) -> None:
        self.engine, self.device, self.cores, self.split_clauses = engine, device, cores, split_clauses
        self.variant = variant  # the weights every model runs (``aiayn.engines.VARIANTS``)
        self.models: dict[str, LoadedModel] = {}
        self.lock = threading.Lock()

    def model(self, name: str) -> LoadedModel:
        with self.lock:
            if name not in self.models:
                folder = ModelFolder.open(name)
                engine = load_engine(folder, self.engine, self.device, self.variant, cores=self.cores)
                self.models[name] = LoadedModel(folder, engine, self.split_clauses)
                return_freed_memory()  # what building the engine's graphs took
            return self.models[name]

    def translate_many(self, requests: Sequence[tuple[str, str, int]]) -> list[Result]:
        """Requests of the page or the API, each (text, model, beam size), at most ``MAX_CHARS`` characters each:
        all handed to their model's batcher before any is waited for, so they are searched together. A sentence
        that cannot be translated (a single word over the token limit) is left out and named in ``refused``.
        The latency covers the search."""
        for text, _, beam_size in requests:
            check_beam(beam_size)
            check_length(text)
        started = time.perf_counter()
        pending = [(self.model(model), text, beam_size) for text, model, beam_size in requests]
        submitted = [(loaded, *loaded.submit(text, beam_size)) for loaded, text, beam_size in pending]
        searched = [(loaded, prepared, outputs.result()) for loaded, prepared, outputs in submitted]
        latency_ms = milliseconds_since(started)
        return [loaded.assemble(prepared, outputs, latency_ms) for loaded, prepared, outputs in searched]

    def translate(self, text: str, model: str, beam_size: int = 4) -> Result:
        """One request, refused whole if any of its sentences cannot be translated."""
        result = self.translate_many([(text, model, beam_size)])[0]
        refuse_any(result.refused)
        return result

    def attention(self, text: str, model: str, beam_size: int) -> Attention | None:
        """The heatmap's data, asked for by the page only: the first piece of ``text`` searched again (to the
        output it had, since a search does not depend on its batch), then a forced pass of the decoder over it."""
        check_beam(beam_size)
        check_length(text)
        loaded = self.model(model)
        prepared = loaded.prepare(text)
        if not prepared.src_ids:
            return None
        first = prepared.src_ids[0]
        out_ids = loaded.batcher.outputs([first], replace(loaded.search, beam_size=beam_size))[0].tokens
        return loaded.attention(first, out_ids)

    def translate_file(self, text: str, model: str, beam_size: int = 4) -> str:
        """An uploaded file's text, at most ``MAX_FILE_CHARS`` characters, translated line by line."""
        check_beam(beam_size)
        check_length(text, MAX_FILE_CHARS, "the file")
        return self.model(model).translate(text, beam_size).text


def check_beam(beam_size: int) -> None:
    if not 1 <= beam_size <= MAX_BEAM:
        raise ValueError(f"beam size must be between 1 and {MAX_BEAM}, got {beam_size}")
