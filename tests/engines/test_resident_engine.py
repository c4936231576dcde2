"""The GPU's serving engine without a GPU: the CUDA serving graphs (DecoderMaskedMultiHeadAttention on a shared
cache, fp32 and fp16) and the engine that keeps its state in the device's memory, on the CPU provider.

Step by step against the contract's graphs: ``test_fused_engine.py`` (its ``engines`` fixture). Here: whole
test sets through the one search, imported checkpoints' choices, the fp16 graphs, and which engine a device gets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from aiayn.core.folder import ModelFolder
from aiayn.data.multi30k import load_parallel
from aiayn.engines import ONNX, ONNX_PORTABLE, ONNX_SERVING, TORCH
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.onnx.engine import PortableOnnxEngine
from aiayn.engines.onnx.fused import ServingOnnxEngine
from aiayn.engines.onnx.resident import ResidentServingEngine
from aiayn.engines.onnx.serving_spec import DMMHA
from aiayn.engines.onnx.sessions import gpu_unavailable
from aiayn.evaluation.metrics import score
from aiayn.export.parity import count_identical, max_log_prob_diff
from aiayn.search.translator import SearchSettings

TOLERANCE = 1e-4
FP16_TOLERANCE = 0.05  # log-probabilities of the fp16 graphs against fp32's (rounding of activations only)
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


@pytest.fixture(scope="module", params=["marian_like_folder", "marian_gelu_folder"])
def imported_like(request: pytest.FixtureRequest) -> ModelFolder:
    """The tiny folders with an imported checkpoint's choices (``tests/conftest.py``)."""
    return ModelFolder.open(request.getfixturevalue(request.param))


def imported_sources(folder: ModelFolder, n: int = 50) -> list[list[int]]:
    rng = np.random.default_rng(0)
    config = folder.config
    eos = config.special_tokens.eos
    return [[*rng.integers(2, config.vocab_size - 1, rng.integers(1, 13)).tolist(), eos] for _ in range(n)]


def test_imported_choices_against_the_contract_graphs_and_torch(imported_like: ModelFolder) -> None:
    """Every choice of an imported config (activations, positions' layout, unscaled embeddings, logits bias, the
    start token never generated): the same log-probabilities at every step and the same greedy and beam-4 outputs."""
    pytest.importorskip("torch")
    folder = imported_like
    resident = ResidentServingEngine.load(folder, "cpu")
    portable, torch_engine = load_engine(folder, ONNX_PORTABLE, "cpu", cores=1), load_engine(folder, TORCH)
    src_ids = imported_sources(folder)
    for reference in (torch_engine, portable):
        assert max_log_prob_diff(reference, resident, src_ids).max_abs_diff <= TOLERANCE
    translators = [translator_for(folder, engine) for engine in (torch_engine, portable, resident)]
    for beam in (1, 4):
        settings = SearchSettings(beam_size=beam)
        for reference in translators[:2]:
            assert count_identical(reference, translators[2], src_ids, settings) == len(src_ids)


def test_fp16_graphs_pad_the_output_projection_and_keep_the_log_probabilities(imported_like: ModelFolder) -> None:
    """The fp16 graphs (fp16 weights and activations, the projection padded to 8 columns and sliced back, the
    log-softmax in fp32) against the fp32 ones, on a vocabulary that is no multiple of 8."""
    folder = imported_like
    assert folder.config.vocab_size % 8
    fp16 = ResidentServingEngine.load(folder, "cpu", variant="fp16")
    fp32 = ResidentServingEngine.load(folder, "cpu")
    diff = max_log_prob_diff(fp32, fp16, imported_sources(folder, 20))
    assert 0 < diff.max_abs_diff <= FP16_TOLERANCE  # not zero: the graphs do run in fp16


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
