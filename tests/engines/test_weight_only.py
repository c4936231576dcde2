"""The quantized variants of the CPU engine end to end (the weight-only w8, w4: ``engines.BLOCK_VARIANTS``; int8,
activations per row): they translate close to fp32, and a sentence's translation never depends on the sentences
batched with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiayn.core.folder import ModelFolder
from aiayn.data.multi30k import load_parallel
from aiayn.engines import BLOCK_VARIANTS, ONNX, WEIGHTS
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.onnx.serving.engine import ServingEngine
from aiayn.engines.onnx.serving.host_buffers import HostBuffers
from aiayn.engines.onnx.serving.kernel_rows import instruction_set, row_multiple
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import SearchSettings, Translator

QUANTIZED = (*BLOCK_VARIANTS, "int8")


@pytest.fixture(scope="module", params=QUANTIZED)
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def folder(bundled: dict[str, Path]) -> ModelFolder:
    return ModelFolder.open(bundled["en-de"])


@pytest.fixture(scope="module")
def engine(folder: ModelFolder, variant: str) -> ServingEngine[Any]:
    engine = load_engine(folder, EngineOptions(ONNX, "cpu", variant, lanes=1))
    assert isinstance(engine, ServingEngine) and isinstance(engine.buffers, HostBuffers)
    return engine


def alone_and_in_batches(
    engine: ServingEngine[Any], folder: ModelFolder, src_ids: list[list[int]], beam: int, batch: int = 32
):
    """Each source searched on its own, and all of them in batches of up to ``batch`` (the translator's grouping)."""
    settings = SearchSettings(beam_size=beam)
    alone = Translator(engine, folder.tokenizer, folder.config.max_len, max_sentences=1)
    together = Translator(engine, folder.tokenizer, folder.config.max_len, max_sentences=batch)
    return [alone.outputs([s], settings)[0] for s in src_ids], together.outputs(src_ids, settings)


@pytest.mark.parametrize("beam", [1, 3, 4])
def test_batch_mates_change_no_bit_of_a_translation(
    engine: ServingEngine[Any], folder: ModelFolder, variant: str, beam: int
) -> None:
    """Sources of one odd length (so that no batch pads them, and an odd batch runs an odd number of tokens): the
    very same outputs and log-probabilities, bit for bit, alone as in batches of 32 and of 5 (odd: 13 sentences
    make 13, and 5 + 5 + 3), while sentences leave a batch one by one (the spare rows of ``host_buffers.py``)."""
    where = f"{variant} on {instruction_set()}, rows padded to a multiple of {engine.buffers.row_multiple}"
    block = WEIGHTS[variant].block
    assert block is None or row_multiple(block) is not None, f"no padding makes the kernel row-independent: {where}"
    rng = np.random.default_rng(beam)
    eos = folder.config.special_tokens.eos
    src_ids = [[*rng.integers(4, folder.config.vocab_size, 6).tolist(), eos] for _ in range(13)]
    for batch in (32, 5):
        alone, together = alone_and_in_batches(engine, folder, src_ids, beam, batch)
        assert [o.tokens for o in alone] == [o.tokens for o in together], where
        assert [o.log_prob for o in alone] == [o.log_prob for o in together], where


def test_batch_mates_change_no_translation(engine: ServingEngine[Any], folder: ModelFolder, multi30k_dir: Path) -> None:
    """Real sentences of every length, greedy and beam 4: the same translation alone as in batches of 32 (the
    log-probabilities may differ in their last bits, where attention sums over a padded source; fp32 alike)."""
    corpus = load_parallel("test_2016_flickr", folder.config.src_lang, folder.config.tgt_lang, multi30k_dir)
    translator = translator_for(folder, engine)
    src_ids = [translator.source_ids(s) for s in corpus.src[:100]]
    for beam in (1, 4):
        alone, together = alone_and_in_batches(engine, folder, src_ids, beam)
        assert [o.tokens for o in alone] == [o.tokens for o in together]


def test_weight_only_translations_stay_close_to_fp32(
    engine: ServingEngine[Any], folder: ModelFolder, variant: str, multi30k_dir: Path
) -> None:
    """Not exact, so judged by agreement with fp32 on real sentences (BLEU: docs/speed.md)."""
    corpus = load_parallel("test_2016_flickr", folder.config.src_lang, folder.config.tgt_lang, multi30k_dir)
    fp32 = translator_for(folder, load_engine(folder, EngineOptions(ONNX, "cpu", lanes=1)))
    quantized = translator_for(folder, engine)
    src_ids = [fp32.source_ids(s) for s in corpus.src[:100]]
    settings = SearchSettings(beam_size=4)
    ours, reference = quantized.translate_ids(src_ids, settings), fp32.translate_ids(src_ids, settings)
    agree = sum(a == b for a, b in zip(ours, reference, strict=True))
    assert agree >= {"w8": 85, "w4": 50, "int8": 90}[variant]


@pytest.mark.parametrize("name", ["marian_like_folder", "marian_gelu_folder"])
def test_weight_only_variants_build_with_an_imported_checkpoints_choices(
    request: pytest.FixtureRequest, name: str
) -> None:
    """The activations, the unscaled embeddings and the logits bias of an imported checkpoint, in every variant."""
    folder = ModelFolder.open(request.getfixturevalue(name))
    eos = folder.config.special_tokens.eos
    src_ids = [[5, 9, 11, eos], [7, eos]]
    for variant in QUANTIZED:
        translator = translator_for(folder, load_engine(folder, EngineOptions(ONNX, "cpu", variant, lanes=1)))
        outputs = translator.translate_ids(src_ids, SearchSettings(beam_size=4))
        assert len(outputs) == 2 and not any(folder.config.special_tokens.pad in ids for ids in outputs)


@pytest.mark.parametrize(
    ("engine_name", "device", "message"),
    [("torch", "cpu", "runs fp32 only"), ("onnx-portable", "cpu", "onnx engine on a CPU"), (ONNX, "cuda", "CPU")],
)
def test_a_weight_only_variant_elsewhere_says_where_it_runs(
    folder: ModelFolder, engine_name: str, device: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_engine(folder, EngineOptions(engine_name, device, "w8"))
