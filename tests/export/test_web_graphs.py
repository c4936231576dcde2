"""The browser folder's graphs (``aiayn/export/web_graphs.py``): each weight stored once between the two graphs, fp32
computing exactly what the folder's graphs compute, and the weight-only variants doing MatMulNBits's int8 arithmetic
with operators that onnxruntime-web runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from aiayn.core.contract import DECODER_FILE, ENCODER_FILE, VARIANT_KEY, kv_names
from aiayn.core.folder import ModelFolder
from aiayn.engines import BLOCK_VARIANTS, WEIGHTS
from aiayn.engines.onnx.block_quant import QuantizedMatMul, dequantize_matmul, quantize_matmul
from aiayn.export.web_graphs import INT8_ACTIVATIONS, quantize_weights, write_browser_graphs


def session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"])


def contract_feeds(folder: ModelFolder) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Encoder and decoder inputs: three sources of unequal length, two target tokens after three cached ones."""
    config, rng = folder.config, np.random.default_rng(0)
    src = rng.integers(4, config.vocab_size, (3, 9))
    src[:, -1], src[0, 6:] = config.special_tokens.eos, config.special_tokens.pad
    cross = rng.standard_normal((3, config.n_heads, 9, config.d_head)).astype(np.float32)
    past = rng.standard_normal((3, config.n_heads, 3, config.d_head)).astype(np.float32)
    decoder = {
        "tgt_ids": rng.integers(4, config.vocab_size, (3, 2)),
        "position_offset": np.array(3, dtype=np.int64),
        "src_mask": src != config.special_tokens.pad,
        **dict.fromkeys(kv_names(config, "cross"), cross),
        **dict.fromkeys(kv_names(config, "past"), past),
    }
    return {"src_ids": src}, decoder


def external_places(path: Path) -> dict[str, tuple[str, str]]:
    """Each external initializer of a graph file: (offset, length) in its data file."""
    model = onnx.load(str(path), load_external_data=False)
    return {
        t.name: (fields["offset"], fields["length"])
        for t in model.graph.initializer
        if t.data_location == TensorProto.EXTERNAL and (fields := {e.key: e.value for e in t.external_data})
    }


@pytest.fixture(scope="module")
def en_de(bundled: dict[str, Path]) -> ModelFolder:
    return ModelFolder.open("en-de")


def test_fp32_graphs_compute_exactly_the_folders_and_store_each_weight_once(en_de: ModelFolder, tmp_path: Path) -> None:
    encoder, decoder, weights = write_browser_graphs(en_de, "fp32", tmp_path)
    graphs = zip((ENCODER_FILE, DECODER_FILE), (encoder, decoder), contract_feeds(en_de), strict=True)
    for graph, written, feeds in graphs:
        expected = session(en_de.onnx_file(graph)).run(None, feeds)
        got = session(written).run(None, feeds)
        assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True)), graph
    places = external_places(encoder), external_places(decoder)
    embedding = "model.embedding.weight.fp16"
    assert places[0][embedding] == places[1][embedding]  # one copy, read by both sessions
    stored = {place for graph in places for place in graph.values()}
    assert weights.stat().st_size <= max(int(o) + int(n) for o, n in stored)
    folder_graphs = sum(en_de.onnx_file(g).stat().st_size for g in (ENCODER_FILE, DECODER_FILE))
    embedding_bytes = en_de.config.vocab_size * en_de.config.d_model * 2  # fp16
    assert sum(f.stat().st_size for f in (encoder, decoder, weights)) < folder_graphs - 0.9 * embedding_bytes


@pytest.mark.parametrize("variant", list(BLOCK_VARIANTS))
def test_quantized_graphs_store_the_embedding_once_for_lookups_and_the_tied_projection(
    en_de: ModelFolder, tmp_path: Path, variant: str
) -> None:
    encoder, decoder, weights = write_browser_graphs(en_de, variant, tmp_path)
    model = onnx.load(str(decoder), load_external_data=False)
    assert {e.key: e.value for e in model.metadata_props}[VARIANT_KEY] == variant
    # The blocks dequantized by standard operators (WASM's MatMulNBits ignores the accuracy level: docs/onnx.md);
    # beside them only the CPU fusions ONNX Runtime makes at export (``web_graphs.fused_for_the_browser``).
    assert all(node.domain in ("", "ai.onnx", "com.microsoft") for node in model.graph.node)
    assert not {"MatMulNBits", "GatherBlockQuantized"} & {node.op_type for node in model.graph.node}
    places = external_places(decoder)
    blocks = f"model.embedding.weight.q{WEIGHTS[variant].block.bits}"
    assert places[blocks] == external_places(encoder)[blocks]  # one copy: both lookups and the projection
    assert not any("embedding.weight.fp16" in name for name in places)
    enc_feeds, dec_feeds = contract_feeds(en_de)
    assert all(np.isfinite(out).all() for out in session(decoder).run(None, dec_feeds))
    memory = session(encoder).run(["memory"], enc_feeds)[0]
    assert not np.array_equal(memory, session(en_de.onnx_file(ENCODER_FILE)).run(["memory"], enc_feeds)[0])
    # Every weight once at ``bits`` and its block scales: about bits/16 of model.safetensors' fp16 bytes.
    assert weights.stat().st_size < (WEIGHTS[variant].block.bits / 16 + 0.1) * en_de.weights_file.stat().st_size


def one_projection(weight: np.ndarray) -> onnx.ModelProto:
    """x (batch, len, K) @ weightᵀ, as torch exports a Linear without bias; the weight is an output too."""
    n, k = weight.shape
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "len", k])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "len", n]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [n, k]),
        ],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def matmul_nbits(x: np.ndarray, quantized: QuantizedMatMul, accuracy_level: int) -> np.ndarray:
    """ONNX Runtime's own MatMulNBits of x and ``quantized`` at ``accuracy_level``."""
    names = ["b", "scales", "zero_points"][: len(quantized.constants())]
    node = helper.make_node(
        "MatMulNBits",
        ["x", *names],
        ["y"],
        domain="com.microsoft",
        **{**quantized.attributes, "accuracy_level": accuracy_level},
    )
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in zip(names, quantized.constants(), strict=True)],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return session(helper.make_model(graph, opset_imports=opsets, ir_version=8)).run(None, {"x": x})[0]


@pytest.mark.parametrize("variant", list(BLOCK_VARIANTS))
def test_the_weights_and_int8_activations_are_matmulnbits_own(variant: str) -> None:
    """The rewritten product (its weight dequantized by standard operators, its input made int8 by them, as
    onnxruntime-web runs it) has block_quant's very weight, and equals ONNX Runtime's MatMulNBits at the variant's
    accuracy level up to fp32 rounding; fp32 activations would not."""
    scheme = WEIGHTS[variant].block
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((96, 128)).astype(np.float32)
    x = (rng.standard_normal((3, 5, 128)) * rng.uniform(0.1, 5, (3, 5, 1))).astype(np.float32)
    x[0, 0, :32] = 0  # a block of zeros
    model = one_projection(weight)
    quantize_weights(model, scheme)
    browser, dequantized = session(model).run(None, {"x": x})
    quantized = quantize_matmul(weight.T, scheme)
    assert np.array_equal(dequantized, dequantize_matmul(quantized).T)
    expected = matmul_nbits(x, quantized, scheme.accuracy_level)
    scale = np.abs(expected).max()
    assert np.abs(browser - expected).max() < 1e-5 * scale
    if scheme.accuracy_level == INT8_ACTIVATIONS:
        assert np.abs(matmul_nbits(x, quantized, 0) - expected).max() > 1e-3 * scale
