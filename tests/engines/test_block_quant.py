"""Block quantization against ONNX Runtime: one-node graphs of ``MatMulNBits`` and ``GatherBlockQuantized`` give
what NumPy computes from the dequantized weights, for every variant and for both zero-point layouts."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from aiayn.core.contract import IR_VERSION, OPSET
from aiayn.engines import BLOCK_VARIANTS, WEIGHTS
from aiayn.engines.onnx import block_quant
from aiayn.engines.onnx.block_quant import (
    BlockScheme,
    dequantize_gather,
    dequantize_matmul,
    quantize_gather,
    quantize_matmul,
)
from aiayn.engines.onnx.serving import kernel_rows
from aiayn.engines.onnx.serving.kernel_rows import instruction_set, matmul_session, padded, row_multiple

MS_DOMAIN = "com.microsoft"
SCHEMES = {
    **{variant: WEIGHTS[variant].block for variant in BLOCK_VARIANTS},
    "8-bit asymmetric": BlockScheme(bits=8, block_size=32, symmetric=False, accuracy_level=0),
    "4-bit symmetric": BlockScheme(bits=4, block_size=64, symmetric=True, accuracy_level=0),
    "4-bit fp32 compute": BlockScheme(bits=4, block_size=16, symmetric=False, accuracy_level=0),
    "4-bit asymmetric": BlockScheme(bits=4, block_size=32, symmetric=False, accuracy_level=4),
}


def run_one_node(op_type: str, inputs: dict[str, np.ndarray], constants: list[np.ndarray], **attrs) -> np.ndarray:
    """One ``com.microsoft`` node over ``inputs`` (fed) then ``constants`` (initializers) → its output."""
    names = [f"c{i}" for i in range(len(constants))]
    fed = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()
    ]
    if op_type == "GatherBlockQuantized":  # data first, then the indices, then scales and zero points
        node_inputs = [names[0], *inputs, *names[1:]]
    else:
        node_inputs = [*inputs, *names]
    node = helper.make_node(op_type, node_inputs, ["y"], domain=MS_DOMAIN, **attrs)
    graph = helper.make_graph(
        [node],
        "one",
        fed,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(c, n) for c, n in zip(constants, names, strict=True)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = IR_VERSION
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


@pytest.mark.parametrize("name", SCHEMES)
def test_matmul_nbits_computes_with_the_dequantized_weight(name):
    scheme = SCHEMES[name]
    rng = np.random.default_rng(0)
    k, n = 200, 48  # K not a whole number of blocks: the last block is padded
    weight = rng.normal(0, 0.05, (k, n)).astype(np.float32)
    weight[:, 3] = 0  # a column of zeros comes back as zeros
    quantized = quantize_matmul(weight, scheme)
    assert quantized.packed.shape == (n, -(-k // scheme.block_size), scheme.block_size * scheme.bits // 8)
    restored = dequantize_matmul(quantized)
    step = np.abs(weight).max() / (1 << (scheme.bits - 1))
    assert restored.shape == weight.shape and np.abs(restored - weight).max() <= step
    assert not restored[:, 3].any()

    x = rng.normal(0, 1, (5, k)).astype(np.float32)
    y = run_one_node("MatMulNBits", {"x": x}, quantized.constants(), **quantized.attributes)
    expected = x @ restored
    if scheme.accuracy_level == 4:  # the activations are int8 per row and block: close, not equal
        assert np.abs(y - expected).max() < 0.02 * np.abs(expected).max()
    else:
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", BLOCK_VARIANTS)
def test_a_row_of_matmul_nbits_never_depends_on_the_other_rows(name):
    """int8 compute quantizes each row's activations on their own, so a row's result is the same bits in any batch
    whose rows are a multiple of this machine's row tile (``kernel_rows.row_multiple``, which the engine pads every
    batch to): slices of 1 to 16 rows, from even and odd rows, against the same rows inside a batch of 64."""
    scheme = WEIGHTS[name].block
    where = f"ONNX Runtime {ort.__version__} on {instruction_set()}"
    multiple = row_multiple(scheme)
    assert multiple is not None, f"no row padding makes {name}'s MatMulNBits kernel row-independent, {where}"
    rng = np.random.default_rng(1)
    k, n = 512, 256
    session = matmul_session(quantize_matmul(rng.normal(0, 0.05, (k, n)).astype(np.float32), scheme))
    x = rng.normal(0, 1, (64, k)).astype(np.float32)
    together = session.run(None, {"x": x})[0]
    for m in range(1, 17):
        for start in (0, 7, 64 - m):
            alone = session.run(None, {"x": padded(x[start : start + m], multiple)})[0][:m]
            message = f"{m} rows from row {start}, padded to a multiple of {multiple}, {where}"
            np.testing.assert_array_equal(alone, together[start : start + m], err_msg=message)


def test_the_row_probe_names_the_instruction_set_and_warns_where_no_padding_helps(tmp_path, monkeypatch, capsys):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx_vnni\n")
    assert instruction_set(cpuinfo) == "AVX-VNNI"
    cpuinfo.write_text("flags\t\t: avx2 fma avx512f avx512bw avx512dq avx512vl avx_vnni\n")
    assert instruction_set(cpuinfo) == "AVX-512"
    assert instruction_set(tmp_path / "none") == "an unknown instruction set (no /proc/cpuinfo)"
    assert kernel_rows.rows_for(None) == 1 and not capsys.readouterr().err
    monkeypatch.setattr(kernel_rows, "row_multiple", lambda scheme, threads: None)
    assert kernel_rows.rows_for(WEIGHTS["w4"].block) == 1
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and "4-bit MatMulNBits kernel on this CPU" in warning


@pytest.mark.parametrize("name", SCHEMES)
def test_gather_block_quantized_returns_the_dequantized_rows(name):
    scheme = SCHEMES[name]
    rng = np.random.default_rng(2)
    table = rng.normal(0, 1, (50, 128)).astype(np.float32)
    quantized = quantize_gather(table, scheme)
    restored = dequantize_gather(quantized)
    step = np.abs(table).max() / (1 << (scheme.bits - 1))
    assert np.abs(restored - table).max() <= step
    ids = np.array([[3, 0, 49], [7, 7, 1]], np.int64)
    rows = run_one_node("GatherBlockQuantized", {"ids": ids}, quantized.constants(), **quantized.attributes)
    np.testing.assert_allclose(rows, restored[ids], rtol=1e-6, atol=1e-6)


def test_a_table_must_be_whole_blocks_and_a_scheme_sound():
    with pytest.raises(ValueError, match="whole number"):
        quantize_gather(np.zeros((4, 40), np.float32), WEIGHTS["w8"].block)
    with pytest.raises(ValueError, match="power of two"):
        BlockScheme(bits=8, block_size=48, symmetric=True, accuracy_level=4)
    with pytest.raises(ValueError, match="4 or 8 bits"):
        BlockScheme(bits=3, block_size=32, symmetric=True, accuracy_level=4)


def test_quantizing_in_chunks_of_rows_changes_nothing(monkeypatch):
    table = np.random.default_rng(3).normal(0, 1, (50, 256)).astype(np.float32)
    whole = quantize_gather(table, WEIGHTS["w4"].block)
    monkeypatch.setattr(block_quant, "CHUNK_ROWS", 7)
    chunked = quantize_gather(table, WEIGHTS["w4"].block)
    for a, b in zip(whole.constants(), chunked.constants(), strict=True):
        np.testing.assert_array_equal(a, b)
