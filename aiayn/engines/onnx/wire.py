"""Just enough of ONNX's protobuf wire format to write small graphs without the ``onnx`` package.

The serve path runs on ONNX Runtime and NumPy alone, so the small graphs it
builds at load time (``gather.py``, ``top_k.py``) are written here as bytes.
Field numbers are those of onnx.proto (ModelProto, GraphProto, NodeProto,
ValueInfoProto, TypeProto); tests check the results with ``onnx.checker``.
"""

from __future__ import annotations

from collections.abc import Sequence

ELEMENT_TYPES = {"float32": 1, "int64": 7, "bool": 9}  # onnx.TensorProto.DataType


def varint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"varint takes a non-negative int, got {value}")
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


def value_info(name: str, dtype: str, shape: Sequence[str | int]) -> bytes:
    """ValueInfoProto{name: 1, type: 2 = TypeProto{tensor_type: 1 = Tensor{elem_type: 1, shape: 2}}}.

    The shape is TensorShapeProto{dim: 1 = Dimension{dim_value: 1 (an int), dim_param: 2 (a name)}}.
    """
    dims = b"".join(
        bytes_field(1, int_field(1, axis) if isinstance(axis, int) else bytes_field(2, axis)) for axis in shape
    )
    tensor_type = int_field(1, ELEMENT_TYPES[dtype]) + bytes_field(2, dims)
    return bytes_field(1, name) + bytes_field(2, bytes_field(1, tensor_type))


def node(op_type: str, inputs: list[str], outputs: list[str], name: str) -> bytes:
    """NodeProto{input: 1, output: 2, name: 3, op_type: 4}, with the operator's default attributes."""
    return (
        b"".join(bytes_field(1, i) for i in inputs)
        + b"".join(bytes_field(2, o) for o in outputs)
        + bytes_field(3, name)
        + bytes_field(4, op_type)
    )
