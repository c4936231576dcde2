"""`aiayn train`: flags → ``aiayn.train.train``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from aiayn.cli.args import UserError, add_device_flag, config_override, positive_int, share
from aiayn.cli.corpus import add_corpus_flags, corpus_sources
from aiayn.core.config import PRESETS
from aiayn.core.folder import TRAINING_RECORD_FILE, ModelFolder
from aiayn.train.options import DEFAULT_EPOCHS, TrainOptions
from aiayn.train.progress import StopReason

# StrEnum members equal their text, so the reason training.json records finds its line here.
STOP_REASONS: dict[str, str] = {
    StopReason.EPOCHS: "its epochs were done",
    StopReason.MAX_STEPS: "--max-steps was reached",
    StopReason.TIME_LIMIT: "--time-limit was reached",
}
PRECISIONS = ("auto", "fp32", "bf16")  # train.precision's, named here so that --help needs no torch


def cmd_train(args: argparse.Namespace) -> None:
    from aiayn.core.folder import resolve_model
    from aiayn.train.loop import train

    if args.resume and not given_corpus(args) and args.prepared is None:
        args = resumed_args(args)
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
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        max_steps=args.max_steps,
        time_limit_minutes=args.time_limit,
        init_from=resolve_model(args.init_from) if args.init_from else None,
        lr_scale=args.lr_scale,
        warmup_steps=args.warmup,
        cooldown=args.cooldown,
        update_freq=args.update_freq,
        precision=args.precision,
        max_length=args.max_length,
        tokenizer_sample=args.tokenizer_sample,
        prepared=args.prepared,
        command=shlex.join(["aiayn", *args.argv]),
    )
    try:
        if args.prepared is not None:
            if given_corpus(args) or args.src or args.tgt:
                raise UserError("--prepared DIR holds the corpus already; leave out --src/--tgt and the corpus flags")
            folder = train(options)
        else:
            folder = train(options, *corpus_sources(args))
    except KeyboardInterrupt:
        raise UserError(
            f"training interrupted; go on from its last checkpoint with `aiayn train --out {args.out} --resume`"
        ) from None
    for line in run_summary(ModelFolder(folder)):
        print(line, file=sys.stderr)


def given_corpus(args: argparse.Namespace) -> bool:
    return bool(args.train_files or args.train_tsv or args.hf)


def resumed_args(args: argparse.Namespace) -> argparse.Namespace:
    """`aiayn train --out DIR --resume` alone: the flags of the command that started the run in DIR
    (training.json keeps it), with --resume and any flag given now."""
    from aiayn.cli import build_parser

    commands = ModelFolder(args.out).training_record().get("commands") or []
    if not commands:
        raise UserError(
            f"no run to resume in {args.out} (no {TRAINING_RECORD_FILE}); start one without --resume, "
            "or give the folder a run started with `aiayn train --out DIR`"
        )
    parser = build_parser()
    resumed = parser.parse_args([*shlex.split(commands[0])[1:], "--resume"])  # without the program's name
    unchanged = parser.parse_args(["train", "--out", str(args.out)])
    for name, value in vars(args).items():  # flags given now win: --resume --max-steps 5000
        if value != getattr(unchanged, name, None):
            setattr(resumed, name, value)
    resumed.out = args.out  # the folder as named now, should it have moved
    return resumed


def run_summary(folder: ModelFolder) -> list[str]:
    """What a finished run did and what to do next; a run that wrote no weights is refused (exit 2)."""
    record = folder.training_record()
    stopped_by = record.get("stopped_by", "")
    minutes = record.get("wall_seconds", 0) / 60
    lines = [
        f"stopped after {record.get('steps', 0)} steps ({minutes:.1f} min): {STOP_REASONS.get(stopped_by, stopped_by)}"
    ]
    validated = [entry for entry in record.get("epochs", []) if entry.get("val_bleu") is not None]
    if not folder.weights_file.is_file() or not validated:
        raise UserError(
            f"{lines[0]}, before any validation, so no weights were written to {folder.path}; "
            "train longer (--max-steps, --time-limit or --epochs)"
        )
    best = max(validated, key=lambda entry: entry["val_bleu"])
    lines.append(
        f"best validation BLEU {best['val_bleu']:.2f} (greedy) at step {best['step']}; those weights are in "
        f"{folder.weights_file}"
    )
    model = shlex.quote(str(folder.path))
    return [
        *lines,
        f'it translates now: aiayn translate --model {model} "A sentence." (or aiayn serve --model {model})',
        f"next: aiayn export {model}  (the ONNX files for other runtimes, proven against PyTorch), then "
        f"aiayn eval --model {model} --test-files SRC REF",
    ]


def add_train(sub: Any) -> None:
    p = sub.add_parser("train", help="train a model on Multi30k or your own parallel corpus into a model folder")
    add_corpus_flags(p)
    p.add_argument("--prepared", type=Path, default=None, metavar="DIR", help="train on what `aiayn prepare` wrote")
    p.add_argument("--out", required=True, type=Path, help="model folder to write")
    p.add_argument("--preset", default="tiny", choices=tuple(PRESETS), help="architecture preset (base: Table 3's)")
    p.add_argument(
        "--set",
        action="append",
        type=config_override,
        default=[],
        metavar="FIELD=VALUE",
        help="change one config field of the preset, e.g. --set dropout=0.3 (repeatable)",
    )
    add_batch_flags(p)
    add_optimizer_flags(p)
    add_device_flag(p, "PyTorch")
    add_run_flags(p)
    p.set_defaults(func=cmd_train)


def add_batch_flags(p: argparse.ArgumentParser) -> None:
    """How much a run trains on, and how: epochs, batch size, accumulation, precision."""
    p.add_argument(
        "--epochs",
        type=positive_int,
        default=None,
        help=f"epochs to train (default: {DEFAULT_EPOCHS}, or as many as --max-steps or --time-limit allow)",
    )
    p.add_argument("--max-tokens", type=positive_int, default=4096, help="tokens per batch, padding included")
    p.add_argument(
        "--update-freq",
        type=positive_int,
        default=1,
        metavar="N",
        help="accumulate N batches into one update (N × --max-tokens a step, × the processes under torchrun)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="auto: bf16 autocast on a GPU that has it, else fp32; bf16 on a CPU needs AVX512-BF16 or AMX",
    )


def add_optimizer_flags(p: argparse.ArgumentParser) -> None:
    """Eq. 3's schedule, §5.4's regularization, §6.1's averaging and the seed."""
    p.add_argument(
        "--lr-scale",
        type=float,
        default=None,
        help="factor on the eq. 3 learning rate (default: as the run it goes on "
        "from, with --resume or --init-from; else 2.5 for --preset tiny, 1 for base and an imported parent)",
    )
    p.add_argument(
        "--warmup",
        type=positive_int,
        default=None,
        help="warm-up steps of eq. 3 (default: as the run it goes on from, with --resume or --init-from; else 4000)",
    )
    p.add_argument(
        "--cooldown",
        type=share,
        default=None,
        metavar="SHARE",
        help="share of the run (its steps, or --time-limit) over which the rate falls linearly to zero at its end "
        "(default: as the run it goes on from; else 0.2; 0: eq. 3 to the end, as the paper)",
    )
    p.add_argument("--label-smoothing", type=float, default=0.1, help="ε of §5.4's label smoothing")
    p.add_argument("--clip-norm", type=float, default=None, help="clip gradients to this norm (default: no clipping)")
    p.add_argument("--average-last", type=int, default=0, help="average the last N (≥ 2) epoch checkpoints at the end")
    p.add_argument("--seed", type=int, default=1, help="random seed (initialisation, dropout, batch order)")


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Where a run starts and when it stops: --resume, checkpoints, limits, --init-from."""
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument(
        "--checkpoint-every",
        type=positive_int,
        default=TrainOptions.checkpoint_every,
        metavar="STEPS",
        help="steps between the checkpoints --resume goes on from (one is also written after every epoch)",
    )
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
