"""Step engines: everything that implements the search's step interface (``aiayn.search.StepModel``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from aiayn.engines.onnx.block_quant import VARIANTS as BLOCK_SCHEMES
from aiayn.search.step import State, StepModel

DEVICES = ("auto", "cpu", "cuda")  # where an engine runs; auto: a GPU where one really works
MAX_CORES = 4  # by default an engine takes the machine's cores, up to this many


def default_cores() -> int:
    return min(MAX_CORES, os.cpu_count() or 1)


# One name per engine, in the CLI's --engine, the bench's rows and the logs. onnx-serving: the serving graphs built
# from the weights for the device (``onnx/serving.py``); onnx-portable: the contract's graphs (``onnx/engine.py``, the
# reference, and what a GPU runs); torch: PyTorch itself. ``onnx`` names no engine but a choice: ``load.load_engine``
# takes the fastest ONNX Runtime engine for the device, and the engine then says which it is.
ONNX, ONNX_SERVING, ONNX_PORTABLE, TORCH = "onnx", "onnx-serving", "onnx-portable", "torch"
ENGINES = (ONNX, ONNX_SERVING, ONNX_PORTABLE, TORCH)
ENGINE_NAMES = (ONNX_SERVING, ONNX_PORTABLE, TORCH)  # what an engine's ``name`` is


@dataclass(frozen=True)
class Weights:
    """One row of the table of the weights an engine can run (the CLI's one ``--variant``)."""

    serving: tuple[str, ...]  # the devices whose serving graphs are built in these weights when the engine loads
    exported: bool  # `aiayn export --variant` writes the contract's graphs in them, which the portable engine runs
    torch: bool = False  # the PyTorch engine runs them


# The one table of weight formats: fp32 everywhere; w8 and w4, the weight-only blocks of ``onnx/block_quant.py``
# (CPU); int8, dynamically quantized (CPU serving graphs, or the exported int8 graphs); fp16 (the GPU's serving
# graphs, or the exported fp16 graphs). ``load.resolve`` reads it; so do the CLI's choices, the Space's and the tests.
WEIGHTS = {
    "fp32": Weights(("cpu", "cuda"), exported=True, torch=True),
    **{name: Weights(("cpu",), exported=False) for name in BLOCK_SCHEMES},
    "int8": Weights(("cpu",), exported=True),
    "fp16": Weights(("cuda",), exported=True),
}
VARIANTS = tuple(WEIGHTS)
BLOCK_VARIANTS = tuple(BLOCK_SCHEMES)
SERVING_VARIANTS = {device: tuple(v for v, w in WEIGHTS.items() if device in w.serving) for device in ("cpu", "cuda")}


class Engine(StepModel[State], Protocol[State]):
    """A step engine as ``load.load_engine`` hands it to the service, the CLI and the bench."""

    name: str  # which engine it is: one of ``ENGINE_NAMES``
    provider: str  # where it runs: ONNX Runtime's execution provider, or PyTorch and its device
    lanes: int  # how many searches it runs well at once (``aiayn.search.translator``: one batch each)

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Last decoder layer's cross-attention over a whole output ``out_ids`` (batch, out_len), from <s>:
        (batch, heads, out_len, src_len), the attention view."""
        ...
