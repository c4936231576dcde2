"""The serving engines (graphs built from the weights) against the contract's graphs and PyTorch: the CPU engine,
and the CUDA graphs with their device state back end, run on the CPU provider (``device_buffers.py``).

Every step of greedy-like and beam-like plans (steps, beams reordered within their sentences, sentences
leaving, blocks reordered, rows repeated across sentences) must give the same k best tokens and
log-probabilities within 1e-4; real sentences must translate identically.
"""

from __future__ import annotations

import errno
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from aiayn.core.config import ModelConfig
from aiayn.core.contract import OPSET
from aiayn.core.folder import MODEL_SECTION, ModelFolder
from aiayn.data.multi30k import load_parallel
from aiayn.engines import ONNX, ONNX_PORTABLE, TORCH
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.onnx.external_data import ExternalData
from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
from aiayn.engines.onnx.serving.engine import ServingEngine
from aiayn.engines.onnx.serving.graph_builder import GraphBuilder
from aiayn.engines.onnx.serving.graphs import two_stage_top_k
from aiayn.engines.onnx.serving.host_buffers import HostBuffers
from aiayn.engines.onnx.serving.spec import CPU_OPS, serving_decoder_spec, serving_encoder_spec
from aiayn.engines.onnx.sessions import CPU, check_built_graph, graph_problems, open_session
from aiayn.engines.options import EngineOptions
from aiayn.engines.placement import Placement
from aiayn.export.parity import count_identical, max_log_prob_diff
from aiayn.search.translator import SearchSettings

TOLERANCE = 1e-4
FP16_TOLERANCE = 0.05  # log-probabilities of the fp16 graphs against fp32's (rounding of activations only)
Engines = tuple[PortableOnnxEngine, ServingEngine[Any]]


@pytest.fixture(scope="module")
def model_dir(bundled: dict[str, Path]) -> Path:
    return bundled["en-de"]


@pytest.fixture(scope="module", params=["cpu graphs", "cuda graphs on the cpu provider"])
def engines(model_dir: Path, request: pytest.FixtureRequest) -> Engines:
    if request.param == "cpu graphs":
        return PortableOnnxEngine.load(model_dir, Placement(ONNX_PORTABLE)), ServingEngine.load(model_dir, Placement())
    return PortableOnnxEngine.load(model_dir, Placement(ONNX_PORTABLE)), ServingEngine.load(
        model_dir, Placement(for_gpu=True)
    )


def random_sources(rng: np.random.Generator, batch: int, vocab: int = 10000) -> np.ndarray:
    lengths = rng.integers(2, 12, batch)
    src = np.zeros((batch, lengths.max()), dtype=np.int64)
    for r, n in enumerate(lengths):
        src[r, : n - 1] = rng.integers(4, vocab, n - 1)
        src[r, n - 1] = 3  # </s>
    return src


def compare(ref: Any, ours: ServingEngine[Any], src: np.ndarray, plan: list[str], seed: int) -> None:
    """Drive both engines through ``plan`` (steps and selections of several kinds) and compare every step."""
    rng = np.random.default_rng(seed)
    a, b = ref.start(src), ours.start(src)
    rows, group = src.shape[0], 1
    for action in plan:
        if action == "step":
            tgt = rng.integers(4, ours.config.vocab_size, (rows, 1))
            va, ia, a = ref.step_top(a, tgt, 8)
            vb, ib, b = ours.step_top(b, tgt, 8)
            assert np.abs(va - vb).max() <= TOLERANCE
            assert (ia == ib).all()
            continue
        if action == "beam":  # k copies of each sentence, before any step
            group = 4
            sel = np.repeat(np.arange(rows), group)
        elif action == "reorder":  # within each sentence block, any parents (repeats included)
            sel = (np.arange(rows // group)[:, None] * group + rng.integers(0, group, (rows // group, group))).ravel()
        elif action == "drop":  # some sentences leave (blocks kept in order)
            keep = np.sort(rng.choice(rows // group, max(1, rows // group - 2), replace=False))
            sel = (keep[:, None] * group + np.arange(group)).ravel()
        elif action == "shuffle":  # sentence blocks reordered
            order = rng.permutation(rows // group)
            sel = (order[:, None] * group + np.arange(group)).ravel()
        else:  # "any": rows repeated across sentences; the engine falls back to a general gather
            sel = rng.integers(0, rows, rows + 3)
            group = 1
        a, b = ref.select(a, sel), ours.select(b, sel)
        rows = sel.size


@pytest.mark.parametrize("seed", range(4))
def test_greedy_like(engines: Engines, seed: int) -> None:
    src = random_sources(np.random.default_rng(seed), 9)
    compare(*engines, src, ["step", "step", "drop", "step", "drop", "step", "drop", "step", "step"], seed)


@pytest.mark.parametrize("seed", range(4))
def test_beam_like(engines: Engines, seed: int) -> None:
    src = random_sources(np.random.default_rng(seed), 7)
    plan = ["beam", "step", "reorder", "step", "reorder", "step", "drop", "reorder", "step", "shuffle", "step"]
    compare(*engines, src, plan + ["drop", "reorder", "step", "any", "step", "step"], seed)


def test_beam_past_the_first_capacity(engines: Engines) -> None:
    """A beam longer than a cache's first positions (the CUDA cache grows on the device, reordered all along)."""
    src = random_sources(np.random.default_rng(7), 3)
    compare(*engines, src, ["beam"] + ["step", "reorder"] * 40 + ["step"], 7)


def test_consumed_state_refused(engines: Engines) -> None:
    _, ours = engines
    state = ours.start(np.array([[5, 6, 3]]))
    ours.step_top(state, np.array([[2]]), 1)
    with pytest.raises(ValueError, match="already used"):
        ours.step_top(state, np.array([[2]]), 1)


def test_capacity_grows(engines: Engines) -> None:
    """More steps than the buffer was sized for (source length + 50): the cache grows and stays right."""
    ref, ours = engines
    src = np.array([[5, 3]])
    plan = ["step"] * 60
    compare(ref, ours, src, plan, 0)


def test_whole_distribution(engines: Engines) -> None:
    ref, ours = engines
    src = random_sources(np.random.default_rng(5), 3)
    a, b = ref.start(src), ours.start(src)
    for _ in range(3):
        tgt = np.full((3, 1), 7)
        la, a = ref.step(a, tgt)
        lb, b = ours.step(b, tgt)
        assert np.abs(la - lb).max() <= TOLERANCE


def test_the_built_graphs_follow_their_declarations(engines: Engines) -> None:
    """The builder and the binding read one declaration (``core/contract.py``); the engine checks it on load."""
    _, ours = engines
    encoder, decoder = serving_encoder_spec(ours.config, ours.ops), serving_decoder_spec(ours.config, ours.ops)
    for session, spec in ((ours.buffers.encoder, encoder), (ours.buffers.decoder, decoder)):
        assert graph_problems(session, spec) == []
    renamed = replace(encoder, outputs=(replace(encoder.outputs[0], name="memory"),))
    with pytest.raises(ValueError, match="serving encoder that aiayn built .* outputs are \\['cross_kv'\\]"):
        check_built_graph(ours.buffers.encoder, renamed)


def test_the_graphs_leave_no_files_and_a_full_disk_says_how_to_make_room(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serving graphs are written to a temporary directory only while the sessions are built."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    ServingEngine.load(model_dir, Placement())
    assert list(tmp_path.iterdir()) == []

    def no_space(self: ExternalData, name: str, value: np.ndarray) -> onnx.TensorProto:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ExternalData, "reference", no_space)
    message = f"cannot write the serving graphs to {tmp_path} .No space left on device.*TMPDIR"
    with pytest.raises(ValueError, match=message):
        ServingEngine.load(model_dir, Placement())
    assert list(tmp_path.iterdir()) == []


def test_two_stage_top_k_is_exact(tmp_path: Path) -> None:
    """Same values and ids as a stable descending sort, ties included, for any k."""
    g = GraphBuilder({}, ExternalData(tmp_path / "unused.bin"))  # its constants are all small: inline
    two_stage_top_k(g, "x", "k", 100, 10000, ["v", "i"])
    g.external.close()
    graph = onnx.helper.make_graph(
        g.nodes,
        "t",
        [onnx.helper.make_tensor_value_info("x", 1, ["r", 10000]), onnx.helper.make_tensor_value_info("k", 7, [1])],
        [onnx.helper.make_tensor_value_info("v", 1, None), onnx.helper.make_tensor_value_info("i", 7, None)],
        g.initializers,
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for trial in range(60):
        k = int(rng.choice([1, 2, 8, 100, 150]))
        x = rng.standard_normal((5, 10000)).astype(np.float32)
        if trial % 2:
            x = np.round(x * 2) / 2  # many ties
        values, ids = session.run(None, {"x": x, "k": np.array([k])})
        expected = np.argsort(-x, axis=1, kind="stable")[:, :k]
        assert np.array_equal(ids, expected)
        assert np.array_equal(values, np.take_along_axis(x, expected, axis=1))


@pytest.mark.parametrize(
    "changes",
    [
        {"norm_first": False},  # the paper's post-LN
        {"norm_first": True, "vocab_size": 997, "n_heads": 2},  # a prime vocabulary: plain TopK, no blocks
        {"norm_first": True, "n_encoder_layers": 1, "n_decoder_layers": 3, "d_ff": 48},
    ],
)
def test_random_models_against_torch(changes: dict[str, object], tmp_path: Path) -> None:
    """Tiny random models (the torch reference builds them; the engine sees only their weights as NumPy)."""
    torch = pytest.importorskip("torch")
    from aiayn.engines.onnx.serving.graphs import build_serving_graphs
    from aiayn.engines.pytorch import TorchEngine
    from aiayn.model.transformer import Transformer

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=600, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2)
    config = config.replace(**changes)
    model = Transformer(config).eval()
    with torch.no_grad():  # non-trivial norms and biases, so that every weight matters
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    encoder, decoder = build_serving_graphs(config, weights, tmp_path)
    sessions = (open_session(graph, [CPU], 1) for graph in (encoder, decoder))
    folder = ModelFolder(tmp_path, sections={MODEL_SECTION: config.to_dict()})  # the config only: no files
    ours = ServingEngine(folder, CPU_OPS, HostBuffers(config, *sessions, 1))
    ref = TorchEngine(model)
    for batch in (1, 9):
        src = random_sources(np.random.default_rng(batch), batch, config.vocab_size)
        compare(ref, ours, src, ["beam", "step", "reorder", "step", "drop", "step", "reorder", "step"], batch)


@pytest.mark.parametrize("name", ["en-de", "de-en"])
def test_real_sentences_translate_identically(bundled: dict[str, Path], multi30k_dir: Path, name: str) -> None:
    """The first 200 test sentences, greedy and beam 4, in the batches the translator makes."""
    folder = ModelFolder.open(bundled[name])
    corpus = load_parallel("test_2016_flickr", folder.config.src_lang, folder.config.tgt_lang, multi30k_dir)
    portable = translator_for(folder, PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE)))
    fused = translator_for(folder, ServingEngine.load(folder, Placement()))
    src_ids = [portable.source_ids(s) for s in corpus.src[:200]]
    for beam in (1, 4):
        settings = SearchSettings(beam_size=beam)
        assert fused.translate_ids(src_ids, settings) == portable.translate_ids(src_ids, settings)


@pytest.fixture(scope="module", params=["marian_like_folder", "marian_gelu_folder"])
def imported_like(request: pytest.FixtureRequest) -> ModelFolder:
    """The tiny folders with an imported checkpoint's choices (``tests/conftest.py``): SiLU, sin | cos halves; erf
    GELU, unscaled embeddings; both with a logits bias and <pad> as the start token, never generated."""
    return ModelFolder.open(request.getfixturevalue(request.param))


def imported_sources(config: ModelConfig, n: int = 50) -> list[list[int]]:
    """``n`` random sources of 1–12 ordinary ids (neither </s> at 0 nor <pad> at the end) and </s>."""
    rng = np.random.default_rng(0)
    eos = config.special_tokens.eos
    return [[*rng.integers(2, config.vocab_size - 1, rng.integers(1, 13)).tolist(), eos] for _ in range(n)]


@pytest.mark.parametrize("graphs", ["cpu graphs", "cuda graphs on the cpu provider"])
def test_imported_choices_against_the_contract_graphs_and_torch(imported_like: ModelFolder, graphs: str) -> None:
    """The serving graphs honour every choice of the config: the same log-probabilities as the contract's graphs
    and PyTorch at every step, and the same greedy and beam-4 outputs."""
    pytest.importorskip("torch")
    folder = imported_like
    if graphs == "cpu graphs":
        fused: Any = load_engine(folder, EngineOptions(ONNX, "cpu", lanes=1))
        assert isinstance(fused.buffers, HostBuffers)
    else:
        fused = ServingEngine.load(folder, Placement(for_gpu=True))
    portable = load_engine(folder, EngineOptions(ONNX_PORTABLE, "cpu", lanes=1))
    torch_engine = load_engine(folder, EngineOptions(TORCH))
    src_ids = imported_sources(folder.config)
    for reference in (torch_engine, portable):
        assert max_log_prob_diff(reference, fused, src_ids).max_abs_diff <= TOLERANCE
    translators = [translator_for(folder, engine) for engine in (torch_engine, portable, fused)]
    for beam in (1, 4):
        settings = SearchSettings(beam_size=beam)
        for reference in translators[:2]:
            assert count_identical(reference, translators[2], src_ids, settings) == len(src_ids)


def test_imported_choices_in_int8(imported_like: ModelFolder) -> None:
    """The int8 serving graphs build with every choice (the activations, the logits bias) and translate."""
    folder = imported_like
    int8 = translator_for(folder, ServingEngine.load(folder, Placement(variant="int8")))
    outputs = int8.translate_ids(imported_sources(folder.config, 4), SearchSettings(beam_size=4))
    assert len(outputs) == 4 and not any(folder.config.special_tokens.pad in ids for ids in outputs)


def test_fp16_graphs_pad_the_output_projection_and_keep_the_log_probabilities(imported_like: ModelFolder) -> None:
    """The CUDA fp16 graphs (fp16 weights and activations, the projection padded to 8 columns and sliced back, the
    log-softmax in fp32) against the fp32 ones, on the CPU provider, on a vocabulary that is no multiple of 8."""
    folder = imported_like
    assert folder.config.vocab_size % 8
    fp16 = ServingEngine.load(folder, Placement(variant="fp16", for_gpu=True))
    fp32 = ServingEngine.load(folder, Placement(for_gpu=True))
    diff = max_log_prob_diff(fp32, fp16, imported_sources(folder.config, 20))
    assert 0 < diff.max_abs_diff <= FP16_TOLERANCE  # not zero: the graphs do run in fp16
