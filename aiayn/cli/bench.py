"""`aiayn bench`: the speed table and its ratios, printed (and written as JSON with --json)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aiayn.cli.args import add_data_flag, add_model_flag


def cmd_bench(args: argparse.Namespace) -> None:
    from aiayn.bench.run import report, run_bench
    from aiayn.core.folder import ModelFolder
    from aiayn.evaluation.evaluate import load_split_for

    folder = ModelFolder.open(args.model)
    corpus = load_split_for(folder, "test_2016_flickr", args.data)
    rows = run_bench(folder, corpus.src, corpus.tgt, args.quick)
    print(report(rows, Path(args.json) if args.json else None))


def add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="decoding speed against CTranslate2 and the tutorials' decoding")
    add_model_flag(p)
    p.add_argument("--quick", action="store_true", help="fewer sentences, one repetition (under a minute on 2 cores)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    add_data_flag(p)
    p.set_defaults(func=cmd_bench)
