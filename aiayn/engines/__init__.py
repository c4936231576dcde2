"""Step engines: everything that implements the search's step interface (``aiayn.search.StepModel``)."""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from aiayn.core.contract import VARIANTS as EXPORTED_VARIANTS
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

# The weights an ONNX Runtime engine runs, in the CLI's one --variant: fp32; w8 and w4, the weight-only blocks of
# ``onnx/block_quant.py``, built from the weights at load time (the CPU engine only); int8 and fp16, the exported
# graphs' other variants (``aiayn.core.contract.VARIANTS``), which need `aiayn export`.
BLOCK_VARIANTS = tuple(BLOCK_SCHEMES)
VARIANTS = ("fp32", *BLOCK_VARIANTS, *(v for v in EXPORTED_VARIANTS if v != "fp32"))


class Engine(StepModel[State], Protocol[State]):
    """A step engine as ``load.load_engine`` hands it to the service, the CLI and the bench."""

    name: str  # which engine it is: one of ``ENGINE_NAMES``
    provider: str  # where it runs: ONNX Runtime's execution provider, or PyTorch and its device
    lanes: int  # how many searches it runs well at once (``aiayn.search.translator``: one batch each)

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Last decoder layer's cross-attention over a whole output ``out_ids`` (batch, out_len), from <s>:
        (batch, heads, out_len, src_len), the attention view."""
        ...
