"""How the ONNX Runtime engine moves its state: on the host as NumPy arrays, or bound to the device.

Both components run the same graphs for the same engine (``engine.py``) and
differ only in where the decoder state lives between steps and how its rows
are taken. ``HostIO`` passes NumPy arrays in and out of ``session.run``.
``BoundIO`` keeps the state as OrtValues on the execution provider's device
(I/O binding): per step only the token ids and the few host outputs cross, and
rows are taken on the device by a small Gather graph (``tiny_graphs.py``), since
ONNX Runtime's Python API cannot index a device tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from aiayn.engines.onnx.sessions import ORT_TYPES, open_on_device
from aiayn.engines.onnx.tiny_graphs import gather_model
from aiayn.engines.placement import Placement

DTYPE_OF_ORT_TYPE = {ort_type: dtype for dtype, ort_type in ORT_TYPES.items()}
Feeds = Mapping[str, np.ndarray]  # small host inputs of one run: token ids, position, k
Decoded = tuple[list[np.ndarray], list[Any]]  # the host outputs, then the state outputs in the component's form


class HostIO:
    """The decoder state as NumPy arrays."""

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession) -> None:
        self.encoder, self.decoder = encoder, decoder

    def encode(self, feeds: Feeds, outputs: list[str], src_mask: np.ndarray) -> tuple[Any, list[Any]]:
        """The encoder's ``outputs`` and the source mask, in this component's form."""
        return src_mask, self.encoder.run(outputs, dict(feeds))

    def decode(self, feeds: Feeds, state: Mapping[str, Any], host_outputs: list[str], outputs: list[str]) -> Decoded:
        """Run the decoder: ``host_outputs`` as NumPy arrays, the state ``outputs`` in this component's form."""
        values = self.decoder.run([*host_outputs, *outputs], {**feeds, **state})
        return values[: len(host_outputs)], values[len(host_outputs) :]

    @staticmethod
    def take(values: Sequence[np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
        return [value[rows] for value in values]


class BoundIO:
    """The decoder state as OrtValues on the device, passed between steps by I/O binding."""

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, placement: Placement) -> None:
        self.encoder, self.decoder, self.placement = encoder, decoder, placement
        self.device = placement.device  # the OrtValues' device
        self.gathers: dict[tuple[int, tuple[tuple[str, int], ...]], ort.InferenceSession] = {}

    def encode(self, feeds: Feeds, outputs: list[str], src_mask: np.ndarray) -> tuple[Any, list[Any]]:
        binding = self.encoder.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name in outputs:
            binding.bind_output(name, self.device)  # ONNX Runtime allocates them on the device
        self.encoder.run_with_iobinding(binding)
        return ort.OrtValue.ortvalue_from_numpy(src_mask, self.device), binding.get_outputs()

    def decode(self, feeds: Feeds, state: Mapping[str, Any], host_outputs: list[str], outputs: list[str]) -> Decoded:
        binding = self.decoder.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name, ort_value in state.items():
            binding.bind_ortvalue_input(name, ort_value)
        for name in host_outputs:
            binding.bind_output(name, "cpu")
        for name in outputs:
            binding.bind_output(name, self.device)
        self.decoder.run_with_iobinding(binding)
        values = binding.get_outputs()
        return [v.numpy() for v in values[: len(host_outputs)]], values[len(host_outputs) :]

    def take(self, values: Sequence[ort.OrtValue], rows: np.ndarray, axis: int = 0) -> list[ort.OrtValue]:
        """``rows`` along ``axis`` of each of ``values``, on the device, by one Gather graph for their dtypes and
        ranks."""
        signature = tuple((DTYPE_OF_ORT_TYPE[v.data_type()], len(v.shape())) for v in values)
        if (axis, signature) not in self.gathers:
            model = gather_model(signature, axis)
            self.gathers[axis, signature] = open_on_device(None, model, self.placement)
        session = self.gathers[axis, signature]
        binding = session.io_binding()
        for i, value in enumerate(values):
            binding.bind_ortvalue_input(f"data_{i}", value)
            binding.bind_output(f"out_{i}", self.device)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        session.run_with_iobinding(binding)
        return binding.get_outputs()
