"""The int8 variant's arithmetic against ONNX Runtime: one product built by the serving graphs' builder computes the
very integers NumPy does, row by row (so alone and batched alike), bias included; and the probe that picks the
weights' levels tells a saturating kernel from an exact one."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from aiayn.core.contract import GraphSpec, TensorSpec
from aiayn.engines.onnx import row_int8
from aiayn.engines.onnx.external_data import ExternalData
from aiayn.engines.onnx.row_int8 import (
    ACTIVATION_ZERO_POINT,
    FULL_LEVELS,
    NARROW_LEVELS,
    quantize_columns,
    quantize_rows,
)
from aiayn.engines.onnx.serving import int8_kernel
from aiayn.engines.onnx.serving.graph_builder import GraphBuilder

K, N = 256, 130  # N not a multiple of the kernels' column tiles


@pytest.mark.parametrize("levels", [FULL_LEVELS, NARROW_LEVELS])
def test_columns_keep_their_largest_value_and_the_bound(levels: int) -> None:
    rng = np.random.default_rng(0)
    matrix = rng.normal(0, 0.1, (K, N)).astype(np.float32)
    matrix[:, 3] = 0  # a column of zeros comes back as zeros
    quantized = quantize_columns(matrix, levels)
    assert quantized.codes.dtype == np.int8 and np.abs(quantized.codes).max() == levels
    assert np.array_equal(quantized.dequantized()[:, 3], matrix[:, 3])
    error = np.abs(quantized.dequantized() - matrix).max(axis=0)
    assert np.all(error <= quantized.scales / 2 * (1 + 1e-6))


def product_session(tmp_path: Path, w: np.ndarray, bias: np.ndarray | None, levels: int) -> ort.InferenceSession:
    """x (rows, K) @ ``w`` (+ ``bias``) as the serving graphs build it in int8."""
    external = ExternalData(tmp_path / "weights.bin")
    g = GraphBuilder({}, external, int8_levels=levels)
    y = g.matmul("x", w, "product", "" if bias is None else g.const("bias", bias))
    g.nodes.append(helper.make_node("Identity", [y], ["y"]))
    x_spec, y_spec = TensorSpec("x", "float32", ("rows", K), ""), TensorSpec("y", "float32", ("rows", N), "")
    graph = g.model(GraphSpec("product", (x_spec,), (y_spec,)))
    external.close()
    (tmp_path / "product.onnx").write_bytes(graph)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(tmp_path / "product.onnx"), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("with_bias", [False, True])
def test_a_product_is_its_rows_integers_scaled_alone_and_batched(tmp_path: Path, with_bias: bool) -> None:
    """The int32 sums of the row's codes and the column's, times the column's scale, then the row's (+ bias): the
    same bits for a row alone, among 1 to 9 rows, or in a batch of 40 where one row holds an outlier; with the
    levels the engine takes on this CPU (``int8_kernel.weight_levels``)."""
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.05, (K, N)).astype(np.float32)
    bias = rng.normal(0, 1, N).astype(np.float32) if with_bias else None
    levels = int8_kernel.weight_levels()
    session = product_session(tmp_path, w, bias, levels)
    x = rng.normal(0, 1, (40, K)).astype(np.float32)
    x[7] *= 50
    x[11] = 0  # a row of zeros: its products are exactly the bias
    codes, scales = quantize_rows(x)
    quantized = quantize_columns(w, levels)
    sums = (codes.astype(np.int32) - ACTIVATION_ZERO_POINT) @ quantized.codes.astype(np.int32)
    expected = sums.astype(np.float32) * quantized.scales * scales + (0 if bias is None else bias)
    together = session.run(None, {"x": x})[0]
    assert np.array_equal(together, expected.astype(np.float32))
    for start, count in ((0, 1), (7, 1), (3, 2), (5, 9), (31, 9)):
        alone = session.run(None, {"x": x[start : start + count]})[0]
        assert np.array_equal(alone, together[start : start + count])
    close = np.abs(together - (x @ w + (0 if bias is None else bias))).max() / np.abs(x @ w).max()
    assert close < 0.02


def saturating_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A kernel without VNNI: u8·s8 products added in pairs along K into int16, saturating (``vpmaddubsw``)."""
    products = a.astype(np.int32)[:, :, None] * b.astype(np.int32)[None, :, :]  # (rows, K, N)
    pairs = np.clip(products[:, 0::2] + products[:, 1::2], -32768, 32767).sum(axis=1)
    zero_point_term = ACTIVATION_ZERO_POINT * b.astype(np.int32).sum(axis=0)
    return (pairs - zero_point_term).astype(np.float32)


def test_the_weights_levels_follow_whether_the_kernel_saturates(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's kernel answers the probe one way or the other; a saturating one gets the narrow levels, with
    which even the extreme codes sum exactly in int16 pairs."""
    assert int8_kernel.weight_levels() in (FULL_LEVELS, NARROW_LEVELS)
    int8_kernel.weight_levels.cache_clear()
    monkeypatch.setattr(int8_kernel, "integer_product", saturating_product)
    try:
        assert int8_kernel.weight_levels() == NARROW_LEVELS
    finally:
        int8_kernel.weight_levels.cache_clear()
    a = np.full((2, 64), 255, np.uint8)
    b = np.full((64, 4), NARROW_LEVELS, np.int8)
    b[:, 1] = -NARROW_LEVELS
    exact = (a.astype(np.int64) - ACTIVATION_ZERO_POINT) @ b.astype(np.int64)
    assert np.array_equal(saturating_product(a, b), exact.astype(np.float32))


def test_rows_of_the_graph_and_of_numpy_agree() -> None:
    """``quantize_rows`` (the tests' reference) codes round half to even around 128, as QuantizeLinear does."""
    x = np.array([[1.0, -0.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    codes, scales = quantize_rows(x)
    assert codes[0].tolist() == [255, 64, 160, 128] and codes[1].tolist() == [128] * 4
    assert scales[0, 0] == np.float32(1.0) / np.float32(row_int8.ACTIVATION_LEVELS)
