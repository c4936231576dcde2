"""Choosing an engine: the one that is installed when a command names none, and what each engine says it is."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from aiayn.core.contract import VARIANTS as EXPORTED_GRAPHS
from aiayn.core.folder import ModelFolder
from aiayn.engines import ENGINES, ONNX, ONNX_PORTABLE, SERVING_VARIANTS, TORCH, VARIANTS, WEIGHTS, load
from aiayn.engines.load import place
from aiayn.engines.options import EngineOptions
from aiayn.engines.placement import engine_for


def test_the_installed_engine_is_torch_where_pytorch_is_else_onnx(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load.installed_engine() == "torch"  # the full install, as in this test environment

    def refused(name: str) -> None:
        raise ImportError(f"{name} is blocked")

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # the serve-only install
    assert load.installed_engine() == "onnx"
    monkeypatch.setattr(importlib.util, "find_spec", refused)
    assert load.installed_engine() == "onnx"


def test_auto_without_a_gpu_opens_the_serving_engine_only(
    bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exported folder on a machine whose ONNX Runtime cannot use a GPU: no contract-graph session is opened
    only to be thrown away for the serving engine."""
    from aiayn.engines.onnx import sessions
    from aiayn.engines.onnx.portable.engine import PortableOnnxEngine

    if not sessions.gpu_unavailable(1):
        pytest.skip("ONNX Runtime runs on a GPU here")

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the contract's graphs were opened")

    monkeypatch.setattr(PortableOnnxEngine, "load", refused)
    engine = load.load_engine(ModelFolder.open(bundled["en-de"]), EngineOptions(ONNX, "auto", lanes=1))
    assert (engine.name, engine.provider) == (ONNX, sessions.CPU)


@pytest.mark.parametrize("name", ENGINES)
def test_every_engine_says_its_name_and_provider(bundled: dict[str, Path], name: str) -> None:
    engine = load.load_engine(ModelFolder.open(bundled["de-en"]), EngineOptions(name, "cpu", lanes=1))
    assert engine.name == name
    assert engine.provider in ("CPUExecutionProvider", "PyTorch (CPU)")
    weights = engine.cross_attention(np.array([[5, 6, 3]]), np.array([[2, 7]]))
    assert weights.shape[0] == 1 and weights.shape[2:] == (2, 3)  # (batch, heads, out_len, src_len)


def test_one_table_says_what_runs_each_variant_or_what_would() -> None:
    """The placement's choice over the table of weights: the engine that runs, or one line naming what would."""
    runs = {
        (ONNX, "cpu", "fp32"): ONNX,
        (ONNX, "cuda", "fp32"): ONNX,
        (ONNX, "cpu", "w8"): ONNX,
        (ONNX, "cpu", "int8"): ONNX,
        (ONNX, "cuda", "int8"): ONNX_PORTABLE,  # the exported int8 graphs
        (ONNX, "cpu", "fp16"): ONNX_PORTABLE,  # the exported fp16 graphs
        (ONNX, "cuda", "fp16"): ONNX,
        (ONNX_PORTABLE, "cuda", "fp32"): ONNX_PORTABLE,
        (TORCH, "cpu", "fp32"): TORCH,
    }
    for (engine, device, variant), expected in runs.items():
        assert engine_for(engine, device, variant) == expected, (engine, device, variant)
    refused = {
        (ONNX, "cuda", "w4"): "--variant w4 is built from the weights for the onnx engine on a CPU; use --engine onnx",
        (ONNX_PORTABLE, "cpu", "w8"): "--variant w8 is built from the weights",
        (TORCH, "cpu", "int8"): "the torch engine runs fp32 only; use --engine onnx for --variant int8",
    }
    for (engine, device, variant), message in refused.items():
        with pytest.raises(ValueError) as refusal:
            engine_for(engine, device, variant)
        assert message in str(refusal.value) and "\n" not in str(refusal.value)
    assert set(WEIGHTS) == set(VARIANTS) and SERVING_VARIANTS["cuda"] == ("fp32", "fp16")
    assert {v for v, weights in WEIGHTS.items() if weights.exported} == set(EXPORTED_GRAPHS)  # the contract's files
    assert all(weights.gpu == ("cuda" in weights.serving or weights.exported) for weights in WEIGHTS.values())


def test_the_placement_says_where_and_how_each_engine_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """One decision, from the options: the device (auto: a GPU only where the runtime really runs on one; w8 never
    probes), the GPU's own graphs and its one lane, the CPU's lanes of threads."""

    probes: list[str] = []

    def gpu(problem: str) -> None:
        monkeypatch.setattr(load, "gpu_unavailable", lambda threads: probes.append("onnx") or problem)

    gpu("no GPU here")
    on_cpu = place(EngineOptions(ONNX, "auto", "fp32", lanes=2, threads=2))
    assert (on_cpu.device, on_cpu.for_gpu, on_cpu.lanes, on_cpu.threads, on_cpu.checked) == ("cpu", False, 2, 2, False)
    assert place(EngineOptions(ONNX, "auto", "w8")).device == "cpu" and probes == ["onnx"]  # w8: no probe
    with pytest.raises(ValueError, match="--device cuda: ONNX Runtime cannot run on a GPU here \\(no GPU here\\)"):
        place(EngineOptions(ONNX, "cuda"))
    gpu("")
    on_gpu = place(EngineOptions(ONNX, "auto", "fp16", lanes=2))
    assert (on_gpu.engine, on_gpu.device, on_gpu.for_gpu, on_gpu.lanes, on_gpu.checked) == (ONNX, "cuda", True, 1, True)
    assert on_gpu.serving_ops.dtype == "float16" and on_gpu.rehearsal().device == "cpu"
    portable = place(EngineOptions(ONNX, "cuda", "int8"))
    assert (portable.engine, portable.for_gpu, portable.checked) == (ONNX_PORTABLE, True, False)  # bound on the device


def test_one_options_object_checks_its_settings_in_one_line() -> None:
    for bad, named in (
        ({"engine": "tf"}, "unknown engine 'tf'"),
        ({"device": "gpu"}, "unknown device 'gpu'"),
        ({"variant": "int4"}, "unknown variant 'int4'"),
        ({"lanes": 0}, "lanes (0)"),
        ({"threads": 0}, "threads per lane (0)"),
    ):
        with pytest.raises(ValueError) as refusal:
            EngineOptions(**bad)  # type: ignore[arg-type]
        assert named in str(refusal.value) and "\n" not in str(refusal.value)
    assert EngineOptions.for_cores(ONNX, "cpu", "w8", 4, 2) == EngineOptions(ONNX, "cpu", "w8", lanes=2, threads=2)
    assert EngineOptions.for_cores(ONNX, "cpu", "fp32", None, 2).lanes is None  # the machine's cores, in pairs
    with pytest.raises(ValueError, match="give --cores a multiple of 2"):
        EngineOptions.for_cores(ONNX, "cpu", "fp32", 3, 2)
    assert EngineOptions(lanes=3, threads=2).lane_count == 3


@pytest.mark.parametrize("name", [ONNX, ONNX_PORTABLE])
def test_the_options_lanes_and_threads_are_what_onnx_runtime_runs(bundled: dict[str, Path], name: str) -> None:
    """``--cores 4 --threads-per-lane 2`` reaches the sessions: 2 lanes, each session on 2 intra-op threads."""
    engine = load.load_engine(ModelFolder.open(bundled["de-en"]), EngineOptions(name, "cpu", lanes=2, threads=2))
    sessions = (engine.buffers.decoder,) if name == ONNX else (engine.io.decoder,)  # type: ignore[attr-defined]
    assert engine.lanes == 2
    assert [s.get_session_options().intra_op_num_threads for s in sessions] == [2]
