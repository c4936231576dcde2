"""How many levels the int8 variant's weights may take on this machine: whether its u8·s8 kernel saturates.

MLAS runs ``MatMulIntegerToFloat`` (u8 activations, s8 weights) on AMX, AVX-512 VNNI or AVX-VNNI where the CPU has
them: ``vpdpbusd`` sums four u8·s8 products straight into int32, exactly. Without VNNI (AVX2, AVX-512 without VNNI)
it multiplies with ``vpmaddubsw``, which adds two products into an int16 and saturates: 255 · 127 · 2 = 64 770
does not fit. The saturation would still depend on nothing but the row and the column (the pairs are fixed by the
packing, whatever the batch), but it would cost accuracy where it strikes. So the engine asks this CPU, by running
the op once on the extreme codes: where the sums come back exact, the weights take ``row_int8.FULL_LEVELS`` a side;
where they do not, ``row_int8.NARROW_LEVELS``, with which no pair can leave int16 (255 · 64 · 2 = 32 640).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from aiayn.core.contract import IR_VERSION, OPSET
from aiayn.engines.onnx.row_int8 import ACTIVATION_ZERO_POINT, FULL_LEVELS, NARROW_LEVELS

MS_DOMAIN = "com.microsoft"
PROBE_ROWS, PROBE_K, PROBE_N = 4, 64, 32


def integer_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``MatMulIntegerToFloat`` of uint8 ``a`` (rows, K) around 128 and int8 ``b`` (K, N), scales 1, as ONNX Runtime
    computes it on this machine."""
    constants = [
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array(1, np.float32), "one"),
        numpy_helper.from_array(np.array(ACTIVATION_ZERO_POINT, np.uint8), "zero_point"),
    ]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "one", "one", "zero_point"], ["y"], domain=MS_DOMAIN)
    graph = helper.make_graph(
        [node],
        "int8_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, ["rows", b.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", b.shape[1]])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = IR_VERSION
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"a": a})[0])


@cache
def weight_levels() -> int:
    """``FULL_LEVELS`` where this machine's u8·s8 kernel sums the largest codes exactly, else ``NARROW_LEVELS``.
    Measured once per process (a few ms)."""
    a = np.full((PROBE_ROWS, PROBE_K), 255, np.uint8)  # every activation at +127
    b = np.full((PROBE_K, PROBE_N), FULL_LEVELS, np.int8)
    b[:, 1::2] = -FULL_LEVELS
    exact = (a.astype(np.int64) - ACTIVATION_ZERO_POINT) @ b.astype(np.int64)
    return FULL_LEVELS if np.array_equal(integer_product(a, b), exact.astype(np.float32)) else NARROW_LEVELS
