"""Opening a model folder for translation: its step engine by name (ONNX Runtime, or PyTorch where it is
installed), and the translator over an engine."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from aiayn.core.folder import ModelFolder
from aiayn.engines import ONNX, ONNX_PORTABLE, ONNX_SERVING, SERVING_VARIANTS, TORCH, WEIGHTS, Engine
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import Translator


def installed_engine() -> str:
    """The engine a command takes when none is named: PyTorch where it is installed (the full install),
    else ONNX Runtime (the serve-only install). Looked up, not imported: importing torch takes seconds."""
    try:
        return TORCH if importlib.util.find_spec("torch") is not None else ONNX
    except (ImportError, ValueError):  # an import hook that refuses torch, or a broken installation
        return ONNX


def load_engine(folder: ModelFolder, options: EngineOptions) -> Engine[Any]:
    """The step engine ``options`` name for a model folder: ONNX Runtime or PyTorch (fp32). "onnx" is the serving
    engine, built from the weights for the device: on a CPU (fp32, w8, w4, int8) or on a GPU with its state on the
    device (fp32, fp16), checked at load there (``onnx/serving.py``); the variants it has no graphs for on that
    device (int8 on a GPU, fp16 on a CPU) run the exported contract graphs. On a CPU, ONNX Runtime runs
    ``options.lane_count`` lanes of ``options.threads`` intra-op threads each, over one copy of the weights.

    PyTorch is imported only here and only for ``engine="torch"``, so the serve path runs without it.
    """
    if options.engine == TORCH:
        resolve(TORCH, options.device, options.variant)  # refuses any weights but fp32
        try:
            from aiayn.engines.pytorch import TorchEngine
            from aiayn.engines.pytorch import resolve_device as torch_device
            from aiayn.model.weights import load_model
        except ImportError as err:
            raise ValueError(
                f"the torch engine needs PyTorch ({err}): pip install -e '.[train]', or use the onnx engine"
            ) from None
        return TorchEngine(load_model(folder), torch_device(options.device))
    from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
    from aiayn.engines.onnx.serving.engine import ServingEngine
    from aiayn.engines.onnx.sessions import resolve_device

    device, variant, lanes, threads = options.device, options.variant, options.lane_count, options.threads
    if device == "auto" and WEIGHTS[variant].serving == ("cpu",) and not WEIGHTS[variant].exported:
        device = "cpu"  # built for a CPU only: no GPU probe
    device = resolve_device(device)
    runs = resolve(options.engine, device, variant)
    if runs == ONNX_PORTABLE:
        return PortableOnnxEngine.load(folder, device=device, variant=variant, threads=threads, lanes=lanes)
    if device == "cuda":
        return serving_checked(folder, "cuda", variant, lanes)
    return ServingEngine.load(folder, "cpu", variant, lanes, threads=threads)


def resolve(engine: str, device: str, variant: str) -> str:
    """The engine (one of ``ENGINE_NAMES``) that runs ``variant`` for ``--engine engine`` on ``device`` (a resolved
    one), as the table of weights (``aiayn.engines.WEIGHTS``) says; or a ValueError, one line naming what would."""
    weights = WEIGHTS[variant]
    serving, exported = device in weights.serving, weights.exported
    if engine == TORCH:
        if weights.torch:
            return TORCH
        raise ValueError(f"the torch engine runs fp32 only; use --engine onnx for --variant {variant}")
    if engine == ONNX_SERVING and not serving:
        cpu, cuda = (", ".join(SERVING_VARIANTS[d]) for d in ("cpu", "cuda"))
        instead = f"use --engine {ONNX_PORTABLE} for --variant {variant} there" if exported else "use --device cpu"
        raise ValueError(f"the {ONNX_SERVING} engine runs {cpu} on a CPU and {cuda} on a GPU; {instead}")
    if engine == ONNX_PORTABLE and not exported or engine == ONNX and not (serving or exported):
        on = " or ".join("a CPU" if d == "cpu" else "a GPU" for d in weights.serving)
        raise ValueError(
            f"--variant {variant} is built from the weights for the onnx engine on {on}; "
            f"use --engine onnx --device {weights.serving[0]} (or auto)"
        )
    return ONNX_SERVING if serving and engine != ONNX_PORTABLE else ONNX_PORTABLE


def serving_checked(folder: ModelFolder, device: str, variant: str, lanes: int) -> Engine[Any]:
    """The serving engine on ``device`` once it has checked itself against the CPU serving graphs
    (``onnx/self_check.py``); where it cannot run the folder or fails the check, the exported contract graphs on the
    same device, saying why in one line. (``device`` cpu runs the CUDA graphs on the CPU provider, as the tests do.)"""
    from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
    from aiayn.engines.onnx.serving import self_check
    from aiayn.engines.onnx.serving.engine import ServingEngine

    engine = ServingEngine.load(folder, device, variant, lanes, graphs_for="cuda")
    reference = ServingEngine.load(folder, "cpu")
    reason = self_check.disagreement(engine, reference, folder.config.vocab_size, engine.ops.dtype)
    if not reason:
        return engine
    print(
        f"the serving graphs cannot serve {folder.path} on {device}: {reason}; the exported graphs serve it instead",
        file=sys.stderr,
    )
    return PortableOnnxEngine.load(folder, device=device, variant=variant, threads=1, lanes=lanes)


def translator_for(folder: ModelFolder, engine: Engine[Any], **batching: int) -> Translator:
    """Text in, text out over ``engine`` with ``folder``'s tokenizer and length limit, in the engine's lanes."""
    return Translator(engine, folder.tokenizer, folder.config.max_len, lanes=engine.lanes, **batching)
