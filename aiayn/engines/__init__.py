"""Step engines: everything that implements the search's step interface (``aiayn.search.StepModel``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from aiayn.core.contract import VARIANTS as EXPORTED_VARIANTS
from aiayn.engines.onnx.block_quant import BlockScheme
from aiayn.engines.onnx.serving.spec import CPU_OPS, CUDA_FP16_OPS, CUDA_OPS, ServingOps
from aiayn.search.step import State, StepModel

DEVICES = ("auto", "cpu", "cuda")  # where an engine runs; auto: a GPU where one really works
MAX_CORES = 4  # by default an engine takes the machine's cores, up to this many


def default_cores() -> int:
    return min(MAX_CORES, os.cpu_count() or 1)


# One name per engine, in the CLI's --engine, the bench's rows and the logs: onnx, the serving engine (graphs built
# from the weights for the device when it loads, ``onnx/serving/``); onnx-portable, the contract's exported graphs
# (``onnx/portable/``: the reference, and what serves the variants the serving engine has no graphs for on a device);
# torch, PyTorch itself. ``load.place`` decides which runs.
ONNX, ONNX_PORTABLE, TORCH = "onnx", "onnx-portable", "torch"
ENGINES = (ONNX, ONNX_PORTABLE, TORCH)
DEVICE_NAMES = {"cpu": "a CPU", "cuda": "a GPU"}


@dataclass(frozen=True)
class Weights:
    """One row of the table of the weights an engine can run (the CLI's one ``--variant``)."""

    name: str
    serving: dict[str, ServingOps]  # device → the ops of the serving graphs built in these weights when it loads
    block: BlockScheme | None = None  # weight-only blocks: every projection as MatMulNBits (``onnx/block_quant.py``)
    int8: bool = False  # int8 weights per column, activations per row, in the CPU serving graphs (``onnx/row_int8.py``)
    gpu: bool = True  # a GPU runs them (its serving graphs, or the exported graphs): else no GPU is even probed
    torch: bool = False  # the PyTorch engine runs them
    web: bool = False  # the browser folder's graphs (`aiayn export --to web --variant`)

    @property
    def exported(self) -> bool:
        """`aiayn export --variant` writes the contract's graphs in them, which the portable engine runs."""
        return self.name in EXPORTED_VARIANTS


# The one table of weight formats: fp32 everywhere; w8 and w4, weight-only blocks (CPU; why these numbers:
# docs/speed.md); int8, weights per column and activations per row (the CPU's serving graphs; on a GPU the exported
# int8 graphs); fp16 (the GPU's serving graphs, or the exported fp16 graphs). The placement, the CLI's choices, the
# exports and the tests read it.
WEIGHTS = {
    weights.name: weights
    for weights in (
        Weights("fp32", {"cpu": CPU_OPS, "cuda": CUDA_OPS}, torch=True, web=True),
        *(
            Weights(f"w{bits}", {"cpu": CPU_OPS}, BlockScheme(bits, 128, True, accuracy_level=4), gpu=False, web=True)
            for bits in (8, 4)  # 128-value symmetric blocks, int8 activations inside MatMulNBits
        ),
        Weights("int8", {"cpu": CPU_OPS}, int8=True),
        Weights("fp16", {"cuda": CUDA_FP16_OPS}),
    )
}
VARIANTS = tuple(WEIGHTS)
BLOCK_VARIANTS = tuple(v for v, w in WEIGHTS.items() if w.block)
WEB_VARIANTS = tuple(v for v, w in WEIGHTS.items() if w.web)
SERVING_VARIANTS = {device: tuple(v for v, w in WEIGHTS.items() if device in w.serving) for device in DEVICE_NAMES}


class Engine(StepModel[State], Protocol[State]):
    """A step engine as ``load.load_engine`` hands it to the service, the CLI and the bench."""

    name: str  # which engine it is: one of ``ENGINES``
    provider: str  # where it runs: ONNX Runtime's execution provider, or PyTorch and its device
    lanes: int  # how many searches it runs well at once (``aiayn.search.translator``: one batch each)

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Last decoder layer's cross-attention over a whole output ``out_ids`` (batch, out_len), from <s>:
        (batch, heads, out_len, src_len), the attention view."""
        ...
