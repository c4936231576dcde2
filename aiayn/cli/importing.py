"""`aiayn import`: flags → ``aiayn.convert.marian.import_marian``, and its report printed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aiayn.cli.args import add_overwrite_flag


def cmd_import(args: argparse.Namespace) -> None:
    from aiayn.convert.marian import import_marian

    _, report = import_marian(args.source, Path(args.out), args.src, args.tgt, args.revision, args.overwrite)
    for line in report:
        print(line)


def add_import(sub: Any) -> None:
    p = sub.add_parser(
        "import",
        help="a pretrained Marian / OPUS-MT checkpoint (Hub id or folder), or a folder that `aiayn export --to "
        "transformers` wrote, as a model folder",
        description="Write a model folder from a transformers Marian checkpoint: a Hugging Face Hub id such as "
        "Helsinki-NLP/opus-mt-en-de (downloaded once into the Hub's cache) or a local folder with config.json, "
        "model.safetensors or pytorch_model.bin, source.spm, target.spm and vocab.json.",
    )
    p.add_argument("source", help="Hub id (Helsinki-NLP/opus-mt-en-de) or checkpoint folder")
    p.add_argument(
        "--revision",
        default=None,
        metavar="REV",
        help="of a Hub id: the branch, tag or commit to read (default: its main branch); the folder records the "
        "commit read (config.json's imported.revision)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="the model folder to write: new, empty or an earlier import's (replaced whole once the new one is done)",
    )
    add_overwrite_flag(p)
    p.add_argument("--src", default=None, help="source language code, where the checkpoint does not say it")
    p.add_argument(
        "--tgt",
        default=None,
        help="target language code, where the checkpoint does not say it; for a multi-target checkpoint (its "
        "vocabulary has >>por<< tokens) the target to import, as its token spells it (por), once per folder",
    )
    p.set_defaults(func=cmd_import)
