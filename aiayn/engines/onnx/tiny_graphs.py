"""The KV cache moved on the device without a trip through host memory: the beam's reordering of its rows, and
room for more positions.

ONNX Runtime's Python API has no indexing of device tensors (OrtValues), so
``select`` runs a tiny ONNX graph of Gather nodes (along the rows' axis), and a cache that fills up one Pad node, on
the same execution provider as the decoder, written with ``onnx.helper`` as every graph built at load time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from aiayn.core.contract import IR_VERSION, OPSET

INDICES = "rows"


def symbolic(name: str, rank: int) -> list[str]:
    return [f"{name}_{axis}" for axis in range(rank)]


def tensor_info(name: str, dtype: str, shape: Sequence[str | int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))


def gather_model(tensors: Sequence[tuple[str, int]], axis: int = 0) -> bytes:
    """A serialized ModelProto: inputs ``data_i`` (dtype, rank) and ``rows`` (int64), ``out_i`` = ``data_i``'s
    ``rows`` along ``axis``."""
    nodes = [
        helper.make_node("Gather", [f"data_{i}", INDICES], [f"out_{i}"], f"gather_data_{i}", axis=axis)
        for i in range(len(tensors))
    ]
    inputs = [tensor_info(f"data_{i}", dtype, symbolic(f"data_{i}", rank)) for i, (dtype, rank) in enumerate(tensors)]
    outputs = [tensor_info(f"out_{i}", dtype, symbolic(f"out_{i}", rank)) for i, (dtype, rank) in enumerate(tensors)]
    graph = helper.make_graph(nodes, "select_rows", [*inputs, tensor_info(INDICES, "int64", ["n_rows"])], outputs)
    model = helper.make_model(graph, producer_name="aiayn", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model.SerializeToString()


PADS = "pads"


def widen_model(dtype: str, rank: int) -> bytes:
    """A serialized ModelProto: ``data`` (dtype, rank) and ``pads`` (int64, 2 · rank, ONNX Pad's begins then ends) →
    ``out``, ``data`` with zeros added where ``pads`` says: a cache given room for more positions on the device."""
    node = helper.make_node("Pad", ["data", PADS], ["out"], "widen", mode="constant")
    inputs = [tensor_info("data", dtype, symbolic("data", rank)), tensor_info(PADS, "int64", [2 * rank])]
    graph = helper.make_graph([node], "widen", inputs, [tensor_info("out", dtype, symbolic("out", rank))])
    model = helper.make_model(graph, producer_name="aiayn", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model.SerializeToString()
