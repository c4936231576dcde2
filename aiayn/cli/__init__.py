"""The `aiayn` command: each subcommand parses its flags and prints what a library function returns.

Heavy imports (torch, onnxruntime, gradio) happen inside each command, so
`aiayn translate` never loads torch and `aiayn --help` is instant.
"""

from __future__ import annotations

import argparse
import sys

from aiayn.cli.args import HelpFormatter, UserError
from aiayn.cli.bench import add_bench
from aiayn.cli.evaluate import add_eval
from aiayn.cli.export import add_export
from aiayn.cli.importing import add_import
from aiayn.cli.prepare import add_prepare
from aiayn.cli.serve import add_serve, add_translate
from aiayn.cli.train import add_train
from aiayn.engines.load import installed_engine

__all__ = ["UserError", "build_parser", "main"]

# Commands that train or convert weights need PyTorch, which the demo install leaves out.
NEEDS_TORCH = ("train", "import", "export", "bench")
FULL_INSTALL = 'pip install torch==2.13.0 -e ".[dev]"'


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiayn", description="The Attention Is All You Need Transformer.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_prepare(sub)
    add_train(sub)
    add_import(sub)
    add_eval(sub)
    add_export(sub)
    add_translate(sub)
    add_serve(sub)
    add_bench(sub)
    for command in sub.choices.values():
        command.formatter_class = HelpFormatter
    return parser


def needs_torch(args: argparse.Namespace) -> bool:
    """`aiayn export --to web` and `--to space` only copy files already written (the graphs, the weights), so the
    demo install runs them too."""
    return args.command in NEEDS_TORCH and not (args.command == "export" and args.to in ("web", "space"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # as typed, for the records that keep the command (training.json)
    if needs_torch(args) and installed_engine() != "torch":
        print(
            f"aiayn {args.command}: error: needs PyTorch, which the demo install leaves out; "
            f"install everything with `{FULL_INSTALL}`",
            file=sys.stderr,
        )
        return 2
    try:
        args.func(args)
    except (UserError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"aiayn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0
