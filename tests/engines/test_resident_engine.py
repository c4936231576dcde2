"""The GPU's serving engine without a GPU: the CUDA serving graphs (DecoderMaskedMultiHeadAttention on a shared
cache, fp32 and fp16) and the engine that keeps its state in the device's memory, on the CPU provider.

Step by step, on imported checkpoints' choices and in fp16 against fp32: ``test_fused_engine.py`` (parametrized over
both serving engines). Here: whole test sets through the one search, and which engine a device gets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.core.folder import ModelFolder
from aiayn.data.multi30k import load_parallel
from aiayn.engines import ONNX, ONNX_SERVING
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.onnx.engine import PortableOnnxEngine
from aiayn.engines.onnx.fused import ServingOnnxEngine
from aiayn.engines.onnx.resident import ResidentServingEngine
from aiayn.engines.onnx.serving_spec import DMMHA
from aiayn.engines.onnx.sessions import gpu_unavailable
from aiayn.evaluation.metrics import score
from aiayn.search.translator import SearchSettings

FP16_BLEU_MARGIN = 0.2


@pytest.mark.parametrize("name", ["en-de", "de-en"])
def test_all_test_sentences_translate_as_with_the_contract_graphs(
    bundled: dict[str, Path], multi30k_dir: Path, name: str
) -> None:
    """All 1000 of test_2016_flickr, greedy and beam 4, in the batches the translator makes: the same ids."""
    folder = ModelFolder.open(bundled[name])
    corpus = load_parallel("test_2016_flickr", folder.config.src_lang, folder.config.tgt_lang, multi30k_dir)
    portable = translator_for(folder, PortableOnnxEngine.load(folder, "cpu", threads=1))
    resident = translator_for(folder, ResidentServingEngine.load(folder, "cpu"))
    assert resident.engine.ops.self_attention == DMMHA  # type: ignore[attr-defined]
    src_ids = [portable.source_ids(s) for s in corpus.src]
    for beam in (1, 4):
        settings = SearchSettings.of(folder, beam_size=beam)
        assert resident.translate_ids(src_ids, settings) == portable.translate_ids(src_ids, settings)


def test_fp16_graphs_score_within_0_2_bleu(bundled: dict[str, Path], multi30k_dir: Path) -> None:
    """The fp16 graphs that a GPU runs, here on the CPU provider: greedy BLEU on all of test_2016_flickr within 0.2
    of the fp32 serving graphs' (tests/cuda asks the same of them on CUDA, at beam 1 and 4)."""
    folder = ModelFolder.open(bundled["en-de"])
    corpus = load_parallel("test_2016_flickr", "en", "de", multi30k_dir)
    settings = SearchSettings.of(folder, beam_size=1)
    bleu = {}
    for variant in ("fp32", "fp16"):
        translator = translator_for(folder, ResidentServingEngine.load(folder, "cpu", variant=variant))
        bleu[variant] = score(translator.translate(corpus.src, settings), corpus.tgt).bleu
    assert abs(bleu["fp16"] - bleu["fp32"]) <= FP16_BLEU_MARGIN, bleu


def test_each_device_gets_its_serving_engine(bundled: dict[str, Path]) -> None:
    """onnx is the serving engine on both devices; a variant with no serving graphs on a device runs the exported
    graphs with `onnx`, and is refused with `onnx-serving`, saying what to use."""
    folder = ModelFolder.open(bundled["en-de"])
    assert isinstance(load_engine(folder, ONNX, "cpu", "fp32", cores=1), ServingOnnxEngine)
    assert isinstance(load_engine(folder, ONNX, "cpu", "w8", cores=1), ServingOnnxEngine)
    with pytest.raises(ValueError, match="runs fp32, w8, w4, int8 on a CPU and fp32, fp16 on a GPU.*onnx-portable"):
        load_engine(folder, ONNX_SERVING, "cpu", "fp16", cores=1)
    with pytest.raises(ValueError, match="--variant w8 is built .* on a CPU"):
        load_engine(folder, ONNX, "cuda", "w8", cores=1)
    reason = gpu_unavailable(1)
    if not reason:
        pytest.skip("ONNX Runtime runs on a GPU here: tests/cuda covers it")
    with pytest.raises(ValueError, match="--device cuda: ONNX Runtime cannot run .* on a GPU here"):
        load_engine(folder, ONNX_SERVING, "cuda", "fp16", cores=1)
