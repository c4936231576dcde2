"""`aiayn eval`: translate a Multi30k split and score it with sacreBLEU and chrF. Torch-free itself:
the engine (PyTorch or ONNX Runtime) is passed in."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from aiayn.model.config import load_config
from aiayn.model.data import ParallelCorpus, load_parallel
from aiayn.model.metrics import Scores, score
from aiayn.search.translator import SearchSettings, Translator


@dataclass(frozen=True)
class Evaluation:
    split: str
    sentences: int
    settings: SearchSettings
    scores: Scores
    seconds: float
    translations: list[str]


def load_split_for(folder: Path, split: str, data_dir: str | Path | None = None) -> ParallelCorpus:
    """The split in the folder's language pair, as recorded in its config.json."""
    config = load_config(folder)
    return load_parallel(split, config.src_lang, config.tgt_lang, data_dir)


def evaluate(
    translator: Translator, corpus: ParallelCorpus, settings: SearchSettings, progress: bool = True
) -> Evaluation:
    bar = tqdm(total=len(corpus), unit="sent", disable=not progress, desc=f"{corpus.split} beam {settings.beam_size}")
    started = time.perf_counter()
    translations = translator.translate(corpus.src, settings, on_batch=bar.update)
    seconds = time.perf_counter() - started
    bar.close()
    return Evaluation(corpus.split, len(corpus), settings, score(translations, corpus.tgt), seconds, translations)
