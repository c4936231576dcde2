"""Where and how a model folder's engine runs, decided once: ``EngineOptions`` (what the user asked) resolved into a
frozen ``Placement`` (what runs; ``load.place`` resolves it), as CTranslate2 resolves its compute type once, before a
weight is read.

Every engine loads as ``load(folder, placement)`` and reads its choices off the placement's fields: which engine,
on which device, whose graphs and state back end, the row of the table of weights, the lanes and threads. The
device's questions (is there a GPU here? which engine runs this variant there?) are asked here and nowhere else,
and a refusal is one line from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from aiayn.engines import DEVICE_NAMES, ONNX, ONNX_PORTABLE, TORCH, WEIGHTS, Weights
from aiayn.engines.onnx.serving.spec import ServingOps

CPU, GPU = "cpu", "cuda"  # the resolved devices (and ONNX Runtime's names for an OrtValue's device)


@dataclass(frozen=True)
class Placement:
    """What runs, resolved from ``EngineOptions`` by ``load.place`` (or, in the tests and scripts, built as it is: the
    defaults are the serving engine on the CPU, one lane of one thread)."""

    engine: str = ONNX  # the engine that runs: ONNX (the serving engine), ONNX_PORTABLE or TORCH
    variant: str = "fp32"  # its weights: a row of ``aiayn.engines.WEIGHTS``
    on_gpu: bool = False  # its sessions (or PyTorch) run on the GPU, else on the CPU
    for_gpu: bool = False  # built the GPU's way: its serving graphs, the state as OrtValues bound on the device
    lanes: int = 1  # searches at once, one batch each
    threads: int = 1  # ONNX Runtime's intra-op threads per session (PyTorch's own on a CPU)
    profile_prefix: str = ""  # the CPU decoder's session under ONNX Runtime's profiler (``aiayn bench --profile``)

    @property
    def device(self) -> str:
        """Where it runs, as ONNX Runtime's OrtValues and PyTorch name it."""
        return GPU if self.on_gpu else CPU

    @property
    def graphs_for(self) -> str:
        """The device whose serving graphs it builds."""
        return GPU if self.for_gpu else CPU

    @property
    def serving_ops(self) -> ServingOps:
        """What its serving graphs are made of; a KeyError where the table of weights has none (``place`` never
        places the serving engine there)."""
        return self.weights.serving[self.graphs_for]

    @property
    def weights(self) -> Weights:
        return WEIGHTS[self.variant]

    @property
    def checked(self) -> bool:
        """The serving engine for a GPU checks itself against the CPU serving graphs before it serves
        (``onnx/serving/self_check.py``): a GPU runs kernels the CPU never does."""
        return self.engine == ONNX and self.for_gpu

    def rehearsal(self) -> Placement:
        """This placement's engine, graphs and state back end with its sessions on the CPU provider: how the GPU's
        engine is proven without a GPU (the tests, ``scripts/gpu_session.sh``'s dry run)."""
        return replace(self, on_gpu=False)

    def portable(self) -> Placement:
        """The exported contract graphs in the same place: what serves where the serving engine cannot."""
        return replace(self, engine=ONNX_PORTABLE)


def gpu_wanted(asked: str, gpu_problem: Callable[[], str]) -> bool:
    """Whether to run on the GPU for ``--device asked``: never for cpu (nothing probed); for auto, where
    ``gpu_problem`` finds nothing in the way (it says what is, or ""); for cuda, or a ValueError in one line saying
    why not."""
    if asked == CPU:
        return False
    problem = gpu_problem()
    if problem and asked == GPU:
        raise ValueError(f"--device cuda: {problem}; use --device cpu, or auto to take the GPU only where it works")
    return not problem


def engine_for(engine: str, device: str, variant: str) -> str:
    """The engine that runs ``variant`` for ``--engine engine`` on ``device`` (a resolved one), as the table of
    weights says; or a ValueError, one line naming what would."""
    weights = WEIGHTS[variant]
    serving, exported = device in weights.serving, weights.exported
    if engine == TORCH:
        if weights.torch:
            return TORCH
        raise ValueError(f"the torch engine runs fp32 only; use --engine onnx for --variant {variant}")
    if engine == ONNX_PORTABLE and not exported or engine == ONNX and not (serving or exported):
        devices = list(weights.serving)
        on = " or ".join(DEVICE_NAMES[d] for d in devices)
        raise ValueError(
            f"--variant {variant} is built from the weights for the onnx engine on {on}; "
            f"use --engine onnx --device {devices[0]} (or auto)"
        )
    return ONNX if serving and engine == ONNX else ONNX_PORTABLE

