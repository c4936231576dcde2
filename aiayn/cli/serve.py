"""`aiayn translate` and `aiayn serve`: thin wrappers over the translation service."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, TextIO

from aiayn.cli.args import DEVICES, UserError, add_engine_flags, add_model_flag, add_variant_flag, port_number
from aiayn.engines.load import ENGINES
from aiayn.text.sentences import split_lines

__all__ = ["DEVICES", "add_serve", "add_translate"]


# Lines searched together (batched by length, the batches side by side in the lanes) before their translations are
# written: 2 048 rather than 256 keeps both lanes busy across a chunk (a 3 400-line file: 0.87× CTranslate2 rather
# than 0.79×, greedy, whole process) and batches by length over a wider window.
CHUNK_LINES = 2048


def read_input(args: argparse.Namespace) -> list[str]:
    """The lines to translate: TEXT, --input FILE, or standard input; UTF-8 only."""
    if args.text is not None and args.input is not None:
        raise ValueError("give either TEXT or --input FILE, not both")
    if args.text is not None:
        return split_lines(args.text) or [""]
    if args.input is not None and Path(args.input).is_dir():
        raise UserError(f"--input {args.input}: is a folder; give a text file")
    if args.input is not None and not Path(args.input).is_file():
        raise FileNotFoundError(f"--input {args.input}: no such file")
    if args.input is None and sys.stdin.isatty():
        print("reading standard input, one sentence or paragraph per line (Ctrl-D to end)", file=sys.stderr)
    raw = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
    try:
        return split_lines(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        source = args.input or "standard input"
        raise ValueError(f"{source} is not UTF-8 text (byte {err.start}); convert it to UTF-8 first") from None


def check_output(path: str | None) -> None:
    """Refuse an --output that cannot be written before the model loads, without creating or emptying it."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"--output {path}: is a folder; give a file name")
    if not target.parent.is_dir():
        raise UserError(f"--output {path}: cannot write it (no folder {target.parent})")
    if not os.access(target if target.exists() else target.parent, os.W_OK):
        raise UserError(f"--output {path}: cannot write it (permission denied)")


def open_output(path: str | None) -> AbstractContextManager[TextIO]:
    """--output FILE (UTF-8, written as it goes), else standard output."""
    if path is None:
        return nullcontext(sys.stdout)
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as err:
        raise UserError(f"--output {path}: cannot write it ({err.strerror})") from None


def cmd_translate(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from aiayn.serve.service import TranslationService

    lines = read_input(args)
    check_output(args.output)
    clauses = not args.no_clauses
    service = TranslationService(args.engine, args.device, args.threads, clauses, args.variant)
    model = service.model(args.model)
    engine = f"engine {model.engine.name} ({args.variant}), execution provider: {model.provider}"
    print(f"model {model.folder.path}, {engine}", file=sys.stderr)
    # One line in, one line out. The lines go in chunks: a chunk's sentences are searched together, batched by
    # length, and its translations written (and flushed) before the next chunk starts.
    chunks = [model.prepare(lines[start : start + CHUNK_LINES]) for start in range(0, len(lines), CHUNK_LINES)]
    left_out: set[str] = set()
    kept, short, unsure, refused = 0, [], [], []
    total = sum(len(chunk.src_ids) for chunk in chunks)
    progress = tqdm(total=total, unit="sentence", disable=args.input is None, file=sys.stderr)
    with progress as bar, open_output(args.output) as out:
        for number, prepared in enumerate(chunks):
            done = model.run(prepared, args.beam or model.search.beam_size, on_batch=bar.update)
            translations = done.text.split("\n")
            missing = len(prepared.shape.lines) - len(translations)
            out.write("\n".join(translations + [""] * missing) + "\n")
            out.flush()
            left_out.update(done.left_out)
            kept += done.kept
            short += [number * CHUNK_LINES + line + 1 for line in done.short_lines]
            unsure += [number * CHUNK_LINES + line + 1 for line in done.unsure_lines]
            refused += [(number * CHUNK_LINES + line + 1, reason) for line, reason in done.refused]
    report(sorted(left_out), kept, short, unsure, refused)


def report(left_out: list[str], kept: int, short: list[int], unsure: list[int], refused: list[tuple[int, str]]) -> None:
    """What the translation left out or kept, on stderr; lines not translated end it with an error."""
    if left_out:
        print(f"not in the model's vocabulary, left out: {' '.join(left_out)}", file=sys.stderr)
    if kept:
        print(f"{kept} sentence(s) without a known word kept as they are", file=sys.stderr)
    for line in short:
        print(f"line {line}: the translation looks short for its source; a part may be missing", file=sys.stderr)
    for line in unsure:
        print(f"line {line}: the model is unsure of this translation; check it", file=sys.stderr)
    for line, reason in refused:
        print(f"line {line}: not translated: {reason}", file=sys.stderr)
    if refused:
        numbers = ", ".join(str(line) for line, _ in refused)
        raise UserError(f"{len(refused)} sentence(s) not translated, on line(s) {numbers}; the rest is translated")


def cmd_serve(args: argparse.Namespace) -> None:
    from aiayn.serve.memory import bound_server_memory

    bound_server_memory()  # before any thread starts
    from aiayn.serve.api import json_route
    from aiayn.serve.app import build_app, check_port, launch
    from aiayn.serve.service import TranslationService

    check_port(args.host, args.port)
    service = TranslationService("onnx", args.device, args.threads, not args.no_clauses, args.variant)
    app = build_app(service, args.model)
    launch(app, args.host, args.port, args.share, block=False, routes=[json_route(service)])
    names = ", ".join(service.models)
    provider = next(iter(service.models.values())).provider
    public = f" and {app.share_url}" if app.share_url else ""
    where = f"http://{args.host}:{args.port}{public}"
    print(f"serving {names} ({args.variant}) with ONNX Runtime on {provider} at {where}", file=sys.stderr)
    app.block_thread()  # until Ctrl-C


def add_translate(sub: Any) -> None:
    p = sub.add_parser("translate", help="translate text with a model folder (ONNX Runtime by default)")
    p.add_argument("text", nargs="?", default=None, help="text to translate (default: --input FILE or standard input)")
    p.add_argument("--input", default=None, metavar="FILE", help="UTF-8 text file, one sentence or paragraph per line")
    p.add_argument(
        "--output",
        default=None,
        metavar="FILE",
        help=f"write the translations to FILE (UTF-8), every {CHUNK_LINES} lines as they are done (default: stdout)",
    )
    add_model_flag(p)
    p.add_argument(
        "--beam",
        type=int,
        choices=range(1, 9),
        default=None,
        metavar="1..8",
        help="beam size; 1 is greedy (default: the folder's, 4 for a trained one)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="onnx",
        help="onnx: the fastest ONNX Runtime graphs for the device; onnx-portable: the contract's graphs; "
        "torch: needs the [train] extra",
    )
    add_engine_flags(p)
    add_variant_flag(p)
    add_clauses_flag(p)
    p.set_defaults(func=cmd_translate)


def add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="start the translation page and its API (Gradio)")
    p.add_argument("--model", action="append", default=None, help="bundled model name or folder (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=port_number, default=7860, help="TCP port to listen on")
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    add_engine_flags(p)
    add_variant_flag(p)
    add_clauses_flag(p)
    p.set_defaults(func=cmd_serve)


def add_clauses_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-clauses",
        action="store_true",
        help="translate every sentence whole, never clause by clause (docs/serve.md): as another runtime given "
        "the same sentences would, to compare them sentence by sentence",
    )
