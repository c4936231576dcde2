"""`aiayn translate` and `aiayn serve`: thin wrappers over the translation service."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from aiayn.model.folder import DEFAULT_MODEL
from aiayn.serve.engine import DEVICES


def read_input(args: argparse.Namespace) -> list[str]:
    """The lines to translate: TEXT, --input FILE, or standard input."""
    if args.text is not None and args.input is not None:
        raise ValueError("give either TEXT or --input FILE, not both")
    if args.text is not None:
        return args.text.splitlines() or [""]
    raw = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
    source = args.input or "standard input"
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{source} is not UTF-8 text (byte {err.start}); convert it to UTF-8 first") from None


def cmd_translate(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from aiayn.serve.service import TranslationService

    if args.input is not None and not Path(args.input).is_file():
        raise FileNotFoundError(f"--input {args.input}: no such file")
    lines = read_input(args)
    service = TranslationService(engine=args.engine, device=args.device)
    model = service.model(args.model)
    print(f"model {model.folder}, engine {args.engine}, execution provider: {model.provider}", file=sys.stderr)
    bar = tqdm(unit="sentence", disable=args.input is None, file=sys.stderr)
    # One line in, one line out; all sentences go through the search together, batched by length.
    translations = model.translate("\n".join(lines), args.beam, on_batch=bar.update)[0].split("\n")
    bar.close()
    for line in translations:
        print(line)


def cmd_serve(args: argparse.Namespace) -> None:
    from aiayn.serve.app import build_app
    from aiayn.serve.service import TranslationService

    service = TranslationService(engine="onnx", device=args.device)
    app = build_app(service, args.model)
    app.launch(server_name=args.host, server_port=args.port, share=args.share)


def add_translate(sub: Any) -> None:
    p = sub.add_parser("translate", help="translate text with a model folder (ONNX Runtime by default)")
    p.add_argument("text", nargs="?", default=None, help="text to translate (default: --input FILE or stdin)")
    p.add_argument("--input", default=None, help="UTF-8 text file, one sentence or paragraph per line")
    p.add_argument("--model", default=DEFAULT_MODEL, help="bundled model name (en-de, de-en) or model folder")
    p.add_argument("--beam", type=int, choices=range(1, 9), default=4, metavar="1..8", help="beam size; 1 is greedy")
    p.add_argument("--engine", choices=("onnx", "torch"), default="onnx")
    p.add_argument("--device", choices=DEVICES, default="auto", help="ONNX execution provider (default auto)")
    p.set_defaults(func=cmd_translate)


def add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="start the translation page and its API")
    p.add_argument("--model", action="append", default=None, help="bundled model name or folder (repeatable)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.set_defaults(func=cmd_serve)
