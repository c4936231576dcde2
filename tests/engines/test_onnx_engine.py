"""The ONNX Runtime engine: folder checks with clear errors, devices, I/O binding, and exact parity with PyTorch."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from aiayn.core.contract import IR_VERSION, OPSET
from aiayn.core.folder import ModelFolder
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.engines import ONNX_PORTABLE
from aiayn.engines.load import load_engine
from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
from aiayn.engines.onnx.portable.state_io import BoundIO, HostIO
from aiayn.engines.onnx.portable.top_k import with_top_k_head
from aiayn.engines.onnx.sessions import CUDA, DeviceUnavailable, gpu_unavailable, inference_session, session_options
from aiayn.engines.onnx.tiny_graphs import gather_model
from aiayn.engines.options import EngineOptions
from aiayn.engines.placement import Placement
from aiayn.engines.pytorch import TorchEngine
from aiayn.model.weights import load_model
from aiayn.search.step import FullDistributionStep, top_columns
from aiayn.search.translator import SearchSettings, Translator

REAL_SENTENCES = {
    "en-de": [
        "Two dogs play in the snow.",
        "A man in a blue shirt is riding a bike down the street.",
        "A girl jumps into the pool.",
        "Three people are sitting on a bench in front of a building.",
        "A woman with a red hat sells flowers at a small market.",
    ],
    "de-en": [
        "Zwei Hunde spielen im Schnee.",
        "Ein Mann in einem blauen Hemd fährt mit dem Fahrrad.",
        "Ein Mädchen springt in den Pool.",
    ],
}


def copy_folder(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(folder, target)
    return target


def test_missing_files_are_named_with_the_fix(tiny_folder: Path, tmp_path: Path) -> None:
    folder = copy_folder(tiny_folder, tmp_path)
    (folder / "encoder.onnx").unlink()
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks tokenizer\.json, encoder\.onnx; re-export .*aiayn export"):
        PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE))
    with pytest.raises(FileNotFoundError, match=r"encoder\.int8\.onnx.*--variant int8"):
        PortableOnnxEngine.load(tiny_folder.parent / "nowhere", Placement(ONNX_PORTABLE, variant="int8"))


def test_a_corrupt_graph_is_refused_in_one_line(tiny_folder: Path, tmp_path: Path) -> None:
    folder = copy_folder(tiny_folder, tmp_path)
    (folder / "decoder.onnx").write_bytes(b"not a protobuf")
    with pytest.raises(ValueError, match=r"ONNX Runtime cannot load .*decoder\.onnx: .*; re-export") as err:
        PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE))
    assert "\n" not in str(err.value)


def test_weights_that_do_not_match_the_export_are_refused(tiny_folder: Path, tmp_path: Path) -> None:
    folder = copy_folder(tiny_folder, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\1")
    with pytest.raises(
        ValueError, match=r"encoder\.onnx was exported from other weights .*hash mismatch.*aiayn export"
    ):
        PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE))


def test_a_wrong_input_dtype_is_refused(tiny_folder: Path, tmp_path: Path) -> None:
    """An encoder that takes int32 ids (cast inside) still runs, but breaks the contract: refused by name."""
    folder = copy_folder(tiny_folder, tmp_path)
    model = onnx.load(str(folder / "encoder.onnx"))
    for node in model.graph.node:
        node.input[:] = ["src_ids_int64" if name == "src_ids" else name for name in node.input]
    model.graph.node.insert(0, helper.make_node("Cast", ["src_ids"], ["src_ids_int64"], to=TensorProto.INT64))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    onnx.save(model, str(folder / "encoder.onnx"))
    with pytest.raises(ValueError, match=r"input src_ids is tensor\(int32\), the contract says tensor\(int64\)"):
        PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE))


def test_unknown_device_and_unusable_cuda_give_clear_errors(tiny_folder: Path) -> None:
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        EngineOptions(ONNX_PORTABLE, "gpu")
    try:
        engine = load_engine(ModelFolder.open(tiny_folder), EngineOptions(ONNX_PORTABLE, "cuda"))
    except ValueError as err:
        assert "--device cuda" in str(err) and "--device cpu" in str(err) and "\n" not in str(err)
    else:
        assert isinstance(engine, PortableOnnxEngine) and engine.provider == CUDA and isinstance(engine.io, BoundIO)
    if gpu_unavailable(1):  # a placement made without the probe: the session itself refuses, naming the file
        with pytest.raises(DeviceUnavailable, match="--device cuda: ONNX Runtime cannot run encoder.onnx on a GPU"):
            PortableOnnxEngine.load(tiny_folder, Placement(ONNX_PORTABLE, on_gpu=True))


def test_auto_device_states_the_provider_and_shows_no_onnx_runtime_log(tiny_folder: Path) -> None:
    code = (
        "from aiayn.core.folder import ModelFolder; from aiayn.engines.load import load_engine; "
        "from aiayn.engines.options import EngineOptions; "
        f"print(load_engine(ModelFolder.open({str(tiny_folder)!r}), EngineOptions('onnx-portable', 'auto')).provider)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() in {"CPUExecutionProvider", CUDA}
    assert "onnxruntime" not in result.stderr, result.stderr


def test_gather_graph_is_valid_onnx_and_selects_rows() -> None:
    tensors = [("bool", 2), ("float32", 4), ("float32", 4)]
    model = gather_model(tensors)
    onnx.checker.check_model(onnx.load_from_string(model), full_check=True)
    rng = np.random.default_rng(0)
    values = [rng.random((3, 5)) > 0.5, rng.random((3, 2, 4, 8), dtype=np.float32), np.zeros((3, 2, 0, 8), np.float32)]
    rows = np.array([2, 2, 0, 1, 0])
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    outputs = session.run(None, {**{f"data_{i}": v for i, v in enumerate(values)}, "rows": rows})
    for value, out in zip(values, outputs, strict=True):
        assert out.dtype == value.dtype and np.array_equal(out, value[rows])


def test_a_session_of_a_serialized_graph_does_not_keep_its_bytes() -> None:
    model = gather_model([("float32", 2)])
    session = inference_session(model, session_options(1), ["CPUExecutionProvider"])
    kept = [value for value in vars(session).values() if isinstance(value, bytes) and len(value) >= len(model)]
    assert kept == []  # ONNX Runtime keeps the bytes it is given, and only the path of a file
    rows = np.array([1, 0])
    (out,) = session.run(None, {"data_0": np.eye(2, dtype=np.float32), "rows": rows})
    assert np.array_equal(out, np.eye(2, dtype=np.float32)[rows])


def test_top_k_head_is_valid_onnx_and_keeps_the_contract(tiny_folder: Path) -> None:
    exported = (tiny_folder / "decoder.onnx").read_bytes()
    served = onnx.load_from_string(with_top_k_head(exported))
    onnx.checker.check_model(served, full_check=True)
    original = onnx.load_from_string(exported)
    assert [i.name for i in served.graph.input] == [i.name for i in original.graph.input] + ["top_k"]
    assert [o.name for o in served.graph.output] == [o.name for o in original.graph.output] + [
        "top_log_probs",
        "top_ids",
    ]
    assert len(served.graph.node) == len(original.graph.node) + 1 and served.graph.node[-1].op_type == "TopK"
    assert served.metadata_props == original.metadata_props  # the stamps the engine checks survive


def test_top_k_head_breaks_ties_by_the_lower_id_like_the_numpy_search() -> None:
    """A stand-in decoder whose ``log_probs`` is its input, with many exactly equal values, through the head."""
    values = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "new_len", "vocab"])
    log_probs = helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["batch", "new_len", "vocab"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["log_probs"])], "ties", [values], [log_probs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    session = ort.InferenceSession(with_top_k_head(model.SerializeToString()), providers=["CPUExecutionProvider"])
    x = np.round(np.random.default_rng(0).normal(size=(6, 1, 50))).astype(np.float32)  # a few distinct values
    for k in (1, 5, 17):
        top_values, top_ids = session.run(["top_log_probs", "top_ids"], {"x": x, "top_k": np.array([k])})
        want = top_columns(x[:, -1], k)
        assert np.array_equal(top_ids[:, -1], want)
        assert np.array_equal(top_values[:, -1], np.take_along_axis(x[:, -1], want, axis=1))


class NumpyTop(FullDistributionStep[object]):
    """The k best of an engine's full distribution, chosen by NumPy (what the PyTorch engine does)."""

    def __init__(self, engine: PortableOnnxEngine) -> None:
        self.engine = engine

    def step(self, state: object, tgt_ids: np.ndarray) -> tuple[np.ndarray, object]:
        return self.engine.step(state, tgt_ids)


@pytest.mark.parametrize("io_binding", [False, True])
def test_step_top_equals_the_k_best_of_the_full_distribution(tiny_folder: Path, io_binding: bool) -> None:
    engine = PortableOnnxEngine.load(tiny_folder, Placement(ONNX_PORTABLE, for_gpu=io_binding))
    src = np.array([[5, 6, 7, 3], [8, 3, 0, 0]])
    tgt = np.array([[2, 9, 10], [2, 11, 12]])
    for k in (1, 4, 8, 500):  # 500 is more than the vocabulary (120): all of it, best first
        values, ids, _ = engine.step_top(engine.start(src), tgt, k)
        want_values, want_ids, _ = NumpyTop(engine).step_top(engine.start(src), tgt, k)
        assert ids.shape == (2, min(k, engine.vocab_size)) and ids.dtype == np.int64
        assert np.array_equal(ids, want_ids) and np.array_equal(values, want_values)


def host(value: object) -> np.ndarray:
    return value.numpy() if isinstance(value, ort.OrtValue) else np.asarray(value)


@pytest.mark.parametrize("io_binding", [False, True])
def test_select_copies_the_source_side_only_when_rows_change_sentence(tiny_folder: Path, io_binding: bool) -> None:
    engine = PortableOnnxEngine.load(tiny_folder, Placement(ONNX_PORTABLE, for_gpu=io_binding))
    state = engine.select(engine.start(np.array([[5, 6, 7, 3], [8, 3, 0, 0]])), np.array([0, 0, 1, 1]))
    _, state = engine.step(state, np.array([[2], [2], [2], [2]]))
    within = engine.select(state, np.array([1, 0, 3, 3]))  # beams reordered inside their sentences
    assert within.cross is state.cross and within.src_mask is state.src_mask
    assert np.array_equal(host(within.past[0]), host(state.past[0])[[1, 0, 3, 3]])
    dropped = engine.select(state, np.array([2, 3]))  # the first sentence is done
    assert np.array_equal(host(dropped.cross[0]), host(state.cross[0])[[2, 3]]) and dropped.sources.tolist() == [1, 1]
    assert np.array_equal(host(dropped.src_mask), host(state.src_mask)[[2, 3]])
    assert np.array_equal(host(dropped.past[1]), host(state.past[1])[[2, 3]])


def test_io_binding_path_equals_the_host_path(tiny_folder: Path) -> None:
    """The GPU code path (state as OrtValues, Gather on the device) run with CPU OrtValues."""
    host = PortableOnnxEngine.load(tiny_folder, Placement(ONNX_PORTABLE))
    bound = PortableOnnxEngine.load(tiny_folder, Placement(ONNX_PORTABLE, for_gpu=True))
    assert isinstance(bound.io, BoundIO) and isinstance(host.io, HostIO)
    tokenizer = SubwordTokenizer.load(tiny_folder / "tokenizer.json")
    sentences = ["the red cat sleeps.", "a small dog runs after two blue birds!", "das rote Haus"] * 3
    for beam in (1, 3):
        settings = SearchSettings(beam_size=beam, max_extra_len=12)
        assert Translator(bound, tokenizer, 64).translate(sentences, settings) == Translator(
            host, tokenizer, 64
        ).translate(sentences, settings)
    src, out = np.array([[5, 6, 7, 3]]), np.array([[2, 9, 10, 11]])
    assert np.allclose(bound.cross_attention(src, out), host.cross_attention(src, out), atol=1e-6)


@pytest.mark.parametrize("name", ["en-de", "de-en"])
def test_onnx_translations_equal_pytorch_exactly(bundled: dict[str, Path], name: str) -> None:
    """Real sentences through the one NumPy search: greedy and beam 4 give token-identical outputs."""
    folder = bundled[name]
    tokenizer = SubwordTokenizer.load(folder / "tokenizer.json")
    onnx_translator = Translator(PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE)), tokenizer, 1024)
    torch_translator = Translator(TorchEngine(load_model(folder)), tokenizer, 1024)
    src_ids = [onnx_translator.source_ids(s) for s in REAL_SENTENCES[name]]
    for beam in (1, 4):
        settings = SearchSettings(beam_size=beam)
        assert onnx_translator.translate_ids(src_ids, settings) == torch_translator.translate_ids(src_ids, settings)
    first = tokenizer.decode(onnx_translator.translate_ids(src_ids[:1], SearchSettings())[0])
    assert first == {"en-de": "Zwei Hunde spielen im Schnee.", "de-en": "Two dogs play in the snow."}[name]
