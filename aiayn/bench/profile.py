"""`aiayn bench --profile`: where a decoder step of the serving engine spends its time, by op type.

ONNX Runtime's own profiler (``SessionOptions.enable_profiling``) times every node of every run of the decoder's
session; its JSON trace is summed here by op type (a fused node counts as the op it became: FusedGemm, Gemm), each
op's share of the time all nodes took, and that node time's share of the runs' (the rest: ONNX Runtime between the
nodes). One search of ``sentences`` in batches of ``batch`` at ``beam``, on one thread (its first run of each
shape, where ONNX Runtime allocates, is a few of the many runs it sums).
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.bench.run import search_name
from aiayn.core.folder import ModelFolder
from aiayn.engines import ONNX
from aiayn.engines.load import load_engine, place, translator_for
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import SearchSettings

KERNEL_TIME = "_kernel_time"  # ONNX Runtime's event for a node's compute, beside its fences


@dataclass(frozen=True)
class OpTime:
    op: str
    ms: float  # summed over every node of this type and every run
    share: float  # of all nodes' time, in %
    calls: int


@dataclass(frozen=True)
class Split:
    """One search's decoder runs, by op type (most time first)."""

    beam: int
    batch: int
    runs: int
    run_ms: float  # the runs' total
    ops: list[OpTime]

    @property
    def node_ms(self) -> float:
        return sum(op.ms for op in self.ops)


def op_split(trace: list[dict[str, Any]], beam: int = 1, batch: int = 1) -> Split:
    """ONNX Runtime's trace events (its JSON file's list) → the time of each op type."""
    ms: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    runs, run_ms = 0, 0.0
    for event in trace:
        if event.get("cat") == "Session" and event.get("name") == "model_run":
            runs, run_ms = runs + 1, run_ms + event["dur"] / 1000
        elif event.get("cat") == "Node" and event.get("name", "").endswith(KERNEL_TIME):
            op = event["args"]["op_name"]
            ms[op] += event["dur"] / 1000
            calls[op] += 1
    total = sum(ms.values()) or 1.0
    ops = [OpTime(op, t, 100 * t / total, calls[op]) for op, t in sorted(ms.items(), key=lambda item: -item[1])]
    return Split(beam, batch, runs, run_ms, ops)


def profile_decoder(
    folder: ModelFolder,
    sentences: list[str],
    beam: int,
    batch: int,
    settings: SearchSettings | None = None,
    variant: str = "fp32",
) -> Split:
    """The serving decoder's op split over one search of ``sentences``, its weights ``variant``'s."""
    settings = settings or SearchSettings(beam_size=beam)
    with tempfile.TemporaryDirectory(prefix="aiayn-profile-") as directory:
        options = EngineOptions(ONNX, "cpu", variant, lanes=1)
        placement = place(options, profile_prefix=str(Path(directory) / "decoder"))
        engine: Any = load_engine(folder, placement)
        translator = translator_for(folder, engine, max_sentences=batch)
        src_ids = [translator.source_ids(s) for s in sentences]
        translator.translate_ids(src_ids, settings)
        trace = json.loads(Path(engine.buffers.decoder.end_profiling()).read_text())
    return op_split(trace, beam, batch)


def profile_report(splits: list[Split], title: str, top: int = 10) -> str:
    """Each search's split as a table: the ``top`` op types by time, the rest summed."""
    blocks = []
    for split in splits:
        search = search_name(split.beam)
        per_run = split.run_ms / max(split.runs, 1)
        lines = [
            f"{title}, {search}, batch {split.batch}: {split.runs} decoder runs, {per_run:.3f} ms each, "
            f"{100 * split.node_ms / (split.run_ms or 1.0):.0f} % of it in the nodes",
            "",
            "| op type | % of node time | ms | nodes run |",
            "|---|---|---|---|",
        ]
        lines += [f"| {op.op} | {op.share:.1f} | {op.ms:.1f} | {op.calls} |" for op in split.ops[:top]]
        rest = split.ops[top:]
        if rest:
            lines.append(
                f"| {len(rest)} others | {sum(op.share for op in rest):.1f} | {sum(op.ms for op in rest):.1f} | "
                f"{sum(op.calls for op in rest)} |"
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def profile_sizes(folder: ModelFolder, sentences: list[str], quick: bool, variant: str = "fp32") -> str:
    """The splits of the bench's rows (greedy and beam 4, batch 1 and 32) on ``folder``'s model, then on a model of
    the paper's base size with random weights (``base_size.base_folder``; every output 24 tokens), with the weights
    of ``variant``."""
    from aiayn.bench.base_size import BASE_CONFIGS, base_folder
    from aiayn.bench.engines import CONFIGS

    alone, batched = (8, 32) if quick else (20, 64)

    def splits(model: ModelFolder, configs: tuple[tuple[int, int], ...], length: int | None) -> list[Split]:
        return [
            profile_decoder(
                model,
                sentences[: alone if batch == 1 else batched],
                beam,
                batch,
                SearchSettings(beam, min_len=length or 0, max_len=length),
                variant,
            )
            for beam, batch in configs
        ]

    weights = "" if variant == "fp32" else f", {variant}"
    own = profile_report(splits(folder, CONFIGS, None), f"{folder.path.name}{weights}")
    with tempfile.TemporaryDirectory() as tmp:
        base = base_folder(folder, Path(tmp) / "base")
        at_base = profile_report(splits(base, BASE_CONFIGS, 24), f"base size{weights}")
    return f"{own}\n\n{at_base}"
