"""Opening a model folder for translation: the options placed once (``place``), its step engine loaded where the
placement says (ONNX Runtime, or PyTorch where it is installed), and the translator over an engine."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

from aiayn.core.folder import ModelFolder
from aiayn.engines import ONNX, ONNX_PORTABLE, TORCH, WEIGHTS, Engine
from aiayn.engines.onnx.sessions import gpu_unavailable
from aiayn.engines.options import EngineOptions
from aiayn.engines.placement import CPU, GPU, Placement, engine_for, gpu_wanted
from aiayn.search.translator import Translator


def installed_engine() -> str:
    """The engine a command takes when none is named: PyTorch where it is installed (the full install),
    else ONNX Runtime (the serve-only install). Looked up, not imported: importing torch takes seconds."""
    try:
        return TORCH if importlib.util.find_spec("torch") is not None else ONNX
    except (ImportError, ValueError):  # an import hook that refuses torch, or a broken installation
        return ONNX


def pytorch_engine() -> ModuleType:
    """The PyTorch engine's module, imported only for the torch engine (the serve path runs without PyTorch); one
    line where PyTorch is missing."""
    try:
        from aiayn.engines import pytorch
    except ImportError as err:
        raise ValueError(
            f"the torch engine needs PyTorch ({err}): pip install -e '.[train]', or use the onnx engine"
        ) from None
    return pytorch


def load_engine(folder: ModelFolder, where: EngineOptions | Placement, model: Any = None) -> Engine[Any]:
    """The step engine of a model folder, placed as ``where`` says (options are placed first: ``place``).

    ``model``: the torch engine over a model in memory instead of the folder's weights (training's validation, the
    export's checks)."""
    placement = where if isinstance(where, Placement) else place(where)
    if placement.engine == TORCH:
        return pytorch_engine().TorchEngine.load(folder, placement, model)
    from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
    from aiayn.engines.onnx.serving.engine import ServingEngine

    if placement.engine == ONNX_PORTABLE:
        return PortableOnnxEngine.load(folder, placement)
    engine = ServingEngine.load(folder, placement)
    return checked(folder, engine, placement) if placement.checked else engine


def checked(folder: ModelFolder, engine: Engine[Any], placement: Placement) -> Engine[Any]:
    """``engine`` (the serving engine for a GPU) once it has checked itself against the CPU serving graphs
    (``onnx/serving/self_check.py``); where it fails the check, the exported contract graphs in its place, saying why
    in one line."""
    from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
    from aiayn.engines.onnx.serving import self_check
    from aiayn.engines.onnx.serving.engine import ServingEngine

    reference = ServingEngine.load(folder, Placement())  # the CPU serving graphs in fp32
    reason = self_check.disagreement(engine, reference, folder.config.vocab_size, placement.serving_ops.dtype)
    if not reason:
        return engine
    print(
        f"the serving graphs cannot serve {folder.path} on {placement.device}: {reason}; the exported graphs serve "
        "it instead",
        file=sys.stderr,
    )
    return PortableOnnxEngine.load(folder, placement.portable())


def place(options: EngineOptions, profile_prefix: str = "") -> Placement:
    """The placement of ``options``: the device resolved (``auto``: a GPU where the engine's runtime really runs on
    one), the engine the table of weights says runs the variant there, a GPU's one lane. A ValueError in one line
    where nothing can run what was asked, naming what would."""
    weights, variant = WEIGHTS[options.variant], options.variant
    if options.engine == TORCH:
        on_gpu = gpu_wanted(options.device, pytorch_engine().gpu_problem)
    elif not weights.gpu:
        on_gpu = gpu_wanted(options.device, lambda: f"--variant {variant} is built from the weights on a CPU only")
    else:
        on_gpu = gpu_wanted(options.device, onnx_runtime_gpu_problem)
    engine = engine_for(options.engine, GPU if on_gpu else CPU, variant)
    lanes = 1 if on_gpu else options.lane_count  # a GPU runs its own graphs, in one lane: one stream takes turns anyway
    return Placement(engine, variant, on_gpu, on_gpu, lanes, options.threads, profile_prefix)


def onnx_runtime_gpu_problem() -> str:
    reason = gpu_unavailable(1)
    return f"ONNX Runtime cannot run on a GPU here ({reason})" if reason else ""


def translator_for(folder: ModelFolder, engine: Engine[Any], **batching: int) -> Translator:
    """Text in, text out over ``engine`` with ``folder``'s tokenizer and length limit, in the engine's lanes."""
    return Translator(engine, folder.tokenizer, folder.config.max_len, lanes=engine.lanes, **batching)
