"""ONNX external data: a graph's large constants in one file beside it, written by aiayn as the graphs are made (the
serving graphs, the attention view) or moved out of a finished graph (the browser folder's graphs).

A graph that carried its weights inline would exist three times over while a session is built (the protobuf, its
serialized bytes, ONNX Runtime's parsed copy) next to the session's own; from a file, ONNX Runtime reads each tensor
straight into the session (the base size's peak while loading fell from 1 123 to 268 MiB: docs/speed.md, Memory).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

EXTERNAL_DATA_FILE = "weights.bin"  # beside the graphs: the serving graphs' temporary folder, the browser folder
PAGE = 4096  # the serving graphs' offsets: page-aligned, as ONNX Runtime maps the file


class ExternalData:
    """One external-data file for one or more graphs; each tensor at an ``alignment``-byte offset."""

    def __init__(self, path: Path, alignment: int = PAGE) -> None:
        self.path, self.alignment = path, alignment
        self.file = path.open("wb")
        self.offsets: dict[bytes, int] = {}  # sha256 of a moved tensor's bytes → its offset: each written once

    def append(self, data: bytes) -> int:
        offset = -(-self.file.tell() // self.alignment) * self.alignment
        self.file.seek(offset)
        self.file.write(data)
        return offset

    def point(self, tensor: onnx.TensorProto, offset: int, length: int) -> None:
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", self.path.name), ("offset", offset), ("length", length)):
            tensor.external_data.add(key=key, value=str(value))

    def reference(self, name: str, value: np.ndarray) -> onnx.TensorProto:
        """``value`` appended to the file; the initializer that points there."""
        tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype))
        tensor.dims.extend(value.shape)
        self.point(tensor, self.append(value.tobytes()), value.nbytes)
        return tensor

    def externalize(self, graph: onnx.GraphProto, min_bytes: int) -> None:
        """Point every initializer of ``graph`` of at least ``min_bytes`` into the file, appending the bytes it does
        not hold yet (the encoder's and the decoder's shared tensors are written once)."""
        for tensor in graph.initializer:
            data = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
            if len(data) < min_bytes:
                continue
            digest = hashlib.sha256(data).digest()
            if digest not in self.offsets:
                self.offsets[digest] = self.append(data)
            for field in ("raw_data", "float_data", "int32_data", "int64_data"):
                tensor.ClearField(field)
            self.point(tensor, self.offsets[digest], len(data))

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> ExternalData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
