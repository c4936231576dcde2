"""Argument types and flags that several commands share: each defined once."""

from __future__ import annotations

import argparse
import json
from typing import Any

from aiayn.core.config import ModelConfig
from aiayn.core.folder import DEFAULT_MODEL
from aiayn.engines import DEVICES, ENGINES, ONNX, VARIANTS
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import MAX_BEAM, beam_size_of

DATA_HELP = (
    "the folder of Multi30k's files (default: $AIAYN_DATA, else shared/data/multi30k beside the repository or the "
    "current folder, else downloaded once into ~/.cache/aiayn)"
)
MODEL_HELP = "bundled model name (en-de, de-en) or model folder"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help ends with its default, unless there is none to show (unset, off, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A time in seconds, more than 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def share(text: str) -> float:
    """A share of something, 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a share from 0 to 1, got {text!r}")
    return value


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 1 to 65535, got {text!r}")
    return value


def beam_size(text: str) -> int:
    """``--beam``, checked as the search checks every beam size."""
    try:
        return beam_size_of(int(text) if text.strip().lstrip("-").isdigit() else text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def float_list(text: str) -> list[float]:
    """``0.6,1.0,1.4``: comma-separated numbers."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, e.g. 0.6,1.0,1.4; got {text}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number, e.g. 0.6,1.0,1.4")
    return values


def config_override(text: str) -> tuple[str, Any]:
    """``--set dropout=0.3``, ``--set activation=swish``: a ModelConfig field and a JSON value (a bare word is
    a string)."""
    name, sep, value = text.partition("=")
    fields = set(ModelConfig.__dataclass_fields__) - {"special_tokens", "src_lang", "tgt_lang", "never_generate"}
    if not sep or name not in fields:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        if value.isidentifier():
            return name, value
        raise argparse.ArgumentTypeError(f"{value!r} is not a number, true/false or a word") from None


def add_model_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)


def add_data_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help=DATA_HELP)


def add_variant_flag(p: argparse.ArgumentParser, scope: str = "") -> None:
    """--variant, the one flag for the weights an engine runs; ``scope`` says where a command takes it."""
    p.add_argument(
        "--variant",
        choices=VARIANTS,
        default="fp32",
        help=f"{scope}the weights: fp32; w8, w4: 8- or 4-bit weight blocks built at load (onnx engine, CPU; "
        "docs/speed.md); int8: dynamic int8 (CPU); fp16: the serving graphs on a GPU, or the graphs of "
        "`aiayn export --variant fp16`",
    )


def add_device_flag(p: argparse.ArgumentParser, runtime: str = "ONNX Runtime", default: str = "auto") -> None:
    where = f"where {runtime} runs; auto: a GPU where it works, else the CPU"
    p.add_argument("--device", choices=DEVICES, default=default, help=where)


def add_beam_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--beam",
        type=beam_size,
        default=None,
        metavar=f"1..{MAX_BEAM}",
        help="beam size; 1 is greedy (default: the folder's, 4 for a trained one)",
    )


ENGINE_HELP = (
    "onnx: the serving engine, its graphs built from the weights for the device (the contract's graphs where it has "
    "none of --variant there); onnx-portable: the contract's graphs; torch: needs the [train] extra"
)


def add_engine_flags(
    p: argparse.ArgumentParser,
    engine: str | None = ONNX,
    engine_help: str | None = ENGINE_HELP,
    device_default: str = "auto",
) -> None:
    """The flags of ``EngineOptions``, read back by ``engine_options``: --engine (default ``engine``; none where
    ``engine_help`` is None: the command runs ONNX Runtime), --device, --cores, --threads-per-lane, --variant."""
    if engine_help is None:
        p.set_defaults(engine=engine)
    else:
        p.add_argument("--engine", choices=ENGINES, default=engine, help=engine_help)
    add_device_flag(p, "the engine", device_default)
    p.add_argument(
        "--cores",
        "--threads",  # its earlier name, which said less than it sets
        dest="cores",
        type=positive_int,
        default=None,
        metavar="N",
        help="cores to use (default: the machine's, ≤ 4): on a CPU, lanes of --threads-per-lane ONNX Runtime threads, "
        "each lane searching its own batch",
    )
    p.add_argument(
        "--threads-per-lane",
        type=positive_int,
        default=1,
        metavar="T",
        help="ONNX Runtime's intra-op threads in each lane: 1 searches most batches at once; --cores 2 "
        "--threads-per-lane 2 gives one search both cores (at the bundled size about half as fast: docs/speed.md)",
    )
    add_variant_flag(p)


def engine_options(args: argparse.Namespace, engine: str = ONNX) -> EngineOptions:
    """The ``EngineOptions`` of ``add_engine_flags``' flags (``engine``: what runs where --engine was left unset);
    a wrong combination is a ``UserError`` in one line."""
    try:
        return EngineOptions.for_cores(
            args.engine or engine, args.device, args.variant, args.cores, args.threads_per_lane
        )
    except ValueError as err:
        raise UserError(str(err)) from None


class UserError(Exception):
    """A problem with the user's input or files: printed as one clear line, exit code 2."""
