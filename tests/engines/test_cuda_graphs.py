"""The GPU's serving engine without a GPU: the CUDA serving graphs (DecoderMaskedMultiHeadAttention on a shared
cache, fp32 and fp16) and the engine that keeps its state in the device's memory, on the CPU provider.

Step by step, on imported checkpoints' choices and in fp16 against fp32: ``test_serving_engine.py`` (parametrized over
both serving engines). Here: whole test sets through the one search, and which engine a device gets.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiayn.core.folder import ModelFolder
from aiayn.data.multi30k import load_parallel
from aiayn.engines import ONNX, ONNX_SERVING
from aiayn.engines.load import load_engine, serving_checked, translator_for
from aiayn.engines.onnx import key_layout, serving
from aiayn.engines.onnx.device_buffers import DeviceBuffers
from aiayn.engines.onnx.engine import PortableOnnxEngine
from aiayn.engines.onnx.host_buffers import HostBuffers
from aiayn.engines.onnx.serving import ServingEngine, unservable
from aiayn.engines.onnx.serving_spec import DMMHA
from aiayn.engines.onnx.sessions import gpu_unavailable
from aiayn.engines.options import EngineOptions
from aiayn.evaluation.metrics import score
from aiayn.search.translator import SearchSettings

FP16_BLEU_MARGIN = 0.2
WRONG = "decoder_layers.0.self_attn.w_v.weight"  # a weight the self-check must notice


@pytest.mark.parametrize("name", ["en-de", "de-en"])
def test_all_test_sentences_translate_as_with_the_contract_graphs(
    bundled: dict[str, Path], multi30k_dir: Path, name: str
) -> None:
    """All 1000 of test_2016_flickr, greedy and beam 4, in the batches the translator makes: the same ids."""
    folder = ModelFolder.open(bundled[name])
    corpus = load_parallel("test_2016_flickr", folder.config.src_lang, folder.config.tgt_lang, multi30k_dir)
    portable = translator_for(folder, PortableOnnxEngine.load(folder, "cpu", threads=1))
    cuda_graphs = translator_for(folder, ServingEngine.load(folder, graphs_for="cuda"))
    assert cuda_graphs.engine.ops.self_attention == DMMHA  # type: ignore[attr-defined]
    src_ids = [portable.source_ids(s) for s in corpus.src]
    for beam in (1, 4):
        settings = SearchSettings.of(folder, beam_size=beam)
        assert cuda_graphs.translate_ids(src_ids, settings) == portable.translate_ids(src_ids, settings)


def test_fp16_graphs_score_within_0_2_bleu(bundled: dict[str, Path], multi30k_dir: Path) -> None:
    """The fp16 graphs that a GPU runs, here on the CPU provider: greedy BLEU on all of test_2016_flickr within 0.2
    of the fp32 serving graphs' (tests/cuda asks the same of them on CUDA, at beam 1 and 4)."""
    folder = ModelFolder.open(bundled["en-de"])
    corpus = load_parallel("test_2016_flickr", "en", "de", multi30k_dir)
    settings = SearchSettings.of(folder, beam_size=1)
    bleu = {}
    for variant in ("fp32", "fp16"):
        translator = translator_for(folder, ServingEngine.load(folder, variant=variant, graphs_for="cuda"))
        bleu[variant] = score(translator.translate(corpus.src, settings), corpus.tgt).bleu
    assert abs(bleu["fp16"] - bleu["fp32"]) <= FP16_BLEU_MARGIN, bleu


def test_each_device_gets_its_serving_engine(bundled: dict[str, Path]) -> None:
    """onnx is the serving engine on both devices; a variant with no serving graphs on a device runs the exported
    graphs with `onnx`, and is refused with `onnx-serving`, saying what to use."""
    folder = ModelFolder.open(bundled["en-de"])
    for variant in ("fp32", "w8"):
        engine = load_engine(folder, EngineOptions(ONNX, "cpu", variant, lanes=1))
        assert isinstance(engine, ServingEngine) and isinstance(engine.buffers, HostBuffers)
    with pytest.raises(ValueError, match="runs fp32, w8, w4, int8 on a CPU and fp32, fp16 on a GPU.*onnx-portable"):
        load_engine(folder, EngineOptions(ONNX_SERVING, "cpu", "fp16", lanes=1))
    with pytest.raises(ValueError, match="--variant w8 is built .* on a CPU"):
        load_engine(folder, EngineOptions(ONNX, "cuda", "w8", lanes=1))
    reason = gpu_unavailable(1)
    if not reason:
        pytest.skip("ONNX Runtime runs on a GPU here: tests/cuda covers it")
    with pytest.raises(ValueError, match="--device cuda: ONNX Runtime cannot run .* on a GPU here"):
        load_engine(folder, EngineOptions(ONNX_SERVING, "cuda", "fp16", lanes=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_key_layout_is_the_cuda_kernels(dtype: type) -> None:
    """Against a NumPy model of DecoderMaskedMultiHeadAttention's CUDA key layout: key (row, head, position, i) sits
    at [row, head, i // x, position, i % x], x = 16 bytes of the dtype; values stay plain."""
    rng = np.random.default_rng(0)
    rows, heads, capacity, d_head = 3, 2, 5, 32
    cache = rng.standard_normal((4, rows, heads, capacity, d_head)).astype(dtype)  # 2 layers: keys at 0 and 2
    x = key_layout.key_chunk("cuda", np.dtype(dtype), d_head)
    assert x == 16 // np.dtype(dtype).itemsize
    kernel = key_layout.in_kernel_layout(cache, x)
    r, h, t, i = 2, 1, 3, 13
    flat = kernel[2, r, h].reshape(-1)  # layer 1's keys of one row and head, as the kernel reads the bytes
    assert flat[(i // x) * capacity * x + t * x + i % x] == cache[2, r, h, t, i]
    np.testing.assert_array_equal(kernel[1::2], cache[1::2])
    np.testing.assert_array_equal(key_layout.plain(kernel, x), cache)
    assert key_layout.key_chunk("cpu", np.dtype(dtype), d_head) == d_head  # one chunk: the CPU's plain layout
    np.testing.assert_array_equal(key_layout.in_kernel_layout(cache, d_head), cache)


def test_a_head_size_the_cuda_kernel_lacks_is_named(bundled: dict[str, Path]) -> None:
    config = ModelFolder.open(bundled["en-de"]).config
    assert unservable(config, "cuda") == "" and unservable(config, "cpu") == ""
    odd = dataclasses.replace(config, d_model=80, n_heads=2)  # head size 40
    assert unservable(odd, "cuda") == "its head size 40 is none of the CUDA attention kernel's (32, 64, 128)"
    assert unservable(odd, "cpu") == ""


def test_the_serving_engine_checks_itself_and_a_broken_one_never_serves(
    bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check at load: the true graphs pass it and serve; graphs built from a wrong weight fail it, and the
    exported graphs serve instead, with one line saying why."""
    folder = ModelFolder.open(bundled["en-de"])
    for variant in ("fp32", "fp16"):
        engine = serving_checked(folder, "cpu", variant, 1)
        assert isinstance(engine, ServingEngine) and isinstance(engine.buffers, DeviceBuffers)
    build = serving.build_serving_graphs

    def broken(config: Any, weights: dict[str, np.ndarray], *args: Any) -> Any:
        ops = args[-1]  # the CUDA graphs get a wrong weight; the CPU's, the reference, stay true
        wrong = dict(weights, **{WRONG: weights[WRONG] * 1.5}) if ops.device == "cuda" else weights
        return build(config, wrong, *args)

    monkeypatch.setattr(serving, "build_serving_graphs", broken)
    engine = serving_checked(folder, "cpu", "fp32", 1)
    assert isinstance(engine, PortableOnnxEngine)
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1 and "differ from the CPU serving graphs' by up to" in message[0], message
