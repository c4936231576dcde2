"""`aiayn bench`: decoding speed of every engine on the same weights, sentences and threads, in one run.

Engines: the tutorials' way (PyTorch eager, the whole prefix re-decoded at
every step, no cache), our PyTorch engine with the KV cache, our ONNX Runtime
engine (fp32, int8) and CTranslate2 (fp32, int8) on our `--to ctranslate2`
export. Each at greedy and beam 4, batch 1 and 32; warm-up excluded; medians.
"""

from __future__ import annotations

import json
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.core.folder import ModelFolder
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.evaluation.metrics import score

THREADS = 2
Translate = Callable[[list[str], int, int], list[list[int]]]  # (sentences, beam, batch size) → output ids


@dataclass(frozen=True)
class Row:
    engine: str
    search: str
    batch: int
    sentences: int
    sentences_per_s: float
    tokens_per_s: float
    p50_ms: float | None
    p90_ms: float | None
    peak_rss_mb: float
    bleu: float


def step_translate(engine: Any, folder: ModelFolder) -> Translate:
    from aiayn.search.translator import SearchSettings

    def run(sentences: list[str], beam: int, batch: int) -> list[list[int]]:
        translator = folder.translator(engine, max_sentences=batch, max_tokens=10**9)
        return translator.translate_ids([translator.source_ids(s) for s in sentences], SearchSettings(beam))

    return run


def ctranslate2_translate(folder: ModelFolder, compute_type: str) -> Translate:
    import ctranslate2

    from aiayn.export.ctranslate2 import ctranslate2_sources

    translator = ctranslate2.Translator(
        str(folder.ctranslate2_dir), device="cpu", compute_type=compute_type, intra_threads=THREADS, inter_threads=1
    )
    tokenizer = folder.tokenizer
    vocab = tokenizer.tokenizer.get_vocab()

    def run(sentences: list[str], beam: int, batch: int) -> list[list[int]]:
        sources = ctranslate2_sources(tokenizer, sentences)
        results = translator.translate_batch(
            sources, beam_size=beam, max_batch_size=batch, length_penalty=0.6, max_decoding_length=256
        )
        return [[vocab[t] for t in r.hypotheses[0]] for r in results]

    return run


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss it does not carry over across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(
    name: str,
    translate: Translate,
    sentences: list[str],
    refs: list[str],
    tokenizer: SubwordTokenizer,
    beam: int,
    batch: int,
    repetitions: int,
) -> Row:
    translate(sentences[: min(4, len(sentences))], beam, batch)  # warm-up
    timings, per_sentence = [], []
    for _ in range(repetitions):
        if batch == 1:
            started, outputs = time.perf_counter(), []
            for sentence in sentences:
                one = time.perf_counter()
                outputs += translate([sentence], beam, 1)
                per_sentence.append(time.perf_counter() - one)
        else:
            started = time.perf_counter()
            outputs = translate(sentences, beam, batch)
        timings.append(time.perf_counter() - started)
    seconds = statistics.median(timings)
    tokens = sum(len(o) + 1 for o in outputs)
    latencies = np.array(per_sentence) * 1000 if per_sentence else None
    return Row(
        engine=name,
        search="greedy" if beam == 1 else f"beam {beam}",
        batch=batch,
        sentences=len(sentences),
        sentences_per_s=len(sentences) / seconds,
        tokens_per_s=tokens / seconds,
        p50_ms=float(np.percentile(latencies, 50)) if latencies is not None else None,
        p90_ms=float(np.percentile(latencies, 90)) if latencies is not None else None,
        peak_rss_mb=peak_rss_mb(),
        bleu=score([tokenizer.decode(o) for o in outputs], refs[: len(outputs)]).bleu,
    )


ENGINES = (
    "tutorial (torch, no cache)",
    "torch + KV cache",
    "onnx fp32",
    "onnx int8",
    "ctranslate2 fp32",
    "ctranslate2 int8",
)


def prepare(folder: ModelFolder, workdir: Path) -> None:
    """One copy of the model folder with every export the engines need: ONNX fp32 and int8, CTranslate2."""
    from aiayn.export.ctranslate2 import export_ctranslate2
    from aiayn.export.onnx_export import export_onnx
    from aiayn.model.weights import load_model

    shutil.copytree(folder.path, workdir, dirs_exist_ok=True)
    copy = ModelFolder.open(workdir)
    model = load_model(copy)
    export_onnx(model, copy, ("fp32", "int8"))
    export_ctranslate2(model, copy.tokenizer, copy.path)


def make_engine(name: str, folder: ModelFolder) -> Translate:
    """The engine ``name``; torch is imported only by the torch engines."""
    if name.startswith("ctranslate2"):
        return ctranslate2_translate(folder, "float32" if name.endswith("fp32") else "int8")
    if name.startswith("onnx"):
        from aiayn.engines.onnx.engine import OnnxEngine

        return step_translate(OnnxEngine.load(folder, "cpu", name.split()[-1], threads=THREADS), folder)
    import torch

    from aiayn.engines.no_cache import NoCacheEngine
    from aiayn.engines.pytorch import TorchEngine
    from aiayn.model.weights import load_model

    torch.set_num_threads(THREADS)
    model = load_model(folder)
    return step_translate(NoCacheEngine(model) if name.startswith("tutorial") else TorchEngine(model), folder)


def measure_engine(name: str, workdir: Path, src: list[str], refs: list[str], quick: bool) -> list[Row]:
    count, tutorial_count, repetitions = (60, 20, 1) if quick else (300, 60, 3)
    folder = ModelFolder.open(workdir)
    tokenizer = folder.tokenizer
    translate = make_engine(name, folder)
    n = tutorial_count if name.startswith("tutorial") else count
    return [
        measure(name, translate, src[:n], refs, tokenizer, beam, batch, repetitions)
        for beam in (1, 4)
        for batch in (1, 32)
    ]


def run_bench(folder: ModelFolder, src: list[str], refs: list[str], quick: bool) -> list[Row]:
    """Each engine in a process of its own: runtimes that share a process (torch's and CTranslate2's
    OpenMP thread pools) slow each other down, CTranslate2 by more than ten times here."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "model"
        prepare(folder, workdir)
        sentences = Path(tmp) / "sentences.json"
        sentences.write_text(json.dumps({"src": src, "refs": refs}), encoding="utf-8")
        for name in ENGINES:
            command = [sys.executable, "-m", "aiayn.bench.run", str(workdir), name, str(sentences)]
            result = subprocess.run([*command, *(["--quick"] if quick else [])], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"bench of {name} failed:\n{result.stderr[-2000:]}")
            rows += [Row(**row) for row in json.loads(result.stdout.splitlines()[-1])]
    return rows


def format_table(rows: list[Row]) -> str:
    lines = [
        "| engine | search | batch | sentences | sent/s | tokens/s | p50 ms | p90 ms | peak RSS MB | BLEU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p50 = f"{r.p50_ms:.1f}" if r.p50_ms is not None else "–"
        p90 = f"{r.p90_ms:.1f}" if r.p90_ms is not None else "–"
        lines.append(
            f"| {r.engine} | {r.search} | {r.batch} | {r.sentences} | {r.sentences_per_s:.1f} | {r.tokens_per_s:.0f} "
            f"| {p50} | {p90} | {r.peak_rss_mb:.0f} | {r.bleu:.2f} |"
        )
    return "\n".join(lines)


def ratios(rows: list[Row]) -> dict[str, float]:
    """Our ONNX engine against CTranslate2 and against the tutorials' way, throughput ratios."""
    speed = {(r.engine, r.search, r.batch): r.tokens_per_s for r in rows}
    out = {}
    for search in ("greedy", "beam 4"):
        for batch in (1, 32):
            for ours, peer in (
                ("onnx fp32", "ctranslate2 fp32"),
                ("onnx int8", "ctranslate2 int8"),
                ("onnx fp32", "tutorial (torch, no cache)"),
            ):
                if (ours, search, batch) in speed and (peer, search, batch) in speed:
                    out[f"{ours} / {peer}, {search}, batch {batch}"] = (
                        speed[ours, search, batch] / speed[peer, search, batch]
                    )
    return out


def report(rows: list[Row], json_path: Path | None) -> str:
    table = format_table(rows)
    ratio_lines = "\n".join(f"- {name}: {value:.2f}×" for name, value in ratios(rows).items())
    machine = f"{platform.processor() or platform.machine()}, {THREADS} intra-op threads per engine"
    if json_path is not None:
        json_path.write_text(
            json.dumps({"machine": machine, "rows": [asdict(r) for r in rows], "ratios": ratios(rows)}, indent=2)
        )
    return f"{table}\n\nThroughput ratios (target tokens/s; medians):\n{ratio_lines}\n\nMachine: {machine}"


def main() -> None:
    """One engine's measurements, as a JSON line (``run_bench`` starts one process per engine)."""
    workdir, name, sentences = Path(sys.argv[1]), sys.argv[2], json.loads(Path(sys.argv[3]).read_text())
    rows = measure_engine(name, workdir, sentences["src"], sentences["refs"], "--quick" in sys.argv)
    print(json.dumps([asdict(r) for r in rows]))


if __name__ == "__main__":
    main()
