"""`aiayn eval`: translate a Multi30k split and score it with sacreBLEU and chrF. Torch-free itself:
the engine (PyTorch or ONNX Runtime) is passed in."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from aiayn.core.folder import SEARCH_SECTION, ModelFolder
from aiayn.data.multi30k import ParallelCorpus, load_parallel
from aiayn.evaluation.metrics import Scores, score
from aiayn.search.translator import SearchSettings, Translator


@dataclass(frozen=True)
class Evaluation:
    split: str
    sentences: int
    settings: SearchSettings
    scores: Scores
    seconds: float
    translations: list[str]


def load_split_for(folder: ModelFolder, split: str, data_dir: str | Path | None = None) -> ParallelCorpus:
    """The split in the folder's language pair, as recorded in its config.json."""
    return load_parallel(split, folder.config.src_lang, folder.config.tgt_lang, data_dir)


def evaluate(
    translator: Translator, corpus: ParallelCorpus, settings: SearchSettings, progress: bool = True
) -> Evaluation:
    bar = tqdm(total=len(corpus), unit="sent", disable=not progress, desc=f"{corpus.split} beam {settings.beam_size}")
    started = time.perf_counter()
    translations = translator.translate(corpus.src, settings, on_batch=bar.update)
    seconds = time.perf_counter() - started
    bar.close()
    return Evaluation(corpus.split, len(corpus), settings, score(translations, corpus.tgt), seconds, translations)


def tune_length_penalty(
    folder: ModelFolder, translator: Translator, corpus: ParallelCorpus, beam_size: int, candidates: list[float]
) -> dict[float, float]:
    """§6.1's α, chosen on the validation split: BLEU for each candidate; the best is written into the
    folder's config.json (``search``), where every later translation of the folder takes it from."""
    if corpus.split != "val":
        raise ValueError(f"tune the length penalty on val only, not {corpus.split}: test sets are for reporting")
    bleu = {}
    for alpha in candidates:
        bleu[alpha] = evaluate(translator, corpus, SearchSettings(beam_size, alpha), progress=False).scores.bleu
    best = max(candidates, key=lambda alpha: bleu[alpha])  # the first listed wins a tie
    folder.write_section(
        SEARCH_SECTION,
        {
            "length_penalty": best,
            "tuned_on": {
                "split": corpus.split,
                "beam_size": beam_size,
                "bleu": {str(a): round(b, 2) for a, b in bleu.items()},
            },
        },
    )
    return bleu
