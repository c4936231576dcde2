"""The engines the bench compares, each as one function: (sentences, beam, batch size) → output ids.

Every engine decodes the same weights: the bench's copy of the model folder
holds the ONNX graphs (fp32, int8) and a CTranslate2 export made from its
``model.safetensors``. Torch is imported only by the torch engines.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiayn.core.folder import ModelFolder
from aiayn.engines.load import translator_for
from aiayn.search.translator import SearchSettings

THREADS = 2  # intra-op threads of every engine
Translate = Callable[[list[str], int, int], list[list[int]]]  # (sentences, beam, batch size) → output ids

# "onnx": the serving graphs built from the weights (``engines/onnx/fused.py``), what `aiayn serve` runs on a CPU;
# "onnx portable": the contract's graphs (decoder.onnx with the TopK head), the reference for other runtimes.
ENGINES = (
    "tutorial (torch, no cache)",
    "torch + KV cache",
    "onnx portable fp32",
    "onnx fp32",
    "onnx int8",
    "ctranslate2 fp32",
    "ctranslate2 int8",
)
# Ours against a peer: the ratios the bench reports (throughput, ours / peer).
COMPARISONS = (
    ("onnx fp32", "ctranslate2 fp32"),
    ("onnx int8", "ctranslate2 int8"),
    ("onnx portable fp32", "ctranslate2 fp32"),
    ("onnx fp32", "tutorial (torch, no cache)"),
)


def prepare(folder: ModelFolder, workdir: Path) -> ModelFolder:
    """A copy of the model folder with every export the engines need: the contract's ONNX graphs, CTranslate2.
    (The fast engine builds its graphs from the weights when it loads.)"""
    from aiayn.export.ctranslate2 import export_ctranslate2
    from aiayn.export.onnx_export import export_onnx
    from aiayn.model.weights import load_model

    shutil.copytree(folder.path, workdir, dirs_exist_ok=True)
    copy = ModelFolder.open(workdir)
    model = load_model(copy)
    export_onnx(model, copy, ("fp32",))
    export_ctranslate2(model, copy.tokenizer, copy.path)
    return copy


def step_translate(engine: Any, folder: ModelFolder) -> Translate:
    """An engine of ours through the one search, batched as the bench asks."""

    def run(sentences: list[str], beam: int, batch: int) -> list[list[int]]:
        translator = translator_for(folder, engine, max_sentences=batch, max_tokens=10**9)
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
        results = translator.translate_batch(
            ctranslate2_sources(tokenizer, sentences),
            beam_size=beam,
            max_batch_size=batch,
            length_penalty=0.6,
            max_decoding_length=256,
        )
        return [[vocab[t] for t in r.hypotheses[0]] for r in results]

    return run


def make_engine(name: str, folder: ModelFolder) -> Translate:
    """The engine ``name`` (one of ``ENGINES``) on the bench's folder."""
    if name not in ENGINES:
        raise ValueError(f"unknown bench engine {name!r}; choose one of {', '.join(ENGINES)}")
    if name.startswith("ctranslate2"):
        return ctranslate2_translate(folder, "float32" if name.endswith("fp32") else "int8")
    if name.startswith("onnx portable"):
        from aiayn.engines.onnx.engine import OnnxEngine

        return step_translate(OnnxEngine.load(folder, "cpu", name.split()[-1], threads=THREADS), folder)
    if name.startswith("onnx"):
        from aiayn.engines.onnx.fused import FusedOnnxEngine

        return step_translate(FusedOnnxEngine.load(folder, THREADS, int8=name.endswith("int8")), folder)
    import torch

    from aiayn.engines.no_cache import NoCacheEngine
    from aiayn.engines.pytorch import TorchEngine
    from aiayn.model.weights import load_model

    torch.set_num_threads(THREADS)
    model = load_model(folder)
    return step_translate(NoCacheEngine(model) if name.startswith("tutorial") else TorchEngine(model), folder)
