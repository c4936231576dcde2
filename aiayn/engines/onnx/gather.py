"""Row selection on the device: the beam's reordering of the KV cache without a trip through host memory.

ONNX Runtime's Python API has no indexing of device tensors (OrtValues), so
``select`` runs a tiny ONNX graph of Gather nodes (along the rows' axis) on the same execution
provider as the decoder, written with ``onnx.helper`` as every graph built at load time.
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


def gather_model(tensors: Sequence[tuple[str, int]], axis: int = 0, in_place: bool = False) -> bytes:
    """A serialized ModelProto: inputs ``data_i`` (dtype, rank) and ``rows`` (int64), ``out_i`` = ``data_i``'s
    ``rows`` along ``axis``. ``in_place``: ``out_i`` may be bound to ``data_i``'s own memory. Each tensor is gathered
    into a temporary and copied out before the next is read (the nodes run in the order written), so that the
    temporaries take the memory of one tensor, not of all."""
    nodes = []
    for i in range(len(tensors)):
        gathered = f"gathered_{i}" if in_place else f"out_{i}"
        nodes.append(helper.make_node("Gather", [f"data_{i}", INDICES], [gathered], f"gather_data_{i}", axis=axis))
        if in_place:
            nodes.append(helper.make_node("Identity", [gathered], [f"out_{i}"], f"copy_out_{i}"))
    inputs = [tensor_info(f"data_{i}", dtype, symbolic(f"data_{i}", rank)) for i, (dtype, rank) in enumerate(tensors)]
    outputs = [tensor_info(f"out_{i}", dtype, symbolic(f"out_{i}", rank)) for i, (dtype, rank) in enumerate(tensors)]
    graph = helper.make_graph(nodes, "select_rows", [*inputs, tensor_info(INDICES, "int64", ["n_rows"])], outputs)
    model = helper.make_model(graph, producer_name="aiayn", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model.SerializeToString()
