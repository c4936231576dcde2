"""The corpus flags that `aiayn train` and `aiayn prepare` share: Multi30k by pair, text files, TSV, HF datasets."""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.cli.args import UserError, add_data_flag, positive_int
from aiayn.core.config import ModelConfig


def add_corpus_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", default=None, help="source language (Multi30k: de, en, fr, cs; files: taken from names)")
    p.add_argument("--tgt", default=None, help="target language (likewise)")
    files = p.add_argument_group("a corpus of your own (else Multi30k by --src/--tgt)")
    files.add_argument(
        "--train-files", nargs=2, metavar=("SRC_FILE", "TGT_FILE"), help="aligned text files, plain or .gz"
    )
    files.add_argument("--valid-files", nargs=2, metavar=("SRC_FILE", "TGT_FILE"), help="their validation pair")
    files.add_argument("--train-tsv", metavar="FILE", help="SOURCE<TAB>TARGET lines, plain or .gz")
    files.add_argument("--valid-tsv", metavar="FILE", help="its validation file")
    files.add_argument("--hf", metavar="NAME", help="Hugging Face dataset: a save_to_disk folder or a hub name")
    files.add_argument("--hf-config", default=None, help="the hub dataset's subset, e.g. de-en")
    files.add_argument("--hf-train-split", default="train", help="the dataset split to train on")
    files.add_argument("--hf-valid-split", default="validation", help="the dataset split to validate on")
    files.add_argument("--hf-column", default="translation", help="the column of {language: text} rows")
    p.add_argument(
        "--max-length",
        type=positive_int,
        default=ModelConfig.max_len,
        help="skip (and count) pairs with a side over N subword tokens",
    )
    p.add_argument(
        "--tokenizer-sample",
        type=positive_int,
        default=1_000_000,
        metavar="PAIRS",
        help="train the tokenizer on at most this many pairs, evenly spread",
    )
    p.add_argument("--limit", type=positive_int, default=None, help="Multi30k: use only the first N training pairs")
    add_data_flag(p)


def corpus_sources(args: argparse.Namespace) -> tuple[Any, Any]:
    """The training and validation ``PairSource`` the flags name."""
    from aiayn.data.sources import TextFiles, TsvFile

    given = [
        flag
        for flag, value in (("--train-files", args.train_files), ("--train-tsv", args.train_tsv), ("--hf", args.hf))
        if value
    ]
    if len(given) > 1:
        raise UserError(f"give one corpus, not {' and '.join(given)}")
    if given and args.limit:
        raise UserError("--limit applies to Multi30k only")
    if args.train_files:
        if not args.valid_files:
            raise UserError("--train-files needs --valid-files SRC_FILE TGT_FILE")
        return (
            TextFiles.named(*args.train_files, args.src, args.tgt),
            TextFiles.named(*args.valid_files, args.src, args.tgt),
        )
    if args.train_tsv:
        if not args.valid_tsv:
            raise UserError("--train-tsv needs --valid-tsv FILE")
        return TsvFile.named(args.train_tsv, args.src, args.tgt), TsvFile.named(args.valid_tsv, args.src, args.tgt)
    if args.hf:
        return hf_sources(args)
    return multi30k_sources(args)


def hf_sources(args: argparse.Namespace) -> tuple[Any, Any]:
    from aiayn.data.hf_datasets import HFDataset

    if not (args.src and args.tgt):
        raise UserError("--hf needs --src and --tgt: the keys of the translation column")
    return tuple(
        HFDataset(args.hf, split, args.src, args.tgt, args.hf_column, args.hf_config)
        for split in (args.hf_train_split, args.hf_valid_split)
    )


def multi30k_sources(args: argparse.Namespace) -> tuple[Any, Any]:
    from aiayn.data.multi30k import load_parallel

    if not (args.src and args.tgt):
        raise UserError("give --src and --tgt for Multi30k, or a corpus: --train-files, --train-tsv or --hf")
    if args.src == args.tgt:
        raise UserError("--src and --tgt must differ")
    train, valid = (load_parallel(split, args.src, args.tgt, args.data) for split in ("train", "val"))
    if args.limit:
        train, valid = train.head(args.limit), valid.head(max(args.limit // 10, 1))
    return train, valid
