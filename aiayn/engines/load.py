"""Opening a model folder's step engine by name: ONNX Runtime, or PyTorch where it is installed."""

from __future__ import annotations

import importlib.util
from typing import Any

from aiayn.core.folder import ModelFolder

ENGINES = ("onnx", "torch")


def installed_engine() -> str:
    """The engine a command takes when none is named: PyTorch where it is installed (the full install),
    else ONNX Runtime (the serve-only install). Looked up, not imported: importing torch takes seconds."""
    try:
        return "torch" if importlib.util.find_spec("torch") is not None else "onnx"
    except (ImportError, ValueError):  # an import hook that refuses torch, or a broken installation
        return "onnx"


def load_engine(
    folder: ModelFolder, engine: str, device: str = "auto", variant: str = "fp32", threads: int | None = None
) -> Any:
    """The step engine of a model folder: ONNX Runtime (fp32, int8 or fp16 graphs) or PyTorch.

    PyTorch is imported only here and only for ``engine="torch"``, so the serve path runs without it.
    """
    if engine == "torch":
        try:
            from aiayn.engines.pytorch import TorchEngine
            from aiayn.model.weights import load_model
        except ImportError as err:
            raise ValueError(
                f"the torch engine needs PyTorch ({err}): pip install -e '.[train]', or use the onnx engine"
            ) from None
        return TorchEngine(load_model(folder))
    if engine != "onnx":
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    from aiayn.engines.onnx.engine import OnnxEngine

    return OnnxEngine.load(folder, device=device, variant=variant, threads=threads)

