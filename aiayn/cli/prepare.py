"""`aiayn prepare`: flags → ``aiayn.data.prepare.prepare`` (torch-free); `aiayn train --prepared DIR` reads it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from aiayn.cli.args import add_overwrite_flag, positive_int
from aiayn.cli.corpus import add_corpus_flags, corpus_sources
from aiayn.core.config import PRESETS


def cmd_prepare(args: argparse.Namespace) -> None:
    from aiayn.data.prepare import PrepareSettings, prepare

    settings = PrepareSettings(
        vocab_size=args.vocab_size, max_length=args.max_length, tokenizer_sample=args.tokenizer_sample
    )
    started = time.perf_counter()
    data = prepare(args.out, *corpus_sources(args), settings, overwrite=args.overwrite)
    seconds = time.perf_counter() - started
    counts = data.record["counts"]
    print(json.dumps(counts, indent=2))
    read = counts["train"]["read"] + counts["valid"]["read"]
    print(f"prepared {data.path} in {seconds:.1f} s ({read / seconds:.0f} pairs/s)", file=sys.stderr)


def add_prepare(sub: Any) -> None:
    p = sub.add_parser("prepare", help="train the tokenizer and write a corpus as memory-mapped token ids")
    add_corpus_flags(p)
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        help="folder to write: new, empty or an earlier `aiayn prepare`'s (replaced whole once the new one is done)",
    )
    add_overwrite_flag(p)
    p.add_argument(
        "--vocab-size",
        type=positive_int,
        default=PRESETS["tiny"].vocab_size,
        help="BPE vocabulary shared by both languages (the paper: 37000)",
    )
    p.set_defaults(func=cmd_prepare)
