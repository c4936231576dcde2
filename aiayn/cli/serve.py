"""`aiayn translate` and `aiayn serve`: thin wrappers over the translation service."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from aiayn.cli.args import (
    UserError,
    add_beam_flag,
    add_engine_flags,
    add_model_flag,
    engine_options,
    port_number,
    positive_int,
    seconds,
)
from aiayn.core.dependencies import PAGE_ONLY, TESTED, untested_line
from aiayn.text.sentences import split_lines

if TYPE_CHECKING:
    from aiayn.serve.details import Details
    from aiayn.serve.limits import Limits
    from aiayn.serve.operations import OperatorOptions

# Lines searched together (batched by length, the batches side by side in the lanes) before their translations are
# written: a chunk this long keeps both lanes busy across it and batches by length over a wide window (256 was
# measurably slower on a long file: docs/speed.md).
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


def check_output(path: str | None, flag: str = "--output") -> None:
    """Refuse an --output (or --report) that cannot be written before the model loads, without creating or emptying
    it."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{flag} {path}: is a folder; give a file name")
    if not target.parent.is_dir():
        raise UserError(f"{flag} {path}: cannot write it (no folder {target.parent})")
    if not os.access(target if target.exists() else target.parent, os.W_OK):
        raise UserError(f"{flag} {path}: cannot write it (permission denied)")


def open_output(path: str | None, flag: str = "--output") -> AbstractContextManager[TextIO]:
    """--output FILE (UTF-8, written as it goes), else standard output."""
    if path is None:
        return nullcontext(sys.stdout)
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot write it ({err.strerror})") from None


def open_report(path: str | None) -> AbstractContextManager[TextIO | None]:
    """--report FILE (UTF-8, written as it goes), else nothing."""
    return nullcontext(None) if path is None else open_output(path, "--report")


def cmd_translate(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from aiayn.serve.service import TranslationService

    lines = read_input(args)
    check_output(args.output)
    check_output(args.report, "--report")
    if (
        args.report is not None
        and args.output is not None
        and Path(args.report).resolve() == Path(args.output).resolve()
    ):
        raise UserError(f"--report {args.report} is the --output file; give it another name")
    clauses = not args.no_clauses
    warning = untested_line(tuple(name for name in TESTED if name not in PAGE_ONLY))
    if warning:
        print(warning, file=sys.stderr)
    service = TranslationService(engine_options(args), clauses)
    model = service.model(args.model)
    engine = f"engine {model.engine.name}, execution provider: {model.provider}, {args.variant} weights"
    print(f"model {model.folder.path}, {engine}", file=sys.stderr)
    # One line in, one line out. The lines go in chunks: a chunk's sentences are searched together, batched by
    # length, and its translations written (and flushed) before the next chunk starts.
    chunks = [model.prepare(lines[start : start + CHUNK_LINES]) for start in range(0, len(lines), CHUNK_LINES)]
    left_out: set[str] = set()
    unchanged, short, unsure, refused = 0, [], [], []
    total = sum(len(chunk.src_ids) for chunk in chunks)
    progress = tqdm(total=total, unit="sentence", disable=args.input is None, file=sys.stderr)
    made_by = {"engine": model.engine.name, "variant": args.variant, "beam": model.settings(args.beam).beam_size}
    with progress as bar, open_output(args.output) as out, open_report(args.report) as details:
        for number, prepared in enumerate(chunks):
            done = model.run(prepared, args.beam, on_batch=bar.update)
            translations = done.line_texts()
            out.write("\n".join(translations) + "\n")
            out.flush()
            if details is not None:
                details.write(report_lines(number * CHUNK_LINES, translations, done.lines, made_by))
                details.flush()
            left_out.update(done.left_out)
            unchanged += done.unchanged
            short += [number * CHUNK_LINES + line + 1 for line in done.short_lines]
            unsure += [number * CHUNK_LINES + line + 1 for line in done.unsure_lines]
            refused += [(number * CHUNK_LINES + line + 1, reason) for line, reason in done.refused]
    report(sorted(left_out), unchanged, short, unsure, refused, args.report)


def report_lines(first: int, translations: list[str], lines: list[Details], made_by: dict[str, Any]) -> str:
    """--report's JSON Lines for one chunk's lines, the first of them line ``first + 1`` of the input."""
    return "".join(
        json.dumps({"line": first + i + 1, "translation": text, **line.as_json(), **made_by}, ensure_ascii=False) + "\n"
        for i, (text, line) in enumerate(zip(translations, lines, strict=True))
    )


def report(
    left_out: list[str],
    unchanged: int,
    short: list[int],
    unsure: list[int],
    refused: list[tuple[int, str]],
    details: str | None = None,
) -> None:
    """What the translation left out or kept, on stderr (lines from 1), and where --report wrote every line's
    details; lines not translated end it with an error."""
    from aiayn.serve.status import notes

    for note in notes(left_out, unchanged, short, unsure, refused):
        print(note, file=sys.stderr)
    if details is not None:
        print(f"every line's score, flags and unsure words: {details} (JSON Lines)", file=sys.stderr)
    if refused:
        numbers = ", ".join(str(line) for line, _ in refused)
        raise UserError(f"{len(refused)} sentence(s) not translated, on line(s) {numbers}; the rest is translated")


def cmd_serve(args: argparse.Namespace) -> None:
    if args.ray is not None:
        ray_serve(args)
        return
    if args.ray_flags_given:
        raise UserError(f"{args.ray_flags_given[0]} goes with --ray (Ray Serve's replicas); add --ray")
    from aiayn.serve.server import serve

    options, clauses = engine_options(args), not args.no_clauses
    limits, operator = serve_limits(args), operator_options(args)
    cut = serve(
        args.model, args.host, args.port, args.share, options, clauses, limits=limits, operator=operator, mcp=args.mcp
    )
    if cut:
        sys.exit(1)  # requests were cut by the stop: stderr says how many


def operator_options(args: argparse.Namespace) -> OperatorOptions:
    """The operators' flags as ``operations.OperatorOptions``."""
    from aiayn.serve.operations import OperatorOptions

    if not 0 <= args.grace < float("inf"):
        raise UserError(f"--grace {args.grace:g}: give the seconds to wait, 0 or more")
    log = None if args.no_access_log else args.log_format
    if args.api_keys_page and args.api_keys is None:
        raise UserError("--api-keys-page goes with --api-keys FILE (the keys it asks for)")
    if args.api_keys_page and args.mcp:
        raise UserError("--api-keys-page cannot go with --mcp: Gradio's MCP server calls the page back without a key")
    keys = None if args.api_keys is None else Path(args.api_keys)  # read where the server starts, before the models
    return OperatorOptions(not args.no_metrics, log, args.log_text, args.grace, keys, args.api_keys_page)


def serve_limits(args: argparse.Namespace) -> Limits:
    """The limits the flags set (``serve/limits.py``), checked before any model loads."""
    from aiayn.serve.limits import Limits

    return Limits(max_waiting=args.max_waiting, request_timeout_s=args.request_timeout)


def ray_serve(args: argparse.Namespace) -> None:
    """`aiayn serve --ray`: each translation replica's engine on its own CPUs (``--cores``: one lane per CPU)."""
    from aiayn.serve.ray_serve import Application, Scaling, serve_on_ray

    if args.share:
        raise UserError("--share is not served through Ray's proxy; put the proxy behind your own address instead")
    if args.mcp:
        raise UserError("--mcp is served by `aiayn serve` without --ray (Gradio's MCP server calls its own page back)")
    scaling = Scaling(
        args.replicas, args.min_replicas, args.max_replicas, args.target_ongoing_requests, args.cpus_per_replica
    )
    args.cores = args.cores or max(1, int(args.cpus_per_replica))
    address = args.ray or None  # --ray alone: a cluster of this machine, started here
    options, limits = engine_options(args), serve_limits(args)
    app = Application(
        args.model, options, not args.no_clauses, scaling, args.host, args.port, limits, operator_options(args)
    )
    if serve_on_ray(address, app):
        sys.exit(1)  # requests were cut by the stop: stderr says how many


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
    p.add_argument(
        "--report",
        default=None,
        metavar="FILE",
        help="also write what the model knows about each line to FILE, one JSON object per line (JSON Lines): its "
        "score, flags, unsure words, how it was cut (docs/serve.md)",
    )
    add_model_flag(p)
    add_beam_flag(p)
    add_engine_flags(p)
    add_clauses_flag(p)
    p.set_defaults(func=cmd_translate)


def add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="start the translation page and its API (Gradio)")
    p.add_argument("--model", action="append", default=None, help="bundled model name or folder (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=port_number, default=7860, help="TCP port to listen on")
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    add_limit_flags(p)
    add_engine_flags(p, engine_help=None)
    add_clauses_flag(p)
    add_operator_flags(p)
    add_ray_flags(p)
    p.set_defaults(func=cmd_serve)


def add_operator_flags(p: argparse.ArgumentParser) -> None:
    from aiayn.serve.access_log import FORMATS
    from aiayn.serve.drain import GRACE_S

    ops = p.add_argument_group("operating it (docs/serve.md, Operating it)")
    ops.add_argument("--no-metrics", action="store_true", help="no Prometheus metrics at GET /metrics")
    ops.add_argument(
        "--grace",
        type=float,
        default=GRACE_S,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, answer the requests accepted for at most this long, refusing new ones with 503 "
        "(a second signal stops at once; under --ray, each replica's graceful shutdown)",
    )
    ops.add_argument(
        "--log-format", choices=FORMATS, default="text", help="the access log's lines on stderr: text, or JSON"
    )
    ops.add_argument("--no-access-log", action="store_true", help="no access log line per request")
    ops.add_argument(
        "--log-text", action="store_true", help="the user's text in the access log (never, without this flag)"
    )
    ops.add_argument(
        "--api-keys",
        default=None,
        metavar="FILE",
        help="the JSON doors (POST /v1/translate, /translate, /detect) answer only requests with one of FILE's keys "
        "(one a line, optional per_minute=N chars=N): else 403; over its rate 429 (docs/serve.md, API keys)",
    )
    ops.add_argument(
        "--api-keys-page", action="store_true", help="with --api-keys: the page and its API need a key too"
    )
    ops.add_argument(
        "--mcp",
        action="store_true",
        help="the page's translate as an MCP tool at /gradio_api/mcp/ (Gradio's MCP server; pip install 'gradio[mcp]')",
    )


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    """The JSON route's two limits a deployer sets (the others: ``serve/limits.py``, docs/serve.md "Security")."""
    from aiayn.serve.limits import MAX_SENTENCES_PER_REQUEST, MAX_WAITING_SENTENCES, REQUEST_TIMEOUT_S

    p.add_argument(
        "--max-waiting",
        type=positive_int,
        default=MAX_WAITING_SENTENCES,
        metavar="SENTENCES",
        help="sentences of POST /v1/translate waiting or searched at once (at least one request's, "
        f"{MAX_SENTENCES_PER_REQUEST}); a request beyond them is answered 503 with Retry-After",
    )
    p.add_argument(
        "--request-timeout",
        type=seconds,
        default=REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="a POST /v1/translate request not answered within this time is answered 503, a page request gets its "
        "`not translated` line, and their sentences not yet searched are dropped",
    )


# Ray Serve's own scaling settings, under their own names: (flag, metavar, type, default, help).
SCALING_FLAGS: tuple[tuple[str, str, Callable[[str], Any], Any, str], ...] = (
    ("--replicas", "N", positive_int, 1, "translation replicas (the minimum, with --max-replicas)"),
    ("--max-replicas", "N", positive_int, None, "autoscale the translation replicas up to this many (max_replicas)"),
    ("--min-replicas", "N", int, None, "with --max-replicas: min_replicas (default: --replicas; 0: none when idle)"),
    (
        "--target-ongoing-requests",
        "R",
        float,
        None,
        "with --max-replicas: the requests a replica should hold at once (target_ongoing_requests)",
    ),
    (
        "--cpus-per-replica",
        "CPUS",
        float,
        1.0,
        "CPUs Ray gives each translation replica (its engine runs one lane per whole CPU unless --cores)",
    ),
)


class RayFlag(argparse.Action):
    """A flag of Ray Serve's scaling: stored, and noted, so that one given without --ray is refused."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.ray_flags_given = [*namespace.ray_flags_given, option]


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    ray = p.add_argument_group("serving on Ray Serve (pip install -e '.[ray]'; docs/serve.md)")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="serve the page and the JSON route as a Ray Serve application, the translation in replicas: on the "
        "Ray cluster at ADDRESS (auto: the one running on this machine), or without ADDRESS on a cluster of this "
        "machine started for it; --host and --port are then those of Ray's HTTP proxy",
    )
    p.set_defaults(ray_flags_given=[])
    for flag, metavar, kind, default, text in SCALING_FLAGS:
        ray.add_argument(flag, metavar=metavar, type=kind, default=default, action=RayFlag, help=text)


def add_clauses_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-clauses",
        action="store_true",
        help="translate every sentence whole, never clause by clause (docs/serve.md): as another runtime given "
        "the same sentences would, to compare them sentence by sentence",
    )
