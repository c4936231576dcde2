"""What the CUDA step's captured graphs buy, and where the GPU memory goes, on a lent GPU (``gpu_session.sh cuda``):

- per model (bundled en-de; the paper's base size, random weights) and variant (fp32, fp16), a decoding step of one
  bucket timed three ways over the same bindings: an ordinary run (every kernel launched from the host), the run
  that captures the graph, and a replay of it; at 1 row and at 128 rows; and a beam-4 step over 128 sentences, its
  decoder and its reordering apart, 24 tokens each (as the bench decodes them);
- the GPU memory by part at the base size after beam 4 over 128 sentences of 24 tokens each (as the bench decodes
  them): the CUDA context and ONNX Runtime's provider (a one-node session), the serving sessions (weights and their
  arena), the workspace (cross keys/values, the two cache buffers), and the arena's slack (what the process holds
  beyond those), as ``nvidia-smi`` reports it.

    PYTHONPATH=$PWD python scripts/cuda_graph_probe.py [--device cpu] [--memory fp32|fp16] >> probe.jsonl

``--memory`` measures the memory alone (a fresh process: ``nvidia-smi`` reports a process's whole holding);
``--device cpu`` runs it on the CPU provider (the CUDA graphs there replay nothing: the dry run of this script).
It lives in scripts/, outside the package: a developer's measurement on a lent machine, not run by the suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.bench.process import gpu_mb
from aiayn.core.config import PRESETS
from aiayn.core.folder import ModelFolder, bundled_models
from aiayn.engines.load import translator_for
from aiayn.engines.onnx.serving.device_buffers import CACHES, CROSS, DeviceBuffers
from aiayn.engines.onnx.serving.engine import ServingEngine
from aiayn.engines.onnx.sessions import open_on_device
from aiayn.engines.placement import Placement
from aiayn.search.translator import SearchSettings

RUNS = 50
MIB = 1 << 20


def base_folder(like: ModelFolder, path: Path) -> ModelFolder:
    """A base-size folder of random weights with ``like``'s tokenizer (the bench's is exported for CTranslate2 too,
    which this stage does not carry)."""
    import torch

    from aiayn.model.transformer import Transformer
    from aiayn.model.weights import save_weights

    config = PRESETS["base"].replace(
        vocab_size=like.config.vocab_size, special_tokens=like.config.special_tokens, max_len=like.config.max_len
    )
    folder = ModelFolder.create(path, config, like.tokenizer)
    torch.manual_seed(0)
    save_weights(Transformer(config).eval(), folder)
    return folder


def step_times(engine: ServingEngine[Any], rows: int) -> dict[str, float]:
    """Milliseconds of one decoding step of ``rows`` sentences (greedy): ordinary runs, the capture, replays."""
    buffers = engine.buffers
    assert isinstance(buffers, DeviceBuffers)
    state = engine.start(np.tile(np.array([[5, 6, 7, 8, engine.eos_id]]), (rows, 1)))
    tgt = np.full((rows, 1), engine.bos_id)
    _, _, state = engine.step_top(state, tgt, 1)  # its bucket's ordinary run: the arena grows to its shapes
    binding = buffers.decoding(buffers.step_of(state.batch), state.batch.shapes, state.batch.cache, 1)

    def timed(options: Any) -> float:
        started = time.perf_counter()
        buffers.decoder.run_with_iobinding(binding, options)
        return (time.perf_counter() - started) * 1000

    ordinary = statistics.median(timed(buffers.ordinary) for _ in range(RUNS))
    graph = buffers.graphs[("decode", buffers.workspace.generation, state.batch.shapes, state.batch.cache, 1)]
    capture = timed(graph)
    replay = statistics.median(timed(graph) for _ in range(RUNS))
    return {"ordinary_ms": round(ordinary, 4), "capture_ms": round(capture, 3), "replay_ms": round(replay, 4)}


def beam_times(engine: ServingEngine[Any], sentences: int, steps: int = 24) -> dict[str, float]:
    """Milliseconds of a beam-4 step's two parts over ``sentences`` sources, as the bench decodes them (``steps``
    tokens each): the decoder's replay (the cache's widening, where it fills, included), and the reordering of the
    cache's rows by their parents; medians over the steps of passes after the first (which captures)."""
    src = np.full((sentences, 16), 5)
    src[:, -1] = engine.eos_id
    tgt = np.full((4 * sentences, 1), engine.bos_id)
    parents = np.arange(4 * sentences) // 4 * 4 + np.random.default_rng(0).integers(0, 4, 4 * sentences)
    times: dict[str, list[float]] = {"decode_ms": [], "reorder_ms": []}
    for timed in (False, True, True, True):
        state = engine.select(engine.start(src), np.repeat(np.arange(sentences), 4))
        for _ in range(steps):
            started = time.perf_counter()
            _, _, state = engine.step_top(state, tgt, 8)
            decoded = time.perf_counter()
            state = engine.select(state, parents)
            if timed:
                times["decode_ms"].append((decoded - started) * 1000)
                times["reorder_ms"].append((time.perf_counter() - decoded) * 1000)
    medians = {name: round(statistics.median(values), 4) for name, values in times.items()}
    return {"rows": 4 * sentences, "steps": steps, "capacity": state.batch.shapes.capacity, **medians}


def memory_by_part(folder: ModelFolder, placement: Placement, sentences: list[str]) -> dict[str, float]:
    """MiB by part, after beam 4 over ``sentences`` in one batch."""
    from aiayn.engines.onnx.tiny_graphs import gather_model

    probe = open_on_device(None, gather_model([("float32", 1)]), placement)
    context = gpu_mb()
    engine = ServingEngine.load(folder, placement)
    loaded = gpu_mb()
    translator = translator_for(folder, engine, max_sentences=len(sentences))
    translator.translate(sentences, SearchSettings(beam_size=4, min_len=24, max_len=24))  # as the bench decodes
    held = gpu_mb()
    buffers = engine.buffers
    assert isinstance(buffers, DeviceBuffers)
    workspace = {
        role: buffers.workspace.buffers[role].shape()[0] * buffers.dtype.itemsize / MIB
        for role in (CROSS, *CACHES)
        if role in buffers.workspace.buffers
    }
    del probe
    parts = {"context_and_provider": context, "sessions": loaded - context, **workspace}
    parts["arena_slack"] = held - loaded - sum(workspace.values())
    return {"total": held, **{k: round(v, 1) for k, v in parts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--memory", choices=("fp32", "fp16"), help="the memory by part of this variant alone")
    args = parser.parse_args()
    gpu = Placement(on_gpu=args.device == "cuda", for_gpu=True)  # the GPU's serving engine, or its rehearsal
    bundled = ModelFolder.open(bundled_models()["en-de"])
    sentences = ["Two dogs play in the snow near a red house."] * 128
    with tempfile.TemporaryDirectory() as tmp:
        base = base_folder(bundled, Path(tmp) / "base")
        if args.memory:
            memory = memory_by_part(base, replace(gpu, variant=args.memory), sentences)
            print(json.dumps({"memory_mib": args.memory, **memory}))
            return
        for name, folder in (("bundled", bundled), ("base", base)):
            for variant in ("fp32", "fp16"):
                engine = ServingEngine.load(folder, replace(gpu, variant=variant))
                for rows in (1, 128):
                    figures = {"model": name, "variant": variant, "rows": rows, **step_times(engine, rows)}
                    print(json.dumps(figures), flush=True)
                figures = {"model": name, "variant": variant, "beam": 4, **beam_times(engine, 128)}
                print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
