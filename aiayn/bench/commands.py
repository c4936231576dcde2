"""`aiayn bench`: the speed table and its ratios, printed (and written as JSON with --json)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aiayn.model.folder import DEFAULT_MODEL, resolve_model


def cmd_bench(args: argparse.Namespace) -> None:
    from aiayn.bench.run import report, run_bench
    from aiayn.model.evaluate import load_split_for

    folder = resolve_model(args.model)
    corpus = load_split_for(folder, "test_2016_flickr", args.data)
    rows = run_bench(folder, corpus.src, corpus.tgt, args.quick)
    print(report(rows, Path(args.json) if args.json else None))


def add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="decoding speed against CTranslate2 and the tutorials' decoding")
    p.add_argument("--model", default=DEFAULT_MODEL, help="bundled model name or model folder")
    p.add_argument("--quick", action="store_true", help="fewer sentences, one repetition (about 2 minutes)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--data", default=None, help="Multi30k folder (default: AIAYN_DATA, ../shared, or download)")
    p.set_defaults(func=cmd_bench)
