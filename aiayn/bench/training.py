"""`aiayn bench --train`: training tokens/s of our step against today's and Hugging Face Marian's.

Every variant (``training_worker.VARIANTS``) trains the model folder's architecture from scratch on the
same real batches: the first batches of epoch 0 that the trainer itself would draw from Multi30k (prepared
with the folder's tokenizer, 4096 tokens a batch, seed 1). Each variant lives in a process of its own with
the same number of threads; they take turns round by round, a different one first each round, so that the
shared machine's slow moments fall on all of them. Tokens/s are medians over the rounds with their range;
a ratio is taken within each round, then summarised the same way. Timings are reported, never asserted.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.bench.conditions import Quiet, Watch, ends_with_warning, format_header, machine_header, spread
from aiayn.bench.engines import THREADS
from aiayn.bench.process import Worker
from aiayn.bench.training_worker import VARIANTS
from aiayn.core.folder import ModelFolder
from aiayn.data.batching import plan_batches
from aiayn.data.multi30k import ParallelCorpus
from aiayn.data.prepare import PrepareSettings, prepare

MAX_TOKENS = 4096  # the trainer's default batch
TODAY = "today fp32"
# (ours, peer): equal precision against Marian, and each of ours against today's step.
COMPARISONS = (
    ("ours fp32", "marian fp32"),
    ("ours bf16", "marian bf16"),
    ("ours fp32", TODAY),
    ("ours bf16", TODAY),
)


@dataclass(frozen=True)
class TrainPlan:
    rounds: int
    warmup: int  # untimed steps, once per variant
    steps: int  # timed steps a round


FULL = TrainPlan(rounds=5, warmup=3, steps=10)
QUICK = TrainPlan(rounds=3, warmup=1, steps=3)


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_batches(folder: ModelFolder, corpus: ParallelCorpus, count: int, path: Path) -> Path:
    """The trainer's first ``count`` batches of epoch 0, padded, saved for the workers (arrays src_i, tgt_in_i, ...)."""
    # The validation split is not used here; one pair keeps ``prepare`` whole.
    settings = PrepareSettings(folder.tokenizer.vocab_size, folder.config.special_tokens, folder.config.max_len)
    data = prepare(path.parent / "prepared", corpus, corpus.head(1), settings, folder.tokenizer)
    plan = plan_batches(*data.train.lengths(), MAX_TOKENS, seed=1, epoch=0)
    arrays: dict[str, np.ndarray] = {}
    for i in range(min(count, len(plan))):
        batch = data.train.padded(plan[i], folder.config.special_tokens)
        arrays |= {f"src_{i}": batch.src_ids, f"tgt_in_{i}": batch.tgt_in, f"tgt_out_{i}": batch.tgt_out}
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def run_train_bench(
    folder: ModelFolder,
    corpus: ParallelCorpus,
    plan: TrainPlan = FULL,
    variants: tuple[str, ...] = VARIANTS,
    watch: Watch | None = None,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """Tokens/s of each variant per round, their medians and ranges, and the ratios; as one JSON-ready dict, with
    the machine (``argv``: the command's words after `aiayn`, by default this process's) and how alone each round
    was (``watch``: by default the real machine's, on ``THREADS`` cores)."""
    watch = Watch(THREADS) if watch is None else watch
    per_round: list[dict[str, float]] = [{} for _ in range(plan.rounds)]
    unavailable: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        batches = write_batches(folder, corpus, plan.warmup + plan.steps, Path(tmp) / "batches.npz")
        env = {"OMP_NUM_THREADS": str(THREADS)}
        started = [
            Worker(v, "aiayn.bench.training_worker", v, str(folder.path), str(batches), env=env) for v in variants
        ]
        workers = []
        for worker in started:
            if worker.ready.get("ready"):
                workers.append(worker)
            else:
                unavailable[worker.name] = worker.ready.get("reason", "")
        try:
            watch.start()
            for r in range(plan.rounds):
                for i in range(len(workers)):
                    worker = workers[(i + r) % len(workers)]  # a different variant first each round
                    run = worker.ask({"warmup": plan.warmup, "steps": plan.steps})
                    per_round[r][worker.name] = run["tokens"] / run["seconds"]
                    per_round[r][f"{worker.name} peak_rss_mb"] = run["peak_rss_mb"]
                watch.round_done()
        finally:
            for worker in started:
                worker.close()
    result = summarize(per_round, [w.name for w in workers], unavailable, plan)
    ratios = ((s["median"], s["min"], s["max"]) for s in result["ratio"].values())
    conditions = Quiet(THREADS, watch.rounds, spread(ratios)).to_json()
    return {**result, "machine": machine_header(argv), "conditions": conditions}


def summarize(
    per_round: list[dict[str, float]], measured: list[str], unavailable: dict[str, str], plan: TrainPlan
) -> dict[str, Any]:
    tokens_per_s = {v: stats([r[v] for r in per_round]) for v in measured}
    ratio = {
        f"{ours} / {peer}": stats([r[ours] / r[peer] for r in per_round])
        for ours, peer in COMPARISONS
        if ours in measured and peer in measured
    }
    ours = [v for v in measured if v.startswith("ours")]
    if ours and TODAY in measured:
        best = max(ours, key=lambda v: tokens_per_s[v]["median"])
        ratio[f"best ({best}) / {TODAY}"] = stats([r[best] / r[TODAY] for r in per_round])
    return {
        "what": "training tokens/s (real target tokens): forward, label-smoothed loss, backward, Adam",
        "threads": THREADS,  # intra-op threads per variant
        "plan": {"rounds": plan.rounds, "warmup": plan.warmup, "steps": plan.steps, "max_tokens": MAX_TOKENS},
        "tokens_per_s": tokens_per_s,
        "marian": {v: s for v, s in tokens_per_s.items() if v.startswith("marian")},
        "ratio": ratio,
        "peak_rss_mb": {v: max(r[f"{v} peak_rss_mb"] for r in per_round) for v in measured},
        "unavailable": unavailable,
        "per_round": [{v: r[v] for v in measured} for r in per_round],
    }


def train_report(result: dict[str, Any], json_path: Path | None) -> str:
    lines = ["| variant | tokens/s (median) | min | max | peak RSS MB |", "|---|---|---|---|---|"]
    for variant, s in result["tokens_per_s"].items():
        rss = result["peak_rss_mb"][variant]
        lines.append(f"| {variant} | {s['median']:.0f} | {s['min']:.0f} | {s['max']:.0f} | {rss:.0f} |")
    plan = result["plan"]
    lines.append(
        f"\nRatios (tokens/s, per round; median and range over {plan['rounds']} interleaved rounds of "
        f"{plan['steps']} steps):"
    )
    lines += [
        f"- {name}: {s['median']:.2f}× (range {s['min']:.2f}–{s['max']:.2f})" for name, s in result["ratio"].items()
    ]
    lines += [f"- {variant}: not measured ({reason})" for variant, reason in result["unavailable"].items()]
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    header = f"{format_header(result['machine'])}; {result['threads']} intra-op threads per variant"
    return ends_with_warning(f"{header}\n\n" + "\n".join(lines), result["conditions"]["warning"])
