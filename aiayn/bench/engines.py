"""The engines the bench compares, each as two functions: sentences → sources as the engine takes them (its own
tokenization, never timed), and (sources, beam, batch size, length) → output ids (timed).

Every engine decodes the same weights: the bench's copy of the model folder
holds the ONNX graphs (fp32) and a CTranslate2 export made from its
``model.safetensors``. Torch is imported only by the torch engines.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aiayn.core.folder import ModelFolder
from aiayn.engines import ONNX, ONNX_PORTABLE, TORCH
from aiayn.engines.load import load_engine
from aiayn.engines.options import EngineOptions
from aiayn.search.step import StepModel
from aiayn.search.translator import SearchSettings, Translator

THREADS = 2  # the cores the bench compares on: the two-core framing's budget, the training bench's threads
NO_CACHE = "torch-no-cache"  # the tutorials' decoding: no KV cache, the whole prefix again at every step

# Our engines by their one name (``aiayn.engines.ENGINES``, what --engine takes and the logs show) and variant:
# "onnx" the serving graphs built from the weights, what `aiayn serve` runs on a CPU; "onnx-portable" the
# contract's graphs (decoder.onnx with the TopK head), the reference for other runtimes; "torch" with its KV cache.
ENGINES = (
    NO_CACHE,
    TORCH,
    f"{ONNX_PORTABLE} fp32",
    f"{ONNX} fp32",
    f"{ONNX} int8",
    f"{ONNX} w8",  # the weight-only blocks (CPU)
    f"{ONNX} w4",
    f"{ONNX} fp16",  # on a GPU: the serving graphs in fp16
    "ctranslate2 fp32",
    "ctranslate2 int8",
    "ctranslate2 fp16",
)
COMPUTE_TYPES = {"fp32": "float32", "int8": "int8", "fp16": "float16"}  # CTranslate2's names


@dataclass(frozen=True)
class BenchEngine:
    """One engine as the worker times it: ``prepare`` before the clock starts, ``translate`` under it."""

    prepare: Callable[[list[str]], list[Any]]  # sentences → each one's source (ids or tokens)
    translate: Callable[[list[Any], int, int, int | None], list[list[int]]]  # (sources, beam, batch, length) → ids


@dataclass(frozen=True)
class Setup:
    """An engine and how it uses the cores: ``lanes`` batches at once (ours: lanes over one session;
    CTranslate2: ``inter_threads``), each with ``threads`` intra-op threads."""

    engine: str
    lanes: int = 1
    threads: int = 1
    device: str = "cpu"
    checkout: str = ""  # another checkout of this repository whose aiayn the worker runs (``with_baseline``)

    @property
    def options(self) -> EngineOptions:
        """Ours (``engine`` an --engine name and a variant) as a command's flags would ask for it."""
        engine, _, variant = self.engine.partition(" ")
        return EngineOptions(engine, self.device, variant or "fp32", self.lanes, self.threads)

    @property
    def label(self) -> str:
        where = " cuda" if self.device == "cuda" else ""
        return f"{self.engine} {self.lanes}×{self.threads}{where}" + (" (baseline)" if self.checkout else "")


@dataclass(frozen=True)
class Framing:
    """Setups compared with each other: ``ours`` against the best of ``peers`` in each configuration."""

    name: str
    setups: tuple[Setup, ...]
    comparisons: tuple[tuple[str, tuple[str, ...]], ...]  # (our label, the peer labels it is held against)


ONE_THREAD = Framing(
    "1 thread each",
    (Setup(f"{ONNX} fp32"), Setup(f"{ONNX} int8"), Setup("ctranslate2 fp32"), Setup("ctranslate2 int8")),
    ((f"{ONNX} fp32 1×1", ("ctranslate2 fp32 1×1",)), (f"{ONNX} int8 1×1", ("ctranslate2 int8 1×1",))),
)
# Each engine at its best use of two cores: ours in lanes of one thread (a second intra-op thread gains little
# on ops this small); CTranslate2 both ways, workers or threads, and the better of the two is the peer.
TWO_CORES = Framing(
    "2 cores, each at its best",
    (
        Setup(f"{ONNX} fp32", lanes=THREADS),
        Setup(f"{ONNX} int8", lanes=THREADS),
        Setup("ctranslate2 fp32", lanes=THREADS),
        Setup("ctranslate2 fp32", threads=THREADS),
        Setup("ctranslate2 int8", lanes=THREADS),
        Setup("ctranslate2 int8", threads=THREADS),
        Setup(f"{ONNX_PORTABLE} fp32", lanes=THREADS),
        Setup(TORCH, threads=THREADS),
        Setup(NO_CACHE, threads=THREADS),
    ),
    (
        (f"{ONNX} fp32 2×1", ("ctranslate2 fp32 2×1", "ctranslate2 fp32 1×2")),
        (f"{ONNX} int8 2×1", ("ctranslate2 int8 2×1", "ctranslate2 int8 1×2")),
        (f"{ONNX_PORTABLE} fp32 2×1", ("ctranslate2 fp32 2×1", "ctranslate2 fp32 1×2")),
        (f"{ONNX} fp32 2×1", (f"{NO_CACHE} 1×2",)),
    ),
)
FRAMINGS = (ONE_THREAD, TWO_CORES)


def with_baseline(framing: Framing, checkout: Path) -> Framing:
    """``framing`` with each of our setups held against a peer measured a second time from ``checkout`` (another
    checkout of this repository: `aiayn bench --baseline DIR`), in the same rounds: its twin against the same
    peers, and ours against the twin, so that a change's effect reads off one run."""
    ours = {s.label: s for s in framing.setups if s.engine.startswith(f"{ONNX} ")}
    twins: dict[str, Setup] = {}
    comparisons = list(framing.comparisons)
    for label, peers in framing.comparisons:
        if label in ours and not any(peer in ours for peer in peers):  # against another runtime, not our variants
            twin = twins.setdefault(label, replace(ours[label], checkout=str(checkout)))
            comparisons += [(twin.label, peers), (label, (twin.label,))]
    return Framing(framing.name, framing.setups + tuple(twins.values()), tuple(dict.fromkeys(comparisons)))


CONFIGS = ((1, 1), (1, 32), (4, 1), (4, 32))  # (beam, batch)


def device_framing(device: str, variants: tuple[str, ...] = ("fp32", "fp16")) -> Framing:
    """Ours against CTranslate2 on one ``device``, each of ``variants``, one stream each (``--device cuda``: ours is
    the serving engine with its state on the GPU, ``engines/onnx/serving/``)."""
    setups = tuple(Setup(f"{engine} {v}", device=device) for v in variants for engine in (ONNX, "ctranslate2"))
    label = {setup.engine: setup.label for setup in setups}
    return Framing(
        device.upper(),
        setups,
        tuple((label[f"{ONNX} {v}"], (label[f"ctranslate2 {v}"],)) for v in variants),
    )


ON_CUDA = device_framing("cuda")  # `aiayn bench --device cuda`
CUDA_CONFIGS = ((1, 1), (1, 32), (1, 128), (4, 32), (4, 128))  # a GPU is for large batches too


def prepare(folder: ModelFolder, workdir: Path, variants: tuple[str, ...] = ("fp32",)) -> ModelFolder:
    """A copy of the model folder with every export the engines need: the contract's ONNX graphs (``variants``),
    CTranslate2. (The fast CPU engine builds its graphs from the weights when it loads.)"""
    from aiayn.export.ctranslate2 import export_ctranslate2
    from aiayn.export.onnx_export import export_onnx
    from aiayn.model.weights import load_model

    shutil.copytree(folder.path, workdir, dirs_exist_ok=True)
    copy = ModelFolder.open(workdir)
    model = load_model(copy)
    export_onnx(model, copy, variants)
    export_ctranslate2(model, copy.tokenizer, copy.path, overwrite=True)  # the bench's own copy
    return copy


def step_translate(engine: StepModel[Any], folder: ModelFolder, lanes: int) -> BenchEngine:
    """An engine of ours through the one search, batched as the bench asks, ``lanes`` batches at once."""
    translators: dict[int, Translator] = {}

    def translator(batch: int) -> Translator:
        if batch not in translators:
            translators[batch] = Translator(engine, folder.tokenizer, folder.config.max_len, batch, 10**9, lanes)
        return translators[batch]

    def run(sources: list[list[int]], beam: int, batch: int, length: int | None) -> list[list[int]]:
        return translator(batch).translate_ids(sources, SearchSettings(beam, min_len=length or 0, max_len=length))

    return BenchEngine(lambda sentences: [translator(1).source_ids(s) for s in sentences], run)


def ctranslate2_translate(folder: ModelFolder, compute_type: str, setup: Setup) -> BenchEngine:
    import ctranslate2

    from aiayn.export.ctranslate2 import ctranslate2_sources, suppressed

    translator = ctranslate2.Translator(
        str(folder.ctranslate2_dir),
        device=setup.device,
        compute_type=compute_type,
        intra_threads=setup.threads,
        inter_threads=setup.lanes,
    )
    tokenizer = folder.tokenizer
    vocab = tokenizer.tokenizer.get_vocab()
    never = suppressed(folder.config, tokenizer)

    def run(sources: list[list[str]], beam: int, batch: int, length: int | None) -> list[list[int]]:
        results = translator.translate_batch(
            sources,
            beam_size=beam,
            max_batch_size=batch,
            length_penalty=0.6,
            min_decoding_length=length or 0,
            max_decoding_length=length or 256,
            suppress_sequences=never,
        )
        return [[vocab[t] for t in r.hypotheses[0]] for r in results]

    return BenchEngine(lambda sentences: ctranslate2_sources(tokenizer, sentences), run)


def make_engine(setup: Setup, folder: ModelFolder) -> BenchEngine:
    """The engine of ``setup`` (its name one of ``ENGINES``) on the bench's folder."""
    name = setup.engine
    if name not in ENGINES:
        raise ValueError(f"unknown bench engine {name!r}; choose one of {', '.join(ENGINES)}")
    if name.startswith("ctranslate2"):
        return ctranslate2_translate(folder, COMPUTE_TYPES[name.split()[-1]], setup)
    if name in (NO_CACHE, TORCH):
        import torch

        torch.set_num_threads(setup.threads)
    if name == NO_CACHE:
        from aiayn.engines.no_cache import NoCacheEngine
        from aiayn.model.weights import load_model

        return step_translate(NoCacheEngine(load_model(folder)), folder, 1)
    loaded = load_engine(folder, setup.options)
    return step_translate(loaded, folder, loaded.lanes)
