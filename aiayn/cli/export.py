"""`aiayn export`: flags → ``aiayn.export.checks.export_folder``, and its report printed."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aiayn.cli.args import add_data_flag
from aiayn.core.folder import ModelFolder
from aiayn.data.multi30k import ParallelCorpus

SPLIT = "test_2016_flickr"


def load_test_split(folder: ModelFolder, data: str | None) -> ParallelCorpus | None:
    """The folder's language pair of test_2016_flickr, or None (with a note) when no corpus is at hand.

    A folder named with --data must hold it; only the automatic search may come up empty.
    """
    from aiayn.evaluation.evaluate import load_split_for

    try:
        return load_split_for(folder, SPLIT, data)
    except FileNotFoundError:
        if data is not None:
            raise
        from aiayn.export.checks import FALLBACK_SENTENCES

        print(f"Multi30k not found: checking on {len(FALLBACK_SENTENCES)} built-in sentences", file=sys.stderr)
        return None


def cmd_export(args: argparse.Namespace) -> None:
    from aiayn.export.checks import export_folder
    from aiayn.model.weights import load_model

    folder = ModelFolder.open(args.model)
    variants = [*(["int8"] if args.quantize == "int8" else []), *(["fp16"] if args.fp16 else [])]
    if args.check_sentences < 0:  # before the slow part
        raise ValueError(f"--check-sentences must be 0 or more, got {args.check_sentences}")
    model = load_model(folder)
    corpus = load_test_split(folder, args.data)
    for line in export_folder(model, folder, corpus, args.to, variants, args.check_sentences):
        print(line)


def add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write encoder/decoder ONNX graphs into a model folder and check them")
    p.add_argument("model", help="bundled model name (en-de, de-en) or model folder")
    p.add_argument("--quantize", choices=("int8",), default=None, help="also write int8 graphs (dynamic quantization)")
    p.add_argument("--fp16", action="store_true", help="also write fp16 graphs (for CUDA)")
    p.add_argument("--to", choices=("onnx", "ctranslate2"), default="onnx", help="ONNX graphs or a CTranslate2 model")
    p.add_argument(
        "--check-sentences",
        type=int,
        default=1000,
        help=f"{SPLIT} sentences whose greedy and beam-4 translations must be identical (0: skip; default 1000)",
    )
    add_data_flag(p)
    p.set_defaults(func=cmd_export)
