"""`aiayn eval`: translate a test set (the user's files, the folder's validation sample, or a Multi30k split)
and score it with sacreBLEU and chrF. Torch-free itself: the engine (PyTorch or ONNX Runtime) is passed in."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from aiayn.core.folder import NORMALIZATION_BEFORE, SEARCH_SECTION, ModelFolder
from aiayn.data.multi30k import TEST_SPLIT, VALIDATION_SPLIT, ParallelCorpus, is_multi30k_pair, load_parallel
from aiayn.data.sources import PairSource, TextFiles, TsvFile, languages_of_files, languages_of_tsv
from aiayn.evaluation.metrics import Scores, score
from aiayn.search.beam import PORTABLE_BLEU_MARGIN
from aiayn.search.translator import SearchSettings, Translator


@dataclass(frozen=True)
class Evaluation:
    split: str
    sentences: int
    settings: SearchSettings
    scores: Scores
    seconds: float
    translations: list[str]


TEST_FLAGS = "--test-files SRC REF or --test-tsv FILE"


def load_split_for(folder: ModelFolder, split: str, data_dir: str | Path | None = None) -> ParallelCorpus:
    """The split in the folder's language pair, as recorded in its config.json."""
    return load_parallel(split, folder.config.src_lang, folder.config.tgt_lang, data_dir)


def validation_sample(folder: ModelFolder) -> ParallelCorpus | None:
    """The validation pairs training kept in the folder (a user's own corpus), or None."""
    pairs = folder.validation_sample()
    if not pairs:
        return None
    src, tgt = (list(side) for side in zip(*pairs, strict=True))
    config = folder.config
    return ParallelCorpus(src, tgt, config.src_lang, config.tgt_lang, VALIDATION_SPLIT, (str(folder.validation_file),))


def corpus_of(source: PairSource, split: str, folder: ModelFolder) -> ParallelCorpus:
    """A user's test pairs, read whole, refused when their languages are not the folder's pair."""
    model_pair = (folder.config.src_lang, folder.config.tgt_lang)
    if (source.src_lang, source.tgt_lang) != model_pair:
        raise ValueError(
            f"the test set is {source.src_lang}→{source.tgt_lang} but {folder.name} translates "
            f"{model_pair[0]}→{model_pair[1]}; give that pair's files"
        )
    files = tuple(str(f["path"]) for f in source.describe().get("files", []))  # describe() refuses bad files first
    pairs = list(source.pairs())
    if not pairs:
        raise ValueError(f"the test set {', '.join(files)} holds no pairs")
    src, tgt = (list(side) for side in zip(*pairs, strict=True))
    return ParallelCorpus(src, tgt, source.src_lang, source.tgt_lang, split, files)


def evaluation_set(
    folder: ModelFolder,
    split: str | None = None,
    files: tuple[str, str] | None = None,
    tsv: str | None = None,
    data_dir: str | Path | None = None,
) -> ParallelCorpus:
    """What `aiayn eval` scores: the user's files (named as the folder's pair unless their names say otherwise),
    else ``split`` — of Multi30k when the folder's pair is there, else ``val``: the folder's validation sample."""
    src_lang, tgt_lang = folder.config.src_lang, folder.config.tgt_lang
    if files is not None or tsv is not None:
        if split is not None:
            raise ValueError(f"give --split or {TEST_FLAGS}, not both")
        # Languages in the file names (test.en, test.es; test.en-es.tsv) must be the folder's; else they are taken
        # to be.
        source: PairSource
        if files is not None:
            paths = Path(files[0]), Path(files[1])
            source = TextFiles(*paths, *(languages_of_files(*paths) or (src_lang, tgt_lang)))
        else:
            path = Path(str(tsv))
            source = TsvFile(path, *(languages_of_tsv(path) or (src_lang, tgt_lang)))
        return corpus_of(source, Path(files[0] if files else str(tsv)).name, folder)
    if is_multi30k_pair(src_lang, tgt_lang):
        return load_split_for(folder, split or TEST_SPLIT, data_dir)
    if split == VALIDATION_SPLIT:
        sample = validation_sample(folder)
        if sample is not None:
            return sample
        raise ValueError(f"{folder.name} keeps no validation sample (it was not trained here); give {TEST_FLAGS}")
    raise ValueError(
        f"{src_lang}→{tgt_lang} is not a Multi30k pair: give {TEST_FLAGS} (or --split val for the validation "
        "sample training kept in the folder)"
    )


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
    folder: ModelFolder,
    translator: Translator,
    corpus: ParallelCorpus,
    beam_size: int,
    candidates: list[float],
    normalizations: Sequence[str] = (),
) -> dict[str, dict[float, float]]:
    """§6.1's α, chosen on the validation split: BLEU for each normalisation (by default the folder's own) and
    candidate α; the best is written into the folder's config.json (``search``), where every later translation of
    the folder takes it from. Of several normalisations, ``power`` wins where its best BLEU is within
    ``PORTABLE_BLEU_MARGIN`` of the best one's (else the best; the first listed wins a tie, of α too)."""
    if corpus.split != "val":
        raise ValueError(f"tune the length penalty on val only, not {corpus.split}: test sets are for reporting")
    base = SearchSettings(**folder.search_defaults())
    bleu: dict[str, dict[float, float]] = {}
    for normalization in normalizations or [base.length_normalization]:
        bleu[normalization] = {}
        for alpha in candidates:
            settings = replace(base, beam_size=beam_size, length_penalty=alpha, length_normalization=normalization)
            bleu[normalization][alpha] = evaluate(translator, corpus, settings, progress=False).scores.bleu
    best = {normalization: max(candidates, key=scores.__getitem__) for normalization, scores in bleu.items()}
    top = kept_normalization({normalization: bleu[normalization][alpha] for normalization, alpha in best.items()})
    folder.write_section(
        SEARCH_SECTION,
        {
            **folder.section(SEARCH_SECTION),  # an imported checkpoint's beam stays
            "length_penalty": best[top],
            "length_normalization": top,
            "tuned_on": {
                "split": corpus.split,
                "beam_size": beam_size,
                # What a continued run goes back to (train/start.py's continued_search): none, or a checkpoint's own.
                NORMALIZATION_BEFORE: folder.section(SEARCH_SECTION).get("length_normalization"),
                "bleu": {n: {str(a): round(b, 2) for a, b in scores.items()} for n, scores in bleu.items()},
            },
        },
    )
    return bleu


def kept_normalization(best_bleu: dict[str, float]) -> str:
    """Of the normalisations tuned, by each one's best val BLEU: ``power`` where it is within
    ``PORTABLE_BLEU_MARGIN`` of the best, else the best (the first listed of equal ones)."""
    top = max(best_bleu, key=best_bleu.__getitem__)
    if "power" in best_bleu and best_bleu["power"] >= best_bleu[top] - PORTABLE_BLEU_MARGIN:
        return "power"
    return top
