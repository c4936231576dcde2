"""Row selection on the device: the beam's reordering of the KV cache without a trip through host memory.

ONNX Runtime's Python API has no indexing of device tensors (OrtValues), so
``select`` runs a tiny ONNX graph of Gather nodes (axis 0) on the same execution
provider as the decoder, written in protobuf wire format (``onnx_wire.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.core.contract import IR_VERSION, OPSET
from aiayn.engines.onnx.wire import bytes_field, int_field, node, value_info

INDICES = "rows"


def symbolic(name: str, rank: int) -> list[str]:
    return [f"{name}_{axis}" for axis in range(rank)]


def gather_model(tensors: Sequence[tuple[str, int]]) -> bytes:
    """A serialized ModelProto: inputs ``data_i`` (dtype, rank) and ``rows`` (int64), ``out_i = data_i[rows]``."""
    graph = bytes_field(2, "select_rows")  # GraphProto{node: 1, name: 2, input: 11, output: 12}
    for i in range(len(tensors)):
        graph += bytes_field(1, node("Gather", [f"data_{i}", INDICES], [f"out_{i}"], f"gather_data_{i}"))
    for i, (dtype, rank) in enumerate(tensors):
        graph += bytes_field(11, value_info(f"data_{i}", dtype, symbolic(f"data_{i}", rank)))  # GraphProto.input
    graph += bytes_field(11, value_info(INDICES, "int64", ["n_rows"]))
    for i, (dtype, rank) in enumerate(tensors):
        graph += bytes_field(12, value_info(f"out_{i}", dtype, symbolic(f"out_{i}", rank)))  # GraphProto.output
    opset = bytes_field(1, "") + int_field(2, OPSET)  # OperatorSetIdProto{domain: 1, version: 2}
    return int_field(1, IR_VERSION) + bytes_field(2, "aiayn") + bytes_field(7, graph) + bytes_field(8, opset)
