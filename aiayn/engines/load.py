"""Opening a model folder for translation: its step engine by name (ONNX Runtime, or PyTorch where it is
installed), the translator over an engine, and the folder's decoding defaults."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

from aiayn.core.contract import DECODER_FILE, ENCODER_FILE
from aiayn.core.folder import ModelFolder
from aiayn.engines import BLOCK_VARIANTS, ENGINES, ONNX, TORCH, VARIANTS, Engine, default_cores
from aiayn.search.translator import SearchSettings, Translator

FUSED_VARIANTS = ("fp32", *BLOCK_VARIANTS, "int8")  # the serving graphs' variants


def installed_engine() -> str:
    """The engine a command takes when none is named: PyTorch where it is installed (the full install),
    else ONNX Runtime (the serve-only install). Looked up, not imported: importing torch takes seconds."""
    try:
        return TORCH if importlib.util.find_spec("torch") is not None else ONNX
    except (ImportError, ValueError):  # an import hook that refuses torch, or a broken installation
        return ONNX


def load_engine(
    folder: ModelFolder, engine: str, device: str = "auto", variant: str = "fp32", cores: int | None = None
) -> Engine[Any]:
    """The step engine ``engine`` (one of ``ENGINES``) of a model folder: ONNX Runtime (``variant``: one of
    ``VARIANTS``) or PyTorch (fp32). "onnx" is the fastest ONNX Runtime engine for the device: the contract's graphs
    on a GPU, the serving graphs built from the weights on a CPU; w8 and w4 are serving graphs only, so CPU only.

    ``cores`` (default: the machine's, at most ``MAX_CORES``): on a CPU, ONNX Runtime runs that many lanes of one
    intra-op thread each, over one copy of the weights. Its ops are too small at this model's size for a second
    thread to gain (``aiayn bench``: README, Speed), while a second lane searches another batch at the same time.

    PyTorch is imported only here and only for ``engine="torch"``, so the serve path runs without it.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if variant != "fp32" and engine == TORCH:
        raise ValueError(f"the torch engine runs fp32 only; use --engine onnx for --variant {variant}")
    if variant in BLOCK_VARIANTS and (engine != ONNX or device == "cuda"):
        raise ValueError(
            f"--variant {variant} is built from the weights for the onnx engine on a CPU; "
            "use --engine onnx --device cpu (or auto)"
        )
    if engine == TORCH:
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
    from aiayn.engines.onnx.sessions import CPU, gpu_unavailable

    lanes = cores or default_cores()
    if engine == ONNX and variant in FUSED_VARIANTS:
        # The serving graphs are built from the weights, so a folder fresh from `aiayn train` translates at once;
        # only a GPU needs the exported graphs, which such a folder does not have yet.
        exported = all(folder.onnx_file(graph).is_file() for graph in (ENCODER_FILE, DECODER_FILE))
        on_cpu = device == "cpu" or variant in BLOCK_VARIANTS
        if on_cpu or (device == "auto" and (not exported or gpu_unavailable(1))):
            return FusedOnnxEngine.load(folder, 1, variant=variant, lanes=lanes)
    portable = OnnxEngine.load(folder, device=device, variant=variant, threads=1, lanes=lanes)
    if engine == ONNX and portable.provider == CPU and variant in FUSED_VARIANTS:
        return FusedOnnxEngine.load(folder, 1, variant=variant, lanes=lanes)  # a GPU failing these graphs
    return portable


def translator_for(folder: ModelFolder, engine: Engine[Any], **batching: int) -> Translator:
    """Text in, text out over ``engine`` with ``folder``'s tokenizer and length limit, in the engine's lanes."""
    return Translator(engine, folder.tokenizer, folder.config.max_len, lanes=engine.lanes, **batching)


def search_settings_for(folder: ModelFolder, **changes: Any) -> SearchSettings:
    """``folder``'s decoding defaults (its length penalty, if tuned on val; an imported checkpoint's beam and
    normalisation), then ``changes`` (a change of None keeps the default)."""
    return replace(SearchSettings(**folder.search_defaults()), **{k: v for k, v in changes.items() if v is not None})
