"""The ONNX graphs: contract, truly dynamic axes, parity with PyTorch, compact files, refusal of stale exports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from aiayn.export.contract import DECODER_FILE, ENCODER_FILE, OPSET, decoder_spec, encoder_spec, markdown_table
from aiayn.export.parity import check_logits, count_identical, lockstep_max_diff
from aiayn.model.config import load_config
from aiayn.model.engine import TorchEngine
from aiayn.model.tokenizer import SubwordTokenizer
from aiayn.model.weights import load_model
from aiayn.search.translator import SearchSettings, Translator, pad_batch
from aiayn.serve.engine import OnnxEngine

README = Path(__file__).resolve().parents[1] / "README.md"


def random_src(rng: np.random.Generator, batch: int, length: int, vocab: int) -> np.ndarray:
    src = rng.integers(4, vocab, size=(batch, length))
    src[:, -1] = 3  # </s>
    src[0, length // 2 :] = 0  # padding in the first row
    src[0, length // 2 - 1] = 3
    return src


def test_graphs_pass_the_full_checker_and_carry_metadata(tiny_folder: Path) -> None:
    config = load_config(tiny_folder)
    for file in (ENCODER_FILE, DECODER_FILE):
        model = onnx.load(str(tiny_folder / file))
        onnx.checker.check_model(model, full_check=True)
        assert model.opset_import[0].version >= 17 and OPSET >= 17
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta["aiayn.config_fingerprint"] == config.fingerprint()
        assert len(meta["aiayn.weights_sha256"]) == 64 and "torch" in meta["aiayn.exporter"]
    assert not list(tiny_folder.glob("*.data")), "one file per graph"
    recorded = json.loads((tiny_folder / "config.json").read_text())["onnx"]
    assert recorded["decoder"]["inputs"][0]["name"] == "tgt_ids"


def test_graph_io_follows_the_contract(tiny_folder: Path) -> None:
    config = load_config(tiny_folder)
    for file, spec in ((ENCODER_FILE, encoder_spec(config)), (DECODER_FILE, decoder_spec(config))):
        graph = onnx.load(str(tiny_folder / file)).graph
        assert [i.name for i in graph.input] == [t.name for t in spec.inputs]
        assert [o.name for o in graph.output] == [t.name for t in spec.outputs]
        for value, tensor in zip(graph.input, spec.inputs, strict=True):
            dims = value.type.tensor_type.shape.dim
            assert [d.dim_param or d.dim_value for d in dims] == list(tensor.shape), tensor.name


def test_decoder_holds_one_copy_of_the_tied_embedding(tiny_folder: Path) -> None:
    config = load_config(tiny_folder)
    graph = onnx.load(str(tiny_folder / DECODER_FILE)).graph
    vocab_sized = [i for i in graph.initializer if config.vocab_size in i.dims and config.d_model in i.dims]
    assert len(vocab_sized) == 1


@pytest.mark.parametrize(("batch", "src_len", "steps"), [(1, 1, 3), (7, 60, 2), (2, 9, 60)])
def test_axes_are_dynamic_and_onnx_equals_pytorch(tiny_folder: Path, batch: int, src_len: int, steps: int) -> None:
    """Sizes unlike the export example (batch 3, src 7, past 4, new 2), past_len 0 at the first step."""
    onnx_engine = OnnxEngine.load(tiny_folder, device="cpu")
    torch_engine = TorchEngine(load_model(tiny_folder))
    src = random_src(np.random.default_rng(batch), batch, src_len, load_config(tiny_folder).vocab_size)
    diff, done = lockstep_max_diff(torch_engine, onnx_engine, src, max_steps=steps)
    assert diff <= 1e-4
    # A prefill of several tokens at once (new_len 60) after no past.
    tgt = np.random.default_rng(0).integers(4, 50, size=(batch, 60))
    (log_probs_onnx, _), (log_probs_torch, _) = (
        engine.step(engine.start(src), tgt) for engine in (onnx_engine, torch_engine)
    )
    assert np.abs(log_probs_onnx - log_probs_torch).max() <= 1e-4


def test_parity_check_and_identical_translations(tiny_folder: Path) -> None:
    tokenizer = SubwordTokenizer.load(tiny_folder / "tokenizer.json")
    onnx_engine, torch_engine = OnnxEngine.load(tiny_folder, device="cpu"), TorchEngine(load_model(tiny_folder))
    sentences = ["the red cat sleeps.", "a small dog runs after two blue birds!", "das rote Haus"] * 15
    onnx_translator = Translator(onnx_engine, tokenizer, 64)
    torch_translator = Translator(torch_engine, tokenizer, 64)
    src_ids = [torch_translator.source_ids(s) for s in sentences]
    report = check_logits(torch_engine, onnx_engine, src_ids)
    assert report.max_abs_diff <= 1e-4 and report.sentences == len(sentences)
    for beam in (1, 4):
        settings = SearchSettings(beam_size=beam, max_extra_len=8)
        assert count_identical(torch_translator, onnx_translator, src_ids, settings) == len(sentences)


def test_int8_variant_loads_and_decodes(tiny_folder: Path) -> None:
    engine = OnnxEngine.load(tiny_folder, device="cpu", variant="int8")
    log_probs, _ = engine.step(engine.start(pad_batch([[5, 6, 3]], 0)), np.array([[2]]))
    assert log_probs.shape[0] == 1 and np.isfinite(log_probs).all()
    assert (tiny_folder / "decoder.int8.onnx").stat().st_size < (tiny_folder / DECODER_FILE).stat().st_size * 1.5


def test_stale_or_broken_exports_are_refused(tiny_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(tiny_folder, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ValueError, match="re-export"):
        OnnxEngine.load(folder, device="cpu")
    (folder / DECODER_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="decoder.onnx"):
        OnnxEngine.load(folder, device="cpu")


def test_readme_contract_table_matches_the_code(bundled: dict[str, Path]) -> None:
    assert markdown_table(load_config(bundled["en-de"])) in README.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["en-de", "de-en"])
def test_bundled_exports_are_current(bundled: dict[str, Path], name: str) -> None:
    engine = OnnxEngine.load(bundled[name], device="cpu")  # refuses stale graphs itself
    assert engine.provider == "CPUExecutionProvider"
    sizes = sum(f.stat().st_size for f in bundled[name].iterdir() if f.is_file())
    assert sizes <= 15e6, f"{name} folder is {sizes / 1e6:.1f} MB"
