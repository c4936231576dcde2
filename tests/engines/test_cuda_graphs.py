"""The GPU's serving engine without a GPU: the CUDA serving graphs (the new key/value scattered into the cache,
MultiHeadAttention over it, fp32 and fp16) and the engine that keeps its state in the device's memory, each step a
captured graph's replay, on the CPU provider under CUDA's binding and capture rules (``tests/conftest.py``).

Step by step, on imported checkpoints' choices and in fp16 against fp32: ``test_serving_engine.py`` (parametrized over
both serving engines). Here: whole test sets through the one search, and which engine a device gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file

from aiayn.core import contract
from aiayn.core.folder import ModelFolder
from aiayn.data.multi30k import load_parallel
from aiayn.engines import ONNX, ONNX_PORTABLE, WEIGHTS
from aiayn.engines.load import load_engine, place, translator_for
from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
from aiayn.engines.onnx.serving.device_buffers import GRAPH_ID, DeviceBuffers
from aiayn.engines.onnx.serving.engine import ServingEngine
from aiayn.engines.onnx.serving.graphs import build_serving_graphs, graphs_directory
from aiayn.engines.onnx.serving.host_buffers import HostBuffers
from aiayn.engines.onnx.serving.spec import HOST_READ, SCATTERED
from aiayn.engines.onnx.sessions import gpu_unavailable
from aiayn.engines.options import EngineOptions
from aiayn.engines.placement import Placement
from aiayn.evaluation.metrics import score
from aiayn.search.translator import SearchSettings

FP16_BLEU_MARGIN = 0.2


@pytest.mark.parametrize("name", ["en-de", "de-en"])
def test_all_test_sentences_translate_as_with_the_contract_graphs(
    bundled: dict[str, Path], multi30k_dir: Path, name: str
) -> None:
    """All 1000 of test_2016_flickr, greedy and beam 4, in the batches the translator makes: the same ids. Its
    time (about 15 s a pair) is what it proves: an id that differs in a few of 1000 (a beam's tie, a long source's
    last bits) would pass a sample of 50."""
    folder = ModelFolder.open(bundled[name])
    corpus = load_parallel("test_2016_flickr", folder.config.src_lang, folder.config.tgt_lang, multi30k_dir)
    portable = translator_for(folder, PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE)))
    cuda_graphs = translator_for(folder, ServingEngine.load(folder, Placement(for_gpu=True)))
    assert cuda_graphs.engine.ops.self_attention == SCATTERED  # type: ignore[attr-defined]
    src_ids = [portable.source_ids(s) for s in corpus.src]
    for beam in (1, 4):
        settings = SearchSettings.of(folder, beam_size=beam)
        assert cuda_graphs.translate_ids(src_ids, settings) == portable.translate_ids(src_ids, settings)


def test_fp16_graphs_score_within_0_2_bleu(bundled: dict[str, Path], multi30k_dir: Path) -> None:
    """The fp16 graphs that a GPU runs, here on the CPU provider: greedy BLEU on all of test_2016_flickr within 0.2
    of the fp32 serving graphs' (tests/cuda asks the same of them on CUDA, at beam 1 and 4)."""
    folder = ModelFolder.open(bundled["en-de"])
    corpus = load_parallel("test_2016_flickr", "en", "de", multi30k_dir)
    settings = SearchSettings.of(folder, beam_size=1)
    bleu = {}
    for variant in ("fp32", "fp16"):
        translator = translator_for(folder, ServingEngine.load(folder, Placement(variant=variant, for_gpu=True)))
        bleu[variant] = score(translator.translate(corpus.src, settings), corpus.tgt).bleu
    assert abs(bleu["fp16"] - bleu["fp32"]) <= FP16_BLEU_MARGIN, bleu


def test_each_device_gets_its_serving_engine(bundled: dict[str, Path]) -> None:
    """onnx is the serving engine on both devices; a variant with no serving graphs on a device runs the exported
    graphs there, and one built for the other device only is refused, saying what to use."""
    folder = ModelFolder.open(bundled["en-de"])
    for variant in ("fp32", "w8"):
        engine = load_engine(folder, EngineOptions(ONNX, "cpu", variant, lanes=1))
        assert isinstance(engine, ServingEngine) and isinstance(engine.buffers, HostBuffers)
    assert place(EngineOptions(ONNX, "cpu", "fp16")).engine == ONNX_PORTABLE
    with pytest.raises(ValueError, match="--variant w8 is built .* on a CPU"):
        load_engine(folder, EngineOptions(ONNX, "cuda", "w8", lanes=1))
    reason = gpu_unavailable(1)
    if not reason:
        pytest.skip("ONNX Runtime runs on a GPU here: tests/cuda covers it")
    with pytest.raises(ValueError, match="--device cuda: ONNX Runtime cannot run on a GPU here"):
        load_engine(folder, EngineOptions(ONNX, "cuda", "fp16", lanes=1))


def test_the_serving_engine_checks_itself_and_a_broken_one_never_serves(
    bundled: dict[str, Path], request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check at load: the true graphs pass it and serve; graphs built from a wrong weight fail it, and the
    exported graphs serve instead, with one line saying why."""
    folder = ModelFolder.open(bundled["en-de"])
    for variant in ("fp32", "fp16"):
        engine = load_engine(folder, Placement(variant=variant, for_gpu=True))
        assert isinstance(engine, ServingEngine) and isinstance(engine.buffers, DeviceBuffers)
    request.getfixturevalue("broken_gpu_graphs")
    engine = load_engine(folder, Placement(for_gpu=True))
    assert isinstance(engine, PortableOnnxEngine)
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1 and "differ from the CPU serving graphs' by up to" in message[0], message


# The inputs a CUDA kernel reads from host memory, by op (their kernel definitions' OrtMemTypeCPUInput): fed by
# anything but a graph input bound on the host, an initializer or a Shape node, ONNX Runtime would copy between host
# and device inside the step (a Memcpy node), and refuse to capture it.
HOST_INPUTS = {"Reshape": (1,), "Expand": (1,), "Slice": (1, 2, 3, 4), "TopK": (1,), "Unsqueeze": (1,), "Split": (1,)}


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_the_cuda_step_copies_nothing_between_host_and_device(bundled: dict[str, Path], variant: str) -> None:
    """Every host-read input of the CUDA decoder comes from a host-read graph input, an initializer or a Shape node,
    and the host-read graph inputs feed nothing else: the graph has no Memcpy for ONNX Runtime to refuse a capture
    over, and no kernel reads a position from the host."""
    folder = ModelFolder.open(bundled["en-de"])
    weights = load_file(str(folder.weights_file))
    with graphs_directory() as directory:
        ops = WEIGHTS[variant].serving["cuda"]
        _, decoder_path = build_serving_graphs(folder.config, weights, directory, ops=ops)
        graph = onnx.load(str(decoder_path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    shapes = {n.output[0] for n in graph.node if n.op_type == "Shape"}
    for node in graph.node:
        host = HOST_INPUTS.get(node.op_type, ())
        for i, name in enumerate(node.input):
            if i in host and name:
                assert name in initializers | shapes | HOST_READ, f"{node.op_type} {node.name} reads {name} on the host"
            elif name in HOST_READ:
                pytest.fail(f"{node.op_type} {node.name} reads the host-read {name} from the device")
    assert {n.op_type for n in graph.node}.isdisjoint({"GroupQueryAttention", "DecoderMaskedMultiHeadAttention"})


def test_a_file_runs_on_a_few_captured_graphs(bundled: dict[str, Path], multi30k_dir: Path) -> None:
    """The batches of 200 captions, greedy and beam 4, fall into a few buckets: each bucket's decoder (and the beam's
    reordering, per cache buffer) captured once and replayed (the rules of tests/conftest.py checked every replay)."""
    folder = ModelFolder.open(bundled["en-de"])
    corpus = load_parallel("test_2016_flickr", "en", "de", multi30k_dir).head(200)
    engine = ServingEngine.load(folder, Placement(for_gpu=True))
    translator = translator_for(folder, engine)
    buffers = engine.buffers
    assert isinstance(buffers, DeviceBuffers)
    for beam in (1, 4):
        translator.translate(corpus.src, SearchSettings.of(folder, beam_size=beam))
    assert 2 <= buffers.captured <= len(buffers.graphs) <= 24, (buffers.captured, len(buffers.graphs))
    replays = sum(runs - 2 for runs in buffers.runs.values() if runs > 2)  # after each one's ordinary run and capture
    assert replays > 3 * buffers.captured, buffers.runs


def test_a_replay_over_changed_bindings_is_caught(bundled: dict[str, Path]) -> None:
    """The dry run's capture rules are live: a host-read value written after its graph was captured (a GPU would
    replay the old one), or a graph replayed over another buffer, fails."""
    folder = ModelFolder.open(bundled["en-de"])
    engine = ServingEngine.load(folder, Placement(for_gpu=True))
    buffers = engine.buffers
    assert isinstance(buffers, DeviceBuffers)
    state = engine.start(np.array([[5, 6, 3]]))
    for _ in range(3):  # an ordinary run, the capture, a replay
        _, _, state = engine.step_top(state, np.array([[7]]), 4)
    (step,) = buffers.steps.values()
    step.group_shape[0] += 1
    with pytest.raises(pytest.fail.Exception, match="replayed over other bindings"):
        engine.step_top(state, np.array([[7]]), 4)
    step.group_shape[0] -= 1
    rebound = ort.OrtValue.ortvalue_from_shape_and_type(step.ids.shape(), np.int64, "cpu", 0)
    for binding in step.bindings.values():
        binding.bind_ortvalue_input(contract.TGT_IDS, rebound)
    state = engine.start(np.array([[5, 6, 3]]))
    with pytest.raises(pytest.fail.Exception, match="replayed over other bindings"):
        for _ in range(3):
            _, _, state = engine.step_top(state, np.array([[7]]), 4)


def test_a_larger_batch_moves_the_workspace_and_its_graphs_are_captured_anew(
    bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch larger than any before grows the workspace: the graphs captured over the old buffers are released
    (never replayed again), a smaller batch after it runs in the grown buffers, and the translations stay those of
    the CPU engine."""
    folder = ModelFolder.open(bundled["en-de"])
    engine = ServingEngine.load(folder, Placement(for_gpu=True))
    reference = translator_for(folder, ServingEngine.load(folder, Placement()))
    translator = translator_for(folder, engine)
    buffers = engine.buffers
    assert isinstance(buffers, DeviceBuffers)
    released: list[int] = []
    monkeypatch.setattr(ort.InferenceSession, "release_captured_graph", lambda _, graph: released.append(graph))
    sentences = ["A dog runs.", "Two children play in the snow near a red house with a very long fence around it."]
    generations, captured = [], []
    for batch in ([sentences[0]], sentences * 20, [sentences[0]]):
        settings = SearchSettings.of(folder, beam_size=4)
        assert translator.translate(batch, settings) == reference.translate(batch, settings)
        generations.append(buffers.workspace.generation)
        captured.append(
            {int(o.get_run_config_entry(GRAPH_ID)) for k, o in buffers.graphs.items() if buffers.runs[k] > 1}
        )
    assert generations[0] < generations[1] == generations[2]
    assert captured[0] and captured[0] <= set(released)  # the first batch's graphs
    assert set(released).isdisjoint(captured[2])  # and none that the buffers still hold
    assert all(key[1] == generations[2] for key in buffers.graphs)


def test_one_batch_at_a_time_on_the_device(bundled: dict[str, Path]) -> None:
    engine = ServingEngine.load(ModelFolder.open(bundled["en-de"]), Placement(for_gpu=True))
    first = engine.start(np.array([[5, 6, 3]]))
    engine.start(np.array([[8, 3]]))
    with pytest.raises(ValueError, match="a newer batch was started on this engine"):
        engine.step_top(first, np.array([[2]]), 1)


def test_a_capture_that_fails_on_the_device_leaves_ordinary_runs(
    bundled: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the device refuses to capture a step at run time, the engine says so in one line and runs that step
    ordinarily from then on, its translations unchanged."""
    folder = ModelFolder.open(bundled["en-de"])
    engine = ServingEngine.load(folder, Placement(for_gpu=True))
    run = ort.InferenceSession.run_with_iobinding

    def refusing(session: ort.InferenceSession, binding: ort.IOBinding, options: Any = None) -> None:
        if options is not None and options.get_run_config_entry(GRAPH_ID) != "-1":
            raise RuntimeError("CUDA failure 900: operation not permitted when stream is capturing")
        run(session, binding, options)

    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", refusing)
    sentences = ["A dog runs in the park.", "Two women sit on a bench."]
    settings = SearchSettings.of(folder, beam_size=4)
    reference = translator_for(folder, ServingEngine.load(folder, Placement())).translate(sentences, settings)
    assert translator_for(folder, engine).translate(sentences, settings) == reference
    assert engine.buffers.uncaptured.startswith("CUDA failure 900")  # type: ignore[attr-defined]
    lines = capsys.readouterr().err.strip().splitlines()
    said = "the serving engine runs a step without its CUDA graph: " + engine.buffers.uncaptured  # type: ignore[attr-defined]
    assert lines == [said] and engine.buffers.captured == 0  # type: ignore[attr-defined]
