"""The `aiayn` command: thin wrappers that parse flags and call the library.

Heavy imports (torch, onnxruntime, gradio) happen inside each command, so
`aiayn translate` never loads torch and `aiayn --help` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from aiayn.bench.commands import add_bench
from aiayn.export.commands import add_export
from aiayn.export.contract import VARIANTS
from aiayn.model.config import ModelConfig
from aiayn.model.data import LANGUAGES, SPLITS
from aiayn.model.folder import DEFAULT_MODEL, resolve_model
from aiayn.serve.commands import add_serve, add_translate


class UserError(Exception):
    """A problem with the user's input or files: printed as one clear line, exit code 2."""


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


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
    """``--set dropout=0.3``: a ModelConfig field and a JSON value."""
    name, sep, value = text.partition("=")
    fields = set(ModelConfig.__dataclass_fields__) - {"special_tokens", "src_lang", "tgt_lang"}
    if not sep or name not in fields:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number or true/false") from None


def cmd_train(args: argparse.Namespace) -> None:
    from aiayn.model.data import load_parallel
    from aiayn.model.train import TrainOptions, train

    if args.src == args.tgt:
        raise UserError("--src and --tgt must differ")
    options = TrainOptions(
        out=args.out,
        preset=args.preset,
        overrides=dict(args.set),
        epochs=args.epochs,
        max_tokens=args.max_tokens,
        label_smoothing=args.label_smoothing,
        clip_norm=args.clip_norm,
        seed=args.seed,
        device=args.device,
        average_last=args.average_last,
        resume=args.resume,
        max_steps=args.max_steps,
        time_limit_minutes=args.time_limit,
        init_from=resolve_model(args.init_from) if args.init_from else None,
        lr_scale=args.lr_scale,
        warmup_steps=args.warmup,
    )
    train_data = load_parallel("train", args.src, args.tgt, args.data)
    val_data = load_parallel("val", args.src, args.tgt, args.data)
    if args.limit:
        train_data = train_data.head(args.limit)
        val_data = val_data.head(max(args.limit // 10, 1))
    folder = train(options, train_data, val_data)
    print(f"model folder: {folder}", file=sys.stderr)


def cmd_eval(args: argparse.Namespace) -> None:
    from aiayn.model.config import load_config
    from aiayn.model.evaluate import evaluate, load_split_for, tune_length_penalty
    from aiayn.model.folder import resolve_model
    from aiayn.model.tokenizer import SubwordTokenizer
    from aiayn.search.translator import SearchSettings, Translator
    from aiayn.serve.service import load_engine

    folder = resolve_model(args.model)
    corpus = load_split_for(folder, args.split, args.data)
    if args.limit:
        corpus = corpus.head(args.limit)
    engine = load_engine(folder, args.engine, args.device, args.variant)
    print(
        f"engine {args.engine} ({args.variant}), execution provider: {getattr(engine, 'provider', 'PyTorch')}",
        file=sys.stderr,
    )
    translator = Translator(engine, SubwordTokenizer.load(folder / "tokenizer.json"), load_config(folder).max_len)
    if args.tune_length_penalty:
        bleu = tune_length_penalty(folder, translator, corpus, args.beam, args.tune_length_penalty)
        for alpha, value in bleu.items():
            print(f"length penalty {alpha:4.2f}: BLEU {value:6.2f} ({corpus.split}, beam {args.beam})")
        best = max(bleu, key=lambda alpha: bleu[alpha])
        print(f"kept {best} in {folder / 'config.json'} (search.length_penalty)")
        return
    changes = {} if args.length_penalty is None else {"length_penalty": args.length_penalty}
    settings = SearchSettings.for_folder(folder, beam_size=args.beam, **changes)
    result = evaluate(translator, corpus, settings)
    summary = {
        "model": str(folder),
        "split": result.split,
        "sentences": result.sentences,
        "engine": args.engine,
        "variant": args.variant,
        "beam": args.beam,
        "length_penalty": settings.length_penalty,
        "seconds": round(result.seconds, 2),
        **result.scores.to_dict(),
    }
    if args.output:
        Path(args.output).write_text("\n".join(result.translations) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    s = result.scores
    print(
        f"{folder.name} {result.split} ({result.sentences} sentences, {args.engine}, beam {args.beam}, "
        f"length penalty {settings.length_penalty})"
    )
    print(f"BLEU            {s.bleu:6.2f}  {s.bleu_signature}")
    print(f"BLEU lowercased {s.bleu_lowercase:6.2f}")
    print(f"chrF            {s.chrf:6.2f}  {s.chrf_signature}")


def add_train(sub: Any) -> None:
    p = sub.add_parser("train", help="train a model on a Multi30k language pair into a model folder")
    p.add_argument("--src", required=True, choices=LANGUAGES)
    p.add_argument("--tgt", required=True, choices=LANGUAGES)
    p.add_argument("--out", required=True, type=Path, help="model folder to write")
    p.add_argument("--preset", default="tiny", help="architecture preset: tiny or base (default tiny)")
    p.add_argument(
        "--set",
        action="append",
        type=config_override,
        default=[],
        metavar="FIELD=VALUE",
        help="change one config field of the preset, e.g. --set dropout=0.3 (repeatable)",
    )
    p.add_argument("--epochs", type=positive_int, default=60)
    p.add_argument("--max-tokens", type=positive_int, default=4096, help="tokens per batch, padding included")
    p.add_argument(
        "--lr-scale",
        type=float,
        default=None,
        help="factor on the eq. 3 learning rate (default: as the run it goes on "
        "from, with --resume or --init-from; else 1)",
    )
    p.add_argument(
        "--warmup",
        type=positive_int,
        default=None,
        help="warm-up steps of eq. 3 (default: as the run it goes on from, with --resume or --init-from; else 4000)",
    )
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=None, help="clip gradients to this norm")
    p.add_argument("--average-last", type=int, default=0, help="average the last N epoch checkpoints at the end")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--max-steps", type=positive_int, default=None, help="stop after this many steps")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="MINUTES",
        help="start no new epoch after this much training time (then average, if asked)",
    )
    p.add_argument(
        "--init-from",
        default=None,
        metavar="MODEL",
        help="continue training a model folder or bundled model (its tokenizer, config and weights) into --out; "
        "with --resume, the run in --out already holds them",
    )
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N training sentences")
    p.add_argument("--data", default=None, help="Multi30k folder (default: AIAYN_DATA, ../shared, or download)")
    p.set_defaults(func=cmd_train)


def add_eval(sub: Any) -> None:
    p = sub.add_parser("eval", help="translate a Multi30k split and print BLEU and chrF")
    p.add_argument("--model", default=DEFAULT_MODEL, help="bundled model name (en-de, de-en) or model folder")
    p.add_argument("--split", default="test_2016_flickr", choices=SPLITS)
    p.add_argument("--beam", type=positive_int, default=4, help="beam size; 1 is greedy")
    p.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="α of §6.1 (default: the folder's tuned value in config.json, else 0.6)",
    )
    p.add_argument(
        "--tune-length-penalty",
        type=float_list,
        default=None,
        metavar="A,B,...",
        help="with --split val: score each α and keep the best in the folder's config.json",
    )
    p.add_argument("--engine", choices=("torch", "onnx"), default="torch")
    p.add_argument("--variant", choices=tuple(VARIANTS), default="fp32", help="ONNX graphs to use")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="ONNX execution provider")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N sentences")
    p.add_argument("--output", default=None, help="also write the translations to this file")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--data", default=None, help="Multi30k folder (default: AIAYN_DATA, ../shared, or download)")
    p.set_defaults(func=cmd_eval)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiayn", description="The Attention Is All You Need Transformer.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train(sub)
    add_eval(sub)
    add_export(sub)
    add_translate(sub)
    add_serve(sub)
    add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (UserError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"aiayn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
