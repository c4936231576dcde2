"""`aiayn translate` and `aiayn serve`: thin wrappers over the translation service."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.args import DEVICES, add_engine_flags, add_model_flag
from aiayn.engines.load import ENGINES

__all__ = ["DEVICES", "add_serve", "add_translate"]


def read_input(args: argparse.Namespace) -> list[str]:
    """The lines to translate: TEXT, --input FILE, or standard input; UTF-8 only."""
    if args.text is not None and args.input is not None:
        raise ValueError("give either TEXT or --input FILE, not both")
    if args.text is not None:
        return args.text.splitlines() or [""]
    if args.input is not None and not Path(args.input).is_file():
        raise FileNotFoundError(f"--input {args.input}: no such file")
    if args.input is None and sys.stdin.isatty():
        print("reading standard input, one sentence or paragraph per line (Ctrl-D to end)", file=sys.stderr)
    raw = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
    try:
        return raw.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as err:
        source = args.input or "standard input"
        raise ValueError(f"{source} is not UTF-8 text (byte {err.start}); convert it to UTF-8 first") from None


def cmd_translate(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from aiayn.serve.service import TranslationService

    lines = read_input(args)
    model = TranslationService(args.engine, args.device, args.threads).model(args.model)
    engine = getattr(model.engine, "name", args.engine)
    print(f"model {model.folder.path}, engine {engine}, execution provider: {model.provider}", file=sys.stderr)
    # One line in, one line out; all sentences go through the search together, batched by length.
    prepared = model.prepare("\n".join(lines))
    with tqdm(total=len(prepared.src_ids), unit="sentence", disable=args.input is None, file=sys.stderr) as bar:
        done = model.run(prepared, args.beam, on_batch=bar.update)
    if done.left_out:
        print(f"not in the model's vocabulary, left out: {' '.join(done.left_out)}", file=sys.stderr)
    if done.kept:
        print(f"{done.kept} sentence(s) without a known word kept as they are", file=sys.stderr)
    translations = done.text.split("\n") if lines else []
    for line in translations + [""] * (len(lines) - len(translations)):
        print(line)


def cmd_serve(args: argparse.Namespace) -> None:
    from aiayn.serve.app import build_app, launch
    from aiayn.serve.service import TranslationService

    service = TranslationService("onnx", args.device, args.threads)
    app = build_app(service, args.model)
    names = ", ".join(service.models)
    provider = next(iter(service.models.values())).provider
    print(f"serving {names} with ONNX Runtime on {provider} at http://{args.host}:{args.port}", file=sys.stderr)
    launch(app, args.host, args.port, args.share)


def add_translate(sub: Any) -> None:
    p = sub.add_parser("translate", help="translate text with a model folder (ONNX Runtime by default)")
    p.add_argument("text", nargs="?", default=None, help="text to translate (default: --input FILE or standard input)")
    p.add_argument("--input", default=None, metavar="FILE", help="UTF-8 text file, one sentence or paragraph per line")
    add_model_flag(p)
    p.add_argument("--beam", type=int, choices=range(1, 9), default=4, metavar="1..8", help="beam size; 1 is greedy")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="onnx",
        help="onnx: the fastest ONNX Runtime graphs for the device; onnx-portable: the contract's graphs; "
        "torch: needs the [train] extra",
    )
    add_engine_flags(p)
    p.set_defaults(func=cmd_translate)


def add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="start the translation page and its API (Gradio)")
    p.add_argument("--model", action="append", default=None, help="bundled model name or folder (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    add_engine_flags(p)
    p.set_defaults(func=cmd_serve)
