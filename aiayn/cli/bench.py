"""`aiayn bench`: the speed table and its ratios, printed (and written as JSON with --json)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiayn.cli.args import UserError, add_data_flag, add_model_flag, add_variant_flag, positive_int


def cmd_bench(args: argparse.Namespace) -> None:
    from aiayn.core.folder import ModelFolder
    from aiayn.evaluation.evaluate import load_split_for

    folder = ModelFolder.open(args.model)
    json_path = Path(args.json) if args.json else None
    if args.serve:
        from aiayn.bench.crowd import measure_crowds, serve_report

        corpus = load_split_for(folder, "test_2016_flickr", args.data)
        print(serve_report(measure_crowds(args.model, corpus.src)))
        return
    if args.web:
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
        from aiayn.engines.options import EngineOptions
        from aiayn.serve.service import TranslationService

        test = load_split_for(folder, "test_2016_flickr", args.data).src
        plan = WEB_QUICK if args.quick else WEB_FULL
        figures = [
            measure_web(
                TranslationService(EngineOptions(device="cpu", variant=variant)).model(args.model),
                test[: plan.captions],
                variant,
                alone=test[: plan.alone],
            )
            for variant in WEB_VARIANTS
        ]
        print(web_report(figures, min(plan.alone, len(test))))
        print(f"\nWhere the first translation's time went (ms since the page opened):\n\n{parts_report(figures)}")
        print(f"\n{base_web_report(measure_web_base(folder, test[: plan.base_captions], WEB_VARIANTS))}")
        return
    if args.memory:
        from aiayn.bench.memory import measure_memory, memory_report
        from aiayn.core.folder import bundled_models
        from aiayn.serve.requests import pair_value

        served = [ModelFolder.open(path) for path in bundled_models().values()]
        sources = {pair_value(f): load_split_for(f, "test_2016_flickr", args.data).src for f in served}
        print(memory_report(measure_memory(sources)))
        return
    if args.profile:
        from aiayn.bench.profile import profile_sizes

        print(profile_sizes(folder, load_split_for(folder, "test_2016_flickr", args.data).src, args.quick))
        return
    if args.sessions:
        from aiayn.bench.sessions import measure_sessions, sessions_report

        print(sessions_report(measure_sessions(folder.path, args.sessions)))
        return
    if args.long:
        from aiayn.bench.long_sentences import long_report, measure
        from aiayn.engines.options import EngineOptions
        from aiayn.serve.service import TranslationService

        model = TranslationService(EngineOptions(variant=args.variant, lanes=args.cores)).model(args.model)
        corpus, train = load_split_for(folder, "val", args.data), load_split_for(folder, "train", args.data)
        figures = measure(model, corpus, train, args.beam)
        print(long_report(figures, f"{folder.config.src_lang}-{folder.config.tgt_lang}", "val", args.beam))
        return
    if args.train:
        from aiayn.bench.training import FULL, QUICK, run_train_bench, train_report

        corpus = load_split_for(folder, "train", args.data)
        print(train_report(run_train_bench(folder, corpus, QUICK if args.quick else FULL), json_path))
        return
    from aiayn.bench.base_size import BASE_FULL, BASE_QUICK, base_json, base_report, run_base_bench
    from aiayn.bench.base_size import FRAMINGS as BASE_FRAMINGS
    from aiayn.bench.engines import CUDA_CONFIGS, FRAMINGS, ON_CUDA, Framing, with_baseline
    from aiayn.bench.run import FULL, QUICK, report, run_bench

    if args.device == "cuda":
        from aiayn.engines.onnx.sessions import gpu_unavailable

        reason = gpu_unavailable(1)
        if reason:
            raise UserError(
                f"--device cuda: ONNX Runtime cannot run on a GPU here ({reason}); bench on a machine with one"
            )
    corpus = load_split_for(folder, "test_2016_flickr", args.data)
    plan, base_plan = (QUICK, BASE_QUICK) if args.quick else (FULL, BASE_FULL)
    if args.device == "cuda":  # a GPU's passes take milliseconds: the medians get the rounds they need
        plan, base_plan = replace(plan, rounds=max(plan.rounds, 3)), replace(base_plan, rounds=max(base_plan.rounds, 3))
    framings: tuple[Framing, ...] = (ON_CUDA,) if args.device == "cuda" else FRAMINGS
    base_framings: tuple[Framing, ...] = (ON_CUDA,) if args.device == "cuda" else BASE_FRAMINGS
    if args.baseline is not None:
        checkout = Path(args.baseline).resolve()
        if not (checkout / "aiayn" / "bench" / "worker.py").is_file():
            raise UserError(
                f"--baseline {args.baseline}: no checkout of this repository there; make one with "
                "`git worktree add DIR COMMIT`"
            )
        framings, base_framings = (tuple(with_baseline(f, checkout) for f in fs) for fs in (framings, base_framings))
    if args.device == "cuda":  # the bundled model and the base size, greedy and beam 4 up to batches of 128
        result = run_bench(folder, corpus.src, corpus.tgt, plan, framings, CUDA_CONFIGS, with_serving=False)
        base = run_base_bench(folder, corpus.src, base_plan, framings=base_framings, configs=CUDA_CONFIGS)
    else:
        result = run_bench(folder, corpus.src, corpus.tgt, plan, framings)
        base = run_base_bench(folder, corpus.src, base_plan, framings=base_framings)
    print(report(result, json_path, base_json(base)))
    print(f"\n{base_report(base)}")


def add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="decoding speed against CTranslate2 and the tutorials' decoding; --train: training speed"
    )
    add_model_flag(p)
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
        "(answered/s, refused, p50/p90, server CPU per answer, RSS), and the JSON route's sentences/s",
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
        "--profile",
        action="store_true",
        help="where the serving decoder's time goes, by op type (ONNX Runtime's profiler, one thread): greedy and "
        "beam 4, batch 1 and 32, on the model and at the paper's base size (random weights)",
    )
    p.add_argument("--beam", type=int, choices=range(1, 9), default=4, metavar="1..8", help="with --long: beam size")
    p.add_argument(
        "--cores", "--threads", dest="cores", type=int, default=None, metavar="N", help="with --long: cores to use"
    )
    add_variant_flag(p, "with --long: ")  # the base-size rows measure fp32, w8 and w4 side by side
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer sentences and rounds (2 rounds of 40 sentences; the full run: 5 of 300); with --train: fewer steps",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: every engine in both framings (1 thread each; each at its best on 2 cores); cuda: our serving "
        "engine on the GPU against CTranslate2 there, fp32 and fp16, the bundled model and the base size (with each "
        "engine's GPU memory)",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="DIR",
        help="also run our engine from another checkout of this repository (`git worktree add DIR COMMIT`) in the "
        "same rounds: its rows marked (baseline), each held against CTranslate2 as ours are and ours against it",
    )
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    add_data_flag(p)
    p.set_defaults(func=cmd_bench)
