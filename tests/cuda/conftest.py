"""The `cuda` marker: these tests need ONNX Runtime really running on a GPU, and say why they skip where it does not.

Whether CUDA works is decided by a real session's ``get_providers()``, never by
``ort.get_available_providers()``, which lists CUDA in every onnxruntime-gpu
build, GPU or not. ``scripts/gpu_session.sh``'s dry run sets
``AIAYN_CUDA_TESTS_DEVICE=cpu``: the same tests then run on the CPU (through the
same I/O binding code path), so that their own code is proven before a GPU's
minutes are spent on it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from aiayn.engines import load
from aiayn.engines.load import place
from aiayn.engines.onnx.sessions import try_cuda
from aiayn.engines.onnx.tiny_graphs import gather_model
from aiayn.engines.options import EngineOptions
from aiayn.engines.placement import Placement

DEVICE = os.environ.get("AIAYN_CUDA_TESTS_DEVICE", "cuda")  # cpu: the dry run only
SENTENCES = int(os.environ.get("AIAYN_CUDA_TESTS_SENTENCES", "1000"))  # test_2016_flickr has 1000


@functools.cache
def no_cuda_reason() -> str:
    """Empty where ONNX Runtime runs a session on CUDA here, else why not (its own error, captured)."""
    session, reason = try_cuda(Path("a one-node Gather graph"), 1, gather_model([("float32", 1)]))
    return "" if session is not None else reason


@pytest.fixture(scope="session")
def device() -> str:
    """Where the tests' engines run: cuda, or cpu in the dry run."""
    return DEVICE


@pytest.fixture
def placed(device: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[EngineOptions], Placement]:
    """The placement of ``--device cuda`` options, as ``load_engine`` gets it: on the GPU; in the dry run, the same
    decision (the probe told the GPU works) rehearsed on the CPU provider."""

    def on_the_gpu(options: EngineOptions) -> Placement:
        if DEVICE == "cuda":
            return place(options)
        with monkeypatch.context() as probe:
            probe.setattr(load, "gpu_unavailable", lambda threads: "")
            return place(options).rehearsal()

    return on_the_gpu


@pytest.fixture(scope="session")
def sentences() -> int:
    """How many test_2016_flickr sentences each comparison translates (all 1000, or a few in the dry run)."""
    return SENTENCES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked or DEVICE != "cuda":
        return
    reason = no_cuda_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"no working CUDA for ONNX Runtime here: {reason}")
        for item in marked:
            item.add_marker(skip)
