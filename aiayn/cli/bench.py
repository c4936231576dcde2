"""`aiayn bench`: the speed table and its ratios, printed (and written as JSON with --json)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aiayn.cli.args import add_data_flag, add_model_flag


def cmd_bench(args: argparse.Namespace) -> None:
    from aiayn.core.folder import ModelFolder
    from aiayn.evaluation.evaluate import load_split_for

    folder = ModelFolder.open(args.model)
    json_path = Path(args.json) if args.json else None
    if args.train:
        from aiayn.bench.training import FULL, QUICK, run_train_bench, train_report

        corpus = load_split_for(folder, "train", args.data)
        print(train_report(run_train_bench(folder, corpus, QUICK if args.quick else FULL), json_path))
        return
    from aiayn.bench.run import FULL, QUICK, report, run_bench

    corpus = load_split_for(folder, "test_2016_flickr", args.data)
    result = run_bench(folder, corpus.src, corpus.tgt, QUICK if args.quick else FULL)
    print(report(result, json_path))


def add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="decoding speed against CTranslate2 and the tutorials' decoding; --train: training speed"
    )
    add_model_flag(p)
    p.add_argument(
        "--train",
        action="store_true",
        help="training tokens/s of our step against today's and Hugging Face Marian's (same config, same batches)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer sentences and rounds (2 rounds of 40 sentences; the full run: 5 of 300); "
        "with --train: fewer steps",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    add_data_flag(p)
    p.set_defaults(func=cmd_bench)
