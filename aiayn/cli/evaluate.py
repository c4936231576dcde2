"""`aiayn eval`: flags → ``aiayn.evaluation``, and the scores printed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.cli.args import (
    add_beam_flag,
    add_data_flag,
    add_engine_flags,
    add_model_flag,
    engine_options,
    float_list,
    positive_int,
)
from aiayn.data.multi30k import SPLITS, TEST_SPLIT, VALIDATION_SPLIT
from aiayn.engines import ONNX
from aiayn.engines.load import installed_engine, load_engine, translator_for
from aiayn.search.beam import LENGTH_NORMALIZATIONS, PORTABLE_BLEU_MARGIN
from aiayn.search.translator import SearchSettings

if TYPE_CHECKING:
    from aiayn.core.folder import ModelFolder
    from aiayn.data.multi30k import ParallelCorpus
    from aiayn.search.translator import Translator


def cmd_eval(args: argparse.Namespace) -> None:
    from aiayn.core.folder import ModelFolder
    from aiayn.evaluation.evaluate import evaluate, evaluation_set, tune_length_penalty

    normalizations = args.length_normalization or []
    if len(normalizations) > 1 and not args.tune_length_penalty:
        raise ValueError("--length-normalization takes one name, unless with --tune-length-penalty")
    folder = ModelFolder.open(args.model)
    corpus = evaluation_set(folder, args.split, args.test_files, args.test_tsv, args.data)
    if args.limit:
        corpus = corpus.head(args.limit)
    default_engine = installed_engine() if args.variant == "fp32" else ONNX  # torch runs fp32 only
    engine = load_engine(folder, engine_options(args, default_engine))
    engine_name = engine.name
    print(f"engine {engine_name} ({args.variant}), execution provider: {engine.provider}", file=sys.stderr)
    translator = translator_for(folder, engine)
    if args.beam is None:  # the folder's own: an imported checkpoint's num_beams, else 4
        args.beam = SearchSettings.of(folder).beam_size
    if args.calibrate_confidence:
        calibrate(folder, translator, corpus, args.beam)
        return
    if args.tune_length_penalty:
        bleu = tune_length_penalty(folder, translator, corpus, args.beam, args.tune_length_penalty, normalizations)
        for normalization, scores in bleu.items():
            for alpha, value in scores.items():
                where = f"({corpus.split}, beam {args.beam})"
                print(f"{normalization} length penalty {alpha:4.2f}: BLEU {value:6.2f} {where}")
        kept = SearchSettings.of(ModelFolder.open(folder.path))
        print(
            f"kept {kept.length_normalization} {kept.length_penalty} in {folder.config_file} "
            "(search.length_normalization, search.length_penalty)"
        )
        return
    settings = SearchSettings.of(
        folder,
        beam_size=args.beam,
        length_penalty=args.length_penalty,
        length_normalization=normalizations[0] if normalizations else None,
    )
    result = evaluate(translator, corpus, settings)
    summary = {
        "model": str(folder.path),
        "split": result.split,
        "sentences": result.sentences,
        "engine": engine_name,
        "variant": args.variant,
        "beam": args.beam,
        "length_penalty": settings.length_penalty,
        "length_normalization": settings.length_normalization,
        "seconds": round(result.seconds, 2),
        **result.scores.to_dict(),
    }
    if args.output:
        Path(args.output).write_text("\n".join(result.translations) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    s = result.scores
    penalty = f"length penalty {settings.length_penalty} ({settings.length_normalization})"
    search = "greedy" if args.beam == 1 else f"beam {args.beam}, {penalty}"
    print(f"{folder.name} {result.split} ({result.sentences} sentences, {engine_name}, {search})")
    print(f"BLEU            {s.bleu:6.2f}  {s.bleu_signature}")
    print(f"BLEU lowercased {s.bleu_lowercase:6.2f}")
    print(f"chrF            {s.chrf:6.2f}  {s.chrf_signature}")


def calibrate(folder: ModelFolder, translator: Translator, corpus: ParallelCorpus, beam: int) -> None:
    """--calibrate-confidence: the unsure-translation threshold set on val and kept in config.json."""
    from tqdm import tqdm

    from aiayn.evaluation.confidence import calibrate_confidence

    if corpus.split != "val":
        raise ValueError(f"calibrate on val only, not {corpus.split}: test sets are for reporting")
    sources = [translator.source_ids(text) for text in corpus.src]
    with tqdm(total=len(sources), unit="sent", desc="val", file=sys.stderr) as bar:
        section = calibrate_confidence(
            folder, translator, sources, SearchSettings.of(folder, beam_size=beam), corpus.split, bar.update
        )
    flagged = round(section["flagged_share_on_val"] * section["sentences"])
    print(
        f"unsure below a mean log-probability of {section['min_mean_log_prob']} per token: {flagged} of "
        f"{section['sentences']} {corpus.split} sentences (beam {beam}); kept in {folder.config_file} (confidence)"
    )


def normalization_list(text: str) -> list[str]:
    """``gnmt,power``: length normalisations separated by commas."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in LENGTH_NORMALIZATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected {' or '.join(LENGTH_NORMALIZATIONS)}, or both separated by a comma; got {text}"
        )
    return names


def add_eval(sub: Any) -> None:
    p = sub.add_parser("eval", help="translate a test set and print BLEU and chrF")
    add_model_flag(p)
    p.add_argument(
        "--split",
        default=None,
        choices=SPLITS,
        help=f"a Multi30k split (default: {TEST_SPLIT}) where the model's pair is in Multi30k; for other pairs "
        f"{VALIDATION_SPLIT} is the validation sample training kept in the folder",
    )
    p.add_argument(
        "--test-files",
        nargs=2,
        metavar=("SRC", "REF"),
        default=None,
        help="score your own test set: source and reference files, aligned line by line (plain or .gz)",
    )
    p.add_argument("--test-tsv", metavar="FILE", default=None, help="or one file of SOURCE<TAB>REFERENCE lines")
    add_beam_flag(p)
    p.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="α of §6.1 (default: the folder's tuned value in config.json, else 0.6)",
    )
    p.add_argument(
        "--tune-length-penalty",
        type=float_list,
        default=None,
        metavar="A,B,...",
        help="with --split val: score each α and keep the best in the folder's config.json",
    )
    p.add_argument(
        "--length-normalization",
        type=normalization_list,
        default=None,
        metavar="NAME[,NAME]",
        help="lp(Y) of the length penalty: gnmt, ((5 + |Y|) / 6)^α; power, |Y|^α, as transformers' generate and "
        "CTranslate2 (default: the folder's). With --tune-length-penalty, gnmt,power tunes α under both and keeps "
        f"power where its best val BLEU is within {PORTABLE_BLEU_MARGIN} of gnmt's",
    )
    p.add_argument(
        "--calibrate-confidence",
        action="store_true",
        help="with --split val: set the mean log-probability under which a translation is called unsure "
        "and keep it in the folder's config.json",
    )
    add_engine_flags(p, None, "default: torch where PyTorch is installed, else onnx")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N sentences")
    p.add_argument("--output", default=None, help="also write the translations to this file")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_data_flag(p)
    p.set_defaults(func=cmd_eval)
