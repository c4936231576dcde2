"""On a GPU (issues #24, #39): each CUDA engine against the CPU fp32 engine on all of test_2016_flickr, and the page.

- the serving engine on CUDA (``engines/onnx/serving/``: the serving graphs built for CUDA, the state on the
  device, each step a captured CUDA graph), fp32: the very ids of the CPU fp32 engines (the contract's graphs, and
  the CPU serving graphs), greedy and beam 4; fp16: BLEU within 0.2 of the CPU fp32 engine's, 99 % of its lines;
- the contract's fp32 graphs on CUDA, the decoder state bound on the device
  (``BoundIO``): the very ids of the CPU fp32 engine, greedy and beam 4;
- the contract's fp16 graphs (exported here, as `aiayn export --variant fp16` does) on CUDA: BLEU
  within 0.2 of the CPU fp32 engine's;
- `aiayn serve --device cuda`: the page's API answers, with the serving engine on the CUDA provider.

Every figure is also appended, one JSON line each, to $AIAYN_CUDA_TESTS_RESULTS
when it is set (``scripts/gpu_session.sh`` points it into $OUT).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aiayn.core.folder import ModelFolder
from aiayn.data.multi30k import TEST_SPLIT, ParallelCorpus
from aiayn.engines import ONNX, ONNX_PORTABLE
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
from aiayn.engines.onnx.portable.state_io import BoundIO
from aiayn.engines.onnx.serving.device_buffers import DeviceBuffers
from aiayn.engines.onnx.serving.engine import ServingEngine
from aiayn.engines.onnx.sessions import CPU, CUDA
from aiayn.engines.options import EngineOptions
from aiayn.engines.placement import Placement
from aiayn.evaluation.evaluate import load_split_for
from aiayn.evaluation.metrics import score
from aiayn.search.step import StepModel
from aiayn.search.translator import SearchSettings

pytestmark = pytest.mark.cuda

MODELS = ("en-de", "de-en")
Placed = Callable[[EngineOptions], Placement]  # the `placed` fixture: the GPU's placement, or its rehearsal
BEAMS = (1, 4)
FP16_BLEU_MARGIN = 0.2
FP16_IDENTICAL = 0.99  # of the serving graphs' lines, as CPU fp32's
STARTUP_TIMEOUT_S = 180


def provider_of(device: str) -> str:
    return CUDA if device == "cuda" else CPU


def record(**figures: Any) -> None:
    """One JSON line of figures into $AIAYN_CUDA_TESTS_RESULTS, if set."""
    path = os.environ.get("AIAYN_CUDA_TESTS_RESULTS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(figures) + "\n")


@functools.cache
def flickr(folder: Path, sentences: int) -> ParallelCorpus:
    return load_split_for(ModelFolder.open(folder), TEST_SPLIT).head(sentences)


def translate_ids(engine: StepModel[Any], folder: Path, beam: int, sentences: int) -> list[list[int]]:
    """test_2016_flickr's first ``sentences`` through the one search, with the folder's own search settings."""
    model = ModelFolder.open(folder)
    translator = translator_for(model, engine)
    src_ids = [translator.source_ids(s) for s in flickr(folder, sentences).src]
    return translator.translate_ids(src_ids, SearchSettings.of(model, beam_size=beam))


@functools.cache
def cpu_fp32_ids(folder: Path, beam: int, sentences: int) -> list[list[int]]:
    """The reference: the contract's fp32 graphs on the CPU provider, state on the host."""
    return translate_ids(PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE)), folder, beam, sentences)


def bleu(folder: Path, ids: list[list[int]], sentences: int) -> float:
    tokenizer = ModelFolder.open(folder).tokenizer
    return score([tokenizer.decode(o) for o in ids], flickr(folder, sentences).tgt).bleu


@pytest.fixture(scope="module", autouse=True)
def corpus_present(multi30k_dir: Path) -> Path:
    """test_2016_flickr is read from disk (the GPU machine reaches no network): skip, saying so, without it."""
    return multi30k_dir


@pytest.mark.parametrize("beam", BEAMS)
@pytest.mark.parametrize("name", MODELS)
def test_fp32_on_cuda_gives_the_ids_of_the_cpu_engine(
    bundled: dict[str, Path], device: str, placed: Placed, sentences: int, name: str, beam: int
) -> None:
    folder = bundled[name]
    engine = load_engine(ModelFolder.open(folder), placed(EngineOptions(ONNX_PORTABLE, "cuda")))
    assert isinstance(engine, PortableOnnxEngine) and isinstance(engine.io, BoundIO)
    assert engine.provider == provider_of(device)
    started = time.perf_counter()
    ids = translate_ids(engine, folder, beam, sentences)
    seconds = time.perf_counter() - started
    reference = cpu_fp32_ids(folder, beam, sentences)
    differing = [i for i, (a, b) in enumerate(zip(ids, reference, strict=True)) if a != b]
    record(
        test="fp32",
        device=device,
        model=name,
        beam=beam,
        sentences=len(ids),
        differing=len(differing),
        seconds=round(seconds, 2),
    )
    assert not differing, f"{len(differing)} of {len(ids)} sentences differ from the CPU fp32 engine: {differing[:10]}"


@pytest.mark.parametrize("beam", BEAMS)
@pytest.mark.parametrize("name", MODELS)
def test_the_serving_engine_on_cuda_gives_the_ids_of_the_cpu_engines(
    bundled: dict[str, Path], device: str, placed: Placed, sentences: int, name: str, beam: int
) -> None:
    folder = bundled[name]
    engine = load_engine(ModelFolder.open(folder), placed(EngineOptions(ONNX, "cuda")))
    assert isinstance(engine, ServingEngine) and isinstance(engine.buffers, DeviceBuffers)
    assert engine.provider == provider_of(device)
    started = time.perf_counter()
    ids = translate_ids(engine, folder, beam, sentences)
    seconds = time.perf_counter() - started
    references = {
        "contract graphs": cpu_fp32_ids(folder, beam, sentences),
        "cpu serving graphs": translate_ids(ServingEngine.load(folder, Placement()), folder, beam, sentences),
    }
    differing = {
        reference: [i for i, (a, b) in enumerate(zip(ids, theirs, strict=True)) if a != b]
        for reference, theirs in references.items()
    }
    record(
        test="serving fp32",
        device=device,
        model=name,
        beam=beam,
        sentences=len(ids),
        differing={reference: len(rows) for reference, rows in differing.items()},
        seconds=round(seconds, 2),
    )
    for reference, rows in differing.items():
        assert not rows, f"{len(rows)} of {len(ids)} sentences differ from the {reference}: {rows[:10]}"


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_the_serving_engine_passes_its_self_check_on_the_device(
    bundled: dict[str, Path], device: str, placed: Placed, variant: str
) -> None:
    """What `--engine onnx` loads on the device is the serving engine, checked against the CPU serving graphs at load
    (not the exported graphs it falls back to when the check fails)."""
    where = placed(EngineOptions(ONNX, "cuda", variant))
    assert where.checked and where.for_gpu and where.lanes == 1
    engine = load_engine(ModelFolder.open(bundled["en-de"]), where)
    record(test="self-check", device=device, variant=variant, engine=type(engine).__name__)
    assert isinstance(engine, ServingEngine) and isinstance(engine.buffers, DeviceBuffers)
    assert engine.provider == provider_of(device)


def test_a_serving_engine_that_fails_its_check_never_serves(
    bundled: dict[str, Path], placed: Placed, broken_gpu_graphs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The device's serving graphs built with a wrong weight: the check at load refuses them, and the exported graphs
    serve instead, saying why in one line."""
    engine = load_engine(ModelFolder.open(bundled["en-de"]), placed(EngineOptions(ONNX, "cuda")))
    assert isinstance(engine, PortableOnnxEngine)
    assert "differ from the CPU serving graphs' by up to" in capsys.readouterr().err


@pytest.fixture(scope="module")
def fp16_folders(bundled: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Copies of the bundled folders with the fp16 graphs added, as `aiayn export --variant fp16` writes them."""
    pytest.importorskip("torch", reason="exporting the fp16 graphs needs PyTorch")
    from aiayn.export.onnx_export import export_onnx
    from aiayn.model.weights import load_model

    folders = {}
    for name in MODELS:
        copy = tmp_path_factory.mktemp(f"{name}-fp16") / name
        shutil.copytree(bundled[name], copy)
        export_onnx(load_model(copy), copy, ("fp16",))
        folders[name] = copy
    return folders


@pytest.mark.parametrize("beam", BEAMS)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("graphs", ["serving", "contract"])
def test_fp16_on_cuda_scores_within_0_2_bleu_of_cpu_fp32(
    bundled: dict[str, Path],
    request: pytest.FixtureRequest,
    device: str,
    placed: Placed,
    sentences: int,
    name: str,
    beam: int,
    graphs: str,
) -> None:
    """The serving graphs built in fp16 (no export needed), and the contract's fp16 graphs as exported; the serving
    graphs' lines also at least 99 % those of CPU fp32."""
    if graphs == "serving":
        folder = bundled[name]
        engine: Any = load_engine(ModelFolder.open(folder), placed(EngineOptions(ONNX, "cuda", "fp16")))
        assert isinstance(engine, ServingEngine)
    else:
        folder = request.getfixturevalue("fp16_folders")[name]
        engine = load_engine(ModelFolder.open(folder), placed(EngineOptions(ONNX_PORTABLE, "cuda", "fp16")))
    assert engine.provider == provider_of(device)
    started = time.perf_counter()
    ids = translate_ids(engine, folder, beam, sentences)
    seconds = time.perf_counter() - started
    reference = cpu_fp32_ids(bundled[name], beam, sentences)
    fp16, fp32 = bleu(folder, ids, sentences), bleu(bundled[name], reference, sentences)
    identical = sum(a == b for a, b in zip(ids, reference, strict=True))
    record(
        test=f"{graphs} fp16",
        device=device,
        model=name,
        beam=beam,
        sentences=sentences,
        bleu_fp16=round(fp16, 2),
        bleu_cpu_fp32=round(fp32, 2),
        identical=identical,
        seconds=round(seconds, 2),
    )
    assert abs(fp16 - fp32) <= FP16_BLEU_MARGIN, f"fp16 BLEU {fp16:.2f} against CPU fp32 {fp32:.2f}"
    if graphs == "serving":
        assert identical >= FP16_IDENTICAL * len(ids), f"{identical} of {len(ids)} lines as CPU fp32's"


@pytest.fixture(scope="module")
def page(device: str, tmp_path_factory: pytest.TempPathFactory, serve_page: Any) -> Iterator[str]:
    """`aiayn serve --device cuda` as a process on loopback; its URL once it says it serves."""
    pytest.importorskip("gradio_client")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_page(["--device", device], log, STARTUP_TIMEOUT_S) as served:
        assert f"on {provider_of(device)} (onnx engine)" in log.read_text()  # the serving engine
        yield served.url


def test_the_page_on_cuda_answers_through_the_api(page: str, device: str) -> None:
    from gradio_client import Client

    client = Client(page, verbose=False)
    for direction, sentence, expected in (
        ("en-de", "Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
        ("de-en", "Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
    ):
        text, status = client.predict(sentence, direction, 4, api_name="/translate")
        record(test="page", device=device, direction=direction, translation=text, status=status)
        assert text == expected
        assert status.endswith(f" on {provider_of(device)}"), status
