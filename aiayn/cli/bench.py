"""`aiayn bench`: the speed table and its ratios, printed (and written as JSON with --json); or, by its flags, one of
the other measurements (``MODES``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiayn.cli.args import (
    UserError,
    add_data_flag,
    add_engine_flags,
    add_model_flag,
    engine_options,
    positive_int,
)
from aiayn.core.folder import ModelFolder


def split_of(folder: ModelFolder, args: argparse.Namespace, split: str = "test_2016_flickr") -> Any:
    from aiayn.evaluation.evaluate import load_split_for

    return load_split_for(folder, split, args.data)


def bench_serve(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.crowd import json_route_lines, measure_crowds, measure_json_route, serve_report

    sentences = split_of(folder, args).src
    if args.quick:
        return "\n".join(json_route_lines(*measure_json_route(args.model, sentences)))
    return serve_report(measure_crowds(args.model, sentences))


def bench_ray(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.ray_serving import measure_ray, ray_report

    return ray_report(measure_ray(args.model, split_of(folder, args).src))


def bench_web(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.web import (
        WEB_FULL,
        WEB_QUICK,
        base_web_report,
        measure_web,
        measure_web_base,
        parts_report,
        web_report,
    )
    from aiayn.engines import WEB_VARIANTS
    from aiayn.serve.service import TranslationService

    test = split_of(folder, args).src
    plan = WEB_QUICK if args.quick else WEB_FULL
    options = replace(engine_options(args), device="cpu")  # `aiayn translate --variant` on the CPU: the reference
    figures = [
        measure_web(
            TranslationService(replace(options, variant=variant)).model(args.model),
            test[: plan.captions],
            variant,
            alone=test[: plan.alone],
        )
        for variant in WEB_VARIANTS
    ]
    return "\n\n".join(
        (
            web_report(figures, min(plan.alone, len(test))),
            f"Where the first translation's time went (ms since the page opened):\n\n{parts_report(figures)}",
            base_web_report(measure_web_base(folder, test[: plan.base_captions], WEB_VARIANTS)),
        )
    )


def bench_memory(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.memory import measure_memory, memory_report
    from aiayn.core.folder import bundled_models
    from aiayn.serve.requests import pair_value

    served = [ModelFolder.open(path) for path in bundled_models().values()]
    return memory_report(measure_memory({pair_value(f): split_of(f, args).src for f in served}))


def bench_profile(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.profile import profile_sizes

    return profile_sizes(folder, split_of(folder, args).src, args.quick, args.variant)


def bench_search(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.search_cost import measure_search_costs, search_report

    baseline = None if args.baseline is None else baseline_checkout(args.baseline)
    rounds = 2 if args.quick else 5
    rows = measure_search_costs(folder, split_of(folder, args).src, rounds, baseline, args.quick)
    return search_report(rows, baseline is not None)


def bench_sessions(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.sessions import measure_sessions, sessions_report

    return sessions_report(measure_sessions(folder.path, args.sessions))


def bench_long(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.long_sentences import long_report, measure
    from aiayn.serve.service import TranslationService

    model = TranslationService(engine_options(args)).model(args.model)
    figures = measure(model, split_of(folder, args, "val"), split_of(folder, args, "train"), args.beam)
    return long_report(figures, f"{folder.config.src_lang}-{folder.config.tgt_lang}", "val", args.beam)


def bench_train(folder: ModelFolder, args: argparse.Namespace) -> str:
    from aiayn.bench.training import FULL, QUICK, run_train_bench, train_report

    plan = QUICK if args.quick else FULL
    result = run_train_bench(folder, split_of(folder, args, "train"), plan, argv=args.argv)
    return train_report(result, json_path(args))


def bench_speed(folder: ModelFolder, args: argparse.Namespace) -> str:
    """Every engine against its peers in the same rounds, on the model and at the base size; on a GPU, ours against
    CTranslate2 there (each engine's placement checked first: a GPU that does not work is one line)."""
    from aiayn.bench.base_size import BASE_FULL, BASE_QUICK, base_appended, run_base_bench
    from aiayn.bench.base_size import FRAMINGS as BASE_FRAMINGS
    from aiayn.bench.conditions import machine_header
    from aiayn.bench.engines import CUDA_CONFIGS, FRAMINGS, ON_CUDA, Framing, with_baseline
    from aiayn.bench.run import FULL, QUICK, report, run_bench
    from aiayn.engines.load import place

    on_gpu = place(engine_options(args)).on_gpu
    corpus = split_of(folder, args)
    plan, base_plan = (QUICK, BASE_QUICK) if args.quick else (FULL, BASE_FULL)
    framings: tuple[Framing, ...] = FRAMINGS
    base_framings: tuple[Framing, ...] = BASE_FRAMINGS
    configs: dict[str, Any] = {}
    if on_gpu:  # the bundled model and the base size, greedy and beam 4 up to batches of 128, each median of ≥ 3
        plan, base_plan = replace(plan, rounds=max(plan.rounds, 3)), replace(base_plan, rounds=max(base_plan.rounds, 3))
        framings = base_framings = (ON_CUDA,)
        configs = {"configs": CUDA_CONFIGS}
    if args.baseline is not None:
        checkout = baseline_checkout(args.baseline)
        framings, base_framings = (tuple(with_baseline(f, checkout) for f in fs) for fs in (framings, base_framings))
    result = run_bench(folder, corpus.src, corpus.tgt, plan, framings, with_serving=not on_gpu, **configs)
    base = run_base_bench(folder, corpus.src, base_plan, framings=base_framings, **configs)
    return report(result, json_path(args), base_appended(base), machine_header(args.argv))


def baseline_checkout(path: str) -> Path:
    checkout = Path(path).resolve()
    if not (checkout / "aiayn" / "bench" / "worker.py").is_file():
        raise UserError(
            f"--baseline {path}: no checkout of this repository there; make one with `git worktree add DIR COMMIT`"
        )
    return checkout


def json_path(args: argparse.Namespace) -> Path | None:
    return Path(args.json) if args.json else None


# The measurements other than the speed table, by the flag that asks for each (the first one given runs).
MODES: dict[str, Callable[[ModelFolder, argparse.Namespace], str]] = {
    "serve": bench_serve,
    "ray": bench_ray,
    "web": bench_web,
    "memory": bench_memory,
    "profile": bench_profile,
    "search": bench_search,
    "sessions": bench_sessions,
    "long": bench_long,
    "train": bench_train,
}


# The modes that record each round's machine themselves, and write its header and their warning into their report.
WATCH_THEIR_ROUNDS = (bench_speed, bench_train)


def cmd_bench(args: argparse.Namespace) -> None:
    """The mode's report; any other mode's under the machine header, its whole run watched as one round."""
    from aiayn.bench.conditions import Quiet, Watch, ends_with_warning, format_header, machine_header
    from aiayn.bench.engines import THREADS

    folder = ModelFolder.open(args.model)
    mode = next((MODES[flag] for flag in MODES if getattr(args, flag)), bench_speed)
    if mode in WATCH_THEIR_ROUNDS:
        print(mode(folder, args))
        return
    watch = Watch(THREADS)
    text = mode(folder, args)
    watch.round_done()
    header = format_header(machine_header(args.argv))
    print(ends_with_warning(f"{header}\n\n{text}", Quiet(THREADS, watch.rounds, 0.0).warning))


def add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="decoding speed against CTranslate2 and the tutorials' decoding; --train: training speed"
    )
    add_model_flag(p)
    add_mode_flags(p)
    p.add_argument("--beam", type=int, choices=range(1, 9), default=4, metavar="1..8", help="with --long: beam size")
    # The engine's flags: --device picks the speed table's framings (cuda: ours on the GPU against CTranslate2 there,
    # fp32 and fp16, with each engine's GPU memory); --cores, --threads-per-lane and --variant are --long's (the
    # speed table's framings fix their own, and its base-size rows measure fp32, w8, w4 and int8 side by side);
    # --variant is --profile's too.
    add_engine_flags(p, engine_help=None, device_default="cpu")
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer sentences and rounds (2 rounds of 40 sentences; the full run: 5 of 300); with --train: fewer steps",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="DIR",
        help="also run our engine from another checkout of this repository (`git worktree add DIR COMMIT`) in the "
        "same rounds: its rows marked (baseline), each held against CTranslate2 as ours are and ours against it "
        "(with --search: its search and engine's host work against ours)",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    add_data_flag(p)
    p.set_defaults(func=cmd_bench)


def add_mode_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``MODES``."""
    p.add_argument(
        "--train",
        action="store_true",
        help="training tokens/s of our step against today's and Hugging Face Marian's (same config, same batches)",
    )
    p.add_argument(
        "--long",
        action="store_true",
        help="long sentences: val captions joined in threes, BLEU with and without clause splitting "
        "against the captions translated one by one",
    )
    p.add_argument(
        "--sessions",
        type=positive_int,
        default=None,
        metavar="N",
        help="the page server's memory growth over N fresh visitor sessions (the goal: ≤ 20 MiB for 2000)",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="the page server's memory with both bundled models, when ready and over 2000 requests of the page, "
        "its heatmap and the JSON route (the goals: ≤ 300 and ≤ 350 MiB)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="`aiayn serve` under a crowd: 16, 100, 200 and 500 visitors at once through the page's API "
        "(answered/s, refused, p50/p90, server CPU per answer, RSS), and the JSON route's sentences/s against "
        "`aiayn translate --input`'s (--quick: only that)",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="`aiayn serve --ray --replicas 2` (a Ray cluster of this machine; needs the [ray] extra) against one "
        "`aiayn serve` process, taking turns: the JSON route's sentences/s for batches of 32 and for single sentences",
    )
    p.add_argument(
        "--web",
        action="store_true",
        help="the folder of `aiayn export --to web` in Chromium, each variant: what a page downloads, the first "
        "translation's time, ms per caption and lines identical to `aiayn translate --variant`'s on 200 untidy test "
        "captions, greedy and beam 4, and the 1000 test captions alone against in batches of 32; then the "
        "downloads and ms per caption at the base size with opus-mt-en-de's vocabulary (--quick: fewer)",
    )
    p.add_argument(
        "--search",
        action="store_true",
        help="the host work of a step apart from ONNX Runtime's run: the search alone on a stub step model (greedy "
        "and beam 4, 1 to 512 rows), and the serving engine's binding, selection and copies on the model and at "
        "the base size; with --baseline, the same of another checkout in the same rounds (--quick: 2 rounds, else 5)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="where the serving decoder's time goes, by op type (ONNX Runtime's profiler, one thread): greedy and "
        "beam 4, batch 1 and 32, on the model and at the paper's base size (random weights), with --variant's "
        "weights",
    )
