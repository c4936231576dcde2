"""`aiayn bench`'s rows at the paper's base size (Table 3: 6 + 6 layers, d_model 512, d_ff 2048, 8 heads), the
size of every OPUS-MT checkpoint too, measured without a trained model.

The bench folder's tokenizer over a ``--preset base`` model with seeded random weights; every output is decoded
to one fixed length (our search's ``min_len`` = ``max_len``, CTranslate2's ``min_decoding_length`` =
``max_decoding_length``), so every engine does the same work whatever a random model would say. Beside tokens/s,
each engine's resident memory once loaded, the peak the loading took, and its peak over the whole run. The
engines take turns round by round in processes of their own, as in the bundled model's rows (``run.py``).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiayn.bench.conditions import Round, Watch
from aiayn.bench.engines import THREADS, Framing, Setup
from aiayn.bench.run import (
    Appended,
    Measured,
    Ratio,
    format_ratios,
    measure_rounds,
    ratios,
    search_name,
    setups_of,
)
from aiayn.core.config import PRESETS, ModelConfig
from aiayn.core.folder import ModelFolder
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.engines import ONNX

OURS, PEER = f"{ONNX} fp32", "ctranslate2 fp32"
W8, W4, PEER_INT8 = f"{ONNX} w8", f"{ONNX} w4", "ctranslate2 int8"  # the weight-only variants; CTranslate2's int8
INT8 = f"{ONNX} int8"  # int8 weights and activations per row, as CTranslate2's int8
# One batch of 32 on two cores is what a lone `aiayn translate` of a file's first page, or the JSON route, asks.
BASE_CONFIGS = ((1, 1), (1, 32), (4, 32))  # (beam, batch)
FRAMINGS = (
    Framing(
        "base size, 1 thread each",
        (Setup(OURS), Setup(W8), Setup(W4), Setup(INT8), Setup(PEER), Setup(PEER_INT8)),
        (
            (f"{OURS} 1×1", (f"{PEER} 1×1",)),
            (f"{W8} 1×1", (f"{OURS} 1×1",)),
            (f"{W4} 1×1", (f"{OURS} 1×1",)),
            (f"{W4} 1×1", (f"{W8} 1×1",)),
            (f"{W8} 1×1", (f"{PEER_INT8} 1×1",)),
            (f"{INT8} 1×1", (f"{PEER_INT8} 1×1",)),
        ),
    ),
    Framing(
        "base size, 2 cores on one batch",
        tuple(Setup(name, lanes=THREADS) for name in (OURS, W8, W4, INT8, PEER, PEER_INT8))
        + tuple(Setup(name, threads=THREADS) for name in (PEER, PEER_INT8)),
        (
            (f"{OURS} {THREADS}×1", (f"{PEER} {THREADS}×1", f"{PEER} 1×{THREADS}")),
            (f"{W8} {THREADS}×1", (f"{OURS} {THREADS}×1",)),
            (f"{W4} {THREADS}×1", (f"{OURS} {THREADS}×1",)),
            (f"{INT8} {THREADS}×1", (f"{PEER_INT8} {THREADS}×1", f"{PEER_INT8} 1×{THREADS}")),
        ),
    ),
)
SEED = 0


@dataclass(frozen=True)
class BasePlan:
    rounds: int
    length: int  # every output's tokens
    sentences: int  # at batch 1; a batch of 32 is one batch
    batch_sentences: int = 32


BASE_FULL = BasePlan(rounds=3, length=32, sentences=6)
BASE_QUICK = BasePlan(rounds=1, length=24, sentences=3)


@dataclass(frozen=True)
class BaseRow:
    engine: str
    search: str
    batch: int
    tokens_per_s: float  # median over the rounds


@dataclass(frozen=True)
class Footprint:
    """An engine's resident memory in MiB: once loaded, the peak the loading took, the peak over the run."""

    engine: str
    loaded_mb: float
    load_peak_mb: float
    peak_mb: float
    gpu_mb: float  # on a GPU: the most it held there over the run; else 0


@dataclass(frozen=True)
class BaseResult:
    config: ModelConfig
    plan: BasePlan
    rows: list[BaseRow]
    ratios: list[Ratio]
    footprints: list[Footprint]
    framings: tuple[Framing, ...]
    watched: list[Round] = field(default_factory=list)  # each round's load and the bench's share of the CPU


def base_folder(folder: ModelFolder, path: Path, preset: ModelConfig = PRESETS["base"]) -> ModelFolder:
    """A model folder of ``preset``'s size (Table 3's vocabulary of 37 000 included) with seeded random weights
    (as initialised for training), exported for CTranslate2. Its tokenizer is ``folder``'s, with placeholder
    tokens added up to the preset's vocabulary: sources tokenize as they would for ``folder``'s model."""
    import torch
    from tokenizers import AddedToken, Tokenizer

    from aiayn.export.ctranslate2 import export_ctranslate2
    from aiayn.model.transformer import Transformer
    from aiayn.model.weights import save_weights

    own = folder.config
    tokenizer = Tokenizer.from_str(folder.tokenizer.tokenizer.to_str())
    placeholders = range(tokenizer.get_vocab_size(), preset.vocab_size)
    tokenizer.add_tokens([AddedToken(f"<base-size-{i}>", normalized=False) for i in placeholders])
    config = preset.replace(
        vocab_size=tokenizer.get_vocab_size(),
        special_tokens=own.special_tokens,
        never_generate=own.never_generate,
        src_lang=own.src_lang,
        tgt_lang=own.tgt_lang,
    )
    base = ModelFolder.create(path, config, SubwordTokenizer(tokenizer))
    torch.manual_seed(SEED)
    model = Transformer(config).eval()
    save_weights(model, base)
    export_ctranslate2(model, base.tokenizer, base.path)
    return base


def run_base_bench(
    folder: ModelFolder,
    src: list[str],
    plan: BasePlan = BASE_FULL,
    preset: ModelConfig = PRESETS["base"],
    framings: tuple[Framing, ...] = FRAMINGS,
    configs: tuple[tuple[int, int], ...] = BASE_CONFIGS,
    watch: Watch | None = None,
) -> BaseResult:
    """Our engines and CTranslate2 on a base-size random model, outputs of ``plan.length`` tokens each; ``watch``
    records each round's machine (by default the real one's, on the bench's ``THREADS`` cores)."""
    watch = Watch(THREADS) if watch is None else watch

    def request(name: str, beam: int, batch: int) -> dict[str, Any] | None:
        if batch == 1 and " 1×1" not in name:
            return None  # two cores on a single sentence: not a use of two cores anyone makes
        n = plan.sentences if batch == 1 else max(plan.batch_sentences, batch)
        return {"sentences": src[:n], "beam": beam, "batch": batch, "length": plan.length}

    setups = setups_of(framings)
    with tempfile.TemporaryDirectory() as tmp:
        base = base_folder(folder, Path(tmp) / "base", preset)
        measured, ready = measure_rounds(base.path, setups, plan.rounds, configs, request, watch)
    check_lengths(measured, plan.length)
    rows = [
        BaseRow(name, search_name(beam), batch, statistics.median(r["tokens"] / r["seconds"] for r in runs))
        for (name, beam, batch), runs in measured.items()
    ]
    footprints = [
        Footprint(
            s.label,
            ready[s.label]["loaded_mb"],
            ready[s.label]["load_peak_mb"],
            max(run["peak_rss_mb"] for (name, _, _), runs in measured.items() if name == s.label for run in runs),
            max(run["gpu_mb"] for (name, _, _), runs in measured.items() if name == s.label for run in runs),
        )
        for s in setups
    ]
    return BaseResult(
        base.config, plan, rows, ratios(measured, framings, configs), footprints, framings, watch.rounds
    )


def check_lengths(measured: Measured, length: int) -> None:
    """Every engine must have decoded exactly ``length`` tokens per output, or the throughputs do not compare."""
    for (name, beam, batch), runs in measured.items():
        lengths = {len(output) for run in runs for output in run["outputs"]}
        if lengths != {length}:
            raise RuntimeError(f"{name}, {search_name(beam)}, batch {batch}: output lengths {lengths}, not {length}")


def memory_ratios(footprints: list[Footprint], framings: tuple[Framing, ...]) -> list[str]:
    """Each comparison of each framing: the row against its peer (the peer's setup with the least memory there)."""
    by_label = {f.engine: f for f in footprints}
    lines = []
    for framing in framings:
        for ours_label, peer_labels in framing.comparisons:
            ours = by_label[ours_label]
            peer = min((by_label[p] for p in peer_labels), key=lambda f: f.loaded_mb)
            lines.append(
                f"- {framing.name}: {ours.engine} / {peer.engine}: loaded {ours.loaded_mb / peer.loaded_mb:.2f}×, "
                f"peak while loading {ours.load_peak_mb / peer.load_peak_mb:.2f}×, "
                f"peak over the run {ours.peak_mb / peer.peak_mb:.2f}×"
                + (f", GPU {ours.gpu_mb / peer.gpu_mb:.2f}×" if peer.gpu_mb else "")
            )
    return lines


def base_report(result: BaseResult) -> str:
    c, plan = result.config, result.plan
    size = (
        f"{c.n_encoder_layers}+{c.n_decoder_layers} layers, d_model {c.d_model}, d_ff {c.d_ff}, {c.n_heads} heads, "
        f"vocabulary {c.vocab_size}"
    )
    table = ["| engine, lanes×threads | search | batch | tokens/s |", "|---|---|---|---|"]
    table += [f"| {r.engine} | {r.search} | {r.batch} | {r.tokens_per_s:.0f} |" for r in result.rows]
    memory = ["| engine, lanes×threads | RSS loaded MiB | peak while loading MiB | peak over the run MiB | GPU MiB |"]
    memory += ["|---|---|---|---|---|"]
    memory += [
        f"| {f.engine} | {f.loaded_mb:.0f} | {f.load_peak_mb:.0f} | {f.peak_mb:.0f} | {f.gpu_mb:.0f} |"
        for f in result.footprints
    ]
    return (
        f"Base size ({size}; random weights, every output {plan.length} tokens; {plan.rounds} interleaved rounds):\n"
        + "\n".join(table)
        + "\n\nThroughput ratios (tokens/s, row / its peer; median and range over the rounds):\n"
        + format_ratios(result.ratios)
        + "\n\nResident memory:\n"
        + "\n".join(memory)
        + "\n\nMemory ratios (row / its peer):\n"
        + "\n".join(memory_ratios(result.footprints, result.framings))
    )


def base_json(result: BaseResult) -> dict[str, Any]:
    return {
        "config": result.config.to_dict(),
        "plan": asdict(result.plan),
        "rows": [asdict(r) for r in result.rows],
        "ratios": [asdict(r) for r in result.ratios],
        "memory": [asdict(f) for f in result.footprints],
    }


def base_appended(result: BaseResult) -> Appended:
    """The base-size rows as the speed table's report appends them (``run.report``)."""
    return Appended(base_report(result), base_json(result), result.watched, result.ratios)
