"""Opening a model folder for translation: its step engine by name (ONNX Runtime, or PyTorch where it is
installed), the translator over an engine, and the folder's decoding defaults."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

from aiayn.core.contract import DECODER_FILE, ENCODER_FILE
from aiayn.core.folder import ModelFolder
from aiayn.search.step import StepModel
from aiayn.search.translator import SearchSettings, Translator

# onnx: the fastest ONNX Runtime engine for the device (on a CPU the serving graphs built from the weights,
# ``fused.py``; on a GPU the contract's graphs); onnx-portable: the contract's graphs everywhere (the reference);
# torch: PyTorch itself.
ENGINES = ("onnx", "onnx-portable", "torch")
FUSED_VARIANTS = ("fp32", "int8")  # the serving graphs have no fp16 variant: fp16 is for GPUs


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
    """The step engine of a model folder: ONNX Runtime (fp32, int8 or fp16) or PyTorch.

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
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    from aiayn.engines.onnx.engine import OnnxEngine
    from aiayn.engines.onnx.fused import FusedOnnxEngine
    from aiayn.engines.onnx.sessions import CPU

    # The serving graphs are built from the weights, so a folder fresh from `aiayn train` translates at once; only
    # a GPU needs the exported graphs, which such a folder does not have yet.
    exported = all(folder.onnx_file(graph).is_file() for graph in (ENCODER_FILE, DECODER_FILE))
    if engine == "onnx" and variant in FUSED_VARIANTS and (device == "cpu" or (device == "auto" and not exported)):
        return FusedOnnxEngine.load(folder, threads, int8=variant == "int8")
    portable = OnnxEngine.load(folder, device=device, variant=variant, threads=threads)
    if engine == "onnx" and portable.provider == CPU and variant in FUSED_VARIANTS:  # auto found no GPU
        return FusedOnnxEngine.load(folder, threads, int8=variant == "int8")
    return portable


def translator_for(folder: ModelFolder, engine: StepModel[Any], **batching: int) -> Translator:
    """Text in, text out over ``engine`` with ``folder``'s tokenizer and length limit."""
    return Translator(engine, folder.tokenizer, folder.config.max_len, **batching)


def search_settings_for(folder: ModelFolder, **changes: Any) -> SearchSettings:
    """``folder``'s decoding defaults (its length penalty, if tuned on val), then ``changes``."""
    penalty = folder.length_penalty()
    return replace(SearchSettings() if penalty is None else SearchSettings(length_penalty=penalty), **changes)
