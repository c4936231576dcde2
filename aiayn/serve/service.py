"""Translation as the CLI, the page and the API see it: text in, text out, with provider and latency.

Torch-free: ONNX Runtime, NumPy and the tokenizer only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.model.config import load_config
from aiayn.model.folder import TOKENIZER_FILE, resolve_model
from aiayn.model.tokenizer import SubwordTokenizer
from aiayn.search.translator import SearchSettings, Translator
from aiayn.serve.text import check_length, layout, reassemble, split_long

MAX_BEAM = 8


@dataclass(frozen=True)
class Result:
    text: str
    provider: str
    latency_ms: float
    sentences: int


@dataclass(frozen=True)
class Attention:
    source_tokens: list[str]
    output_tokens: list[str]
    weights: np.ndarray  # (heads, out_len, src_len), last decoder layer


class LoadedModel:
    """One model folder ready to translate: engine, tokenizer and the translator over them."""

    def __init__(self, folder: Path, engine: Any) -> None:
        self.folder = folder
        self.config = load_config(folder)
        self.tokenizer = SubwordTokenizer.load(folder / TOKENIZER_FILE)
        self.engine = engine
        self.translator = Translator(engine, self.tokenizer, self.config.max_len)

    @property
    def provider(self) -> str:
        return getattr(self.engine, "provider", "PyTorch (CPU)")

    def count_tokens(self, sentence: str) -> int:
        return len(self.tokenizer.encode(sentence)) + 1

    def translate(self, text: str, beam_size: int, on_batch: Callable[[int], None] | None = None) -> tuple[str, int]:
        """Translate ``text`` keeping its lines; returns the translation and the number of sentences."""
        shape = layout(text)
        pieces: list[str] = []
        owner: list[int] = []  # piece → sentence index
        for index, sentence in enumerate(shape.sentences):
            for piece in split_long(sentence, self.count_tokens):
                pieces.append(piece)
                owner.append(index)
        translated = self.translator.translate(pieces, SearchSettings(beam_size=beam_size), on_batch)
        per_sentence = [""] * len(shape.sentences)
        for index, piece in zip(owner, translated, strict=True):
            per_sentence[index] = f"{per_sentence[index]} {piece}".strip()
        return reassemble(shape, per_sentence), len(shape.sentences)

    def attention(self, sentence: str, beam_size: int) -> Attention:
        """Cross-attention of the last decoder layer for one sentence and its translation."""
        src_ids = self.translator.source_ids(sentence)
        out_ids = self.translator.translate_ids([src_ids], SearchSettings(beam_size=beam_size))[0]
        decoder_in = [self.engine.bos_id, *out_ids]  # each row: the step that produced out_ids[i] (or </s>)
        weights = self.engine.cross_attention(np.array([src_ids]), np.array([decoder_in]))[0]
        tokens = self.tokenizer.tokens
        return Attention(tokens(src_ids[:-1]) + ["</s>"], tokens(out_ids) + ["</s>"], weights)


def load_engine(folder: Path, engine: str, device: str) -> Any:
    """The step engine of a model folder: ONNX Runtime (default) or PyTorch (imported only here)."""
    if engine == "torch":
        from aiayn.model.engine import TorchEngine
        from aiayn.model.weights import load_model

        return TorchEngine(load_model(folder))
    from aiayn.serve.engine import OnnxEngine

    return OnnxEngine.load(folder, device=device)


class TranslationService:
    """Loads models by name on first use and serves them to many threads."""

    def __init__(self, engine: str = "onnx", device: str = "auto") -> None:
        self.engine, self.device = engine, device
        self.models: dict[str, LoadedModel] = {}
        self.lock = threading.Lock()

    def model(self, name: str) -> LoadedModel:
        with self.lock:
            if name not in self.models:
                folder = resolve_model(name)
                self.models[name] = LoadedModel(folder, load_engine(folder, self.engine, self.device))
            return self.models[name]

    def translate(self, text: str, model: str, beam_size: int = 4) -> Result:
        if not 1 <= beam_size <= MAX_BEAM:
            raise ValueError(f"beam size must be between 1 and {MAX_BEAM}, got {beam_size}")
        check_length(text)
        loaded = self.model(model)
        started = time.perf_counter()
        translation, sentences = loaded.translate(text, beam_size)
        return Result(translation, loaded.provider, (time.perf_counter() - started) * 1000, sentences)
