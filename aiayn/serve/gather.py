"""Row selection on the device: the beam's reordering of the KV cache without a trip through host memory.

ONNX Runtime's Python API has no indexing of device tensors (OrtValues), so
``select`` runs a tiny ONNX graph of Gather nodes (axis 0) on the same execution
provider as the decoder. The serve path does not depend on the ``onnx`` package,
so the graph is written here in protobuf wire format; the field numbers are
those of onnx.proto (ModelProto, GraphProto, NodeProto, ValueInfoProto,
TypeProto), and a test checks the result with ``onnx.checker``.
"""

from __future__ import annotations

from collections.abc import Sequence

IR_VERSION = 8
OPSET = 13  # Gather-13
ELEMENT_TYPES = {"float32": 1, "int64": 7, "bool": 9}  # onnx.TensorProto.DataType
INDICES = "rows"


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def int_field(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def bytes_field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


def value_info(name: str, dtype: str, rank: int) -> bytes:
    """ValueInfoProto{name: 1, type: 2 = TypeProto{tensor_type: 1 = Tensor{elem_type: 1, shape: 2}}}.

    The shape (TensorShapeProto{dim: 1 = Dimension{dim_param: 2}}) gives the rank with symbolic sizes.
    """
    shape = b"".join(bytes_field(1, bytes_field(2, f"{name}_{axis}")) for axis in range(rank))
    tensor_type = int_field(1, ELEMENT_TYPES[dtype]) + bytes_field(2, shape)
    return bytes_field(1, name) + bytes_field(2, bytes_field(1, tensor_type))


def gather_node(data: str, output: str) -> bytes:
    """NodeProto{input: 1, output: 2, name: 3, op_type: 4}; Gather's axis defaults to 0."""
    return (
        bytes_field(1, data)
        + bytes_field(1, INDICES)
        + bytes_field(2, output)
        + bytes_field(3, f"gather_{data}")
        + bytes_field(4, "Gather")
    )


def gather_model(tensors: Sequence[tuple[str, int]]) -> bytes:
    """A serialized ModelProto with inputs ``data_i`` (dtype, rank) and ``rows`` (int64): ``out_i = data_i[rows]``."""
    graph = bytes_field(2, "select_rows")  # GraphProto.name
    for i in range(len(tensors)):
        graph += bytes_field(1, gather_node(f"data_{i}", f"out_{i}"))  # GraphProto.node
    for i, (dtype, rank) in enumerate(tensors):
        graph += bytes_field(11, value_info(f"data_{i}", dtype, rank))  # GraphProto.input
    graph += bytes_field(11, value_info(INDICES, "int64", 1))
    for i, (dtype, rank) in enumerate(tensors):
        graph += bytes_field(12, value_info(f"out_{i}", dtype, rank))  # GraphProto.output
    opset = bytes_field(1, "") + int_field(2, OPSET)  # OperatorSetIdProto{domain: 1, version: 2}
    return int_field(1, IR_VERSION) + bytes_field(2, "aiayn") + bytes_field(7, graph) + bytes_field(8, opset)
