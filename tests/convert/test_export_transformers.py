"""`aiayn export --to transformers`: the written folder is a Marian model that transformers loads with no code of
ours and whose ``generate`` translates as `aiayn translate` does, on Multi30k's test_2016_flickr sentences; `aiayn
import` gives the folder back; ``ct2-transformers-converter`` makes our CTranslate2 model where the folder follows
Marian's conventions; transformers 4 (in an environment of its own, cached: transformers4_python) loads it too, its
``pipeline("translation")``, which transformers 5 removed, translates as ours, and so does Optimum's ONNX export of
it; a pre-LN folder (the bundled ones) is refused in one line.

Three folders: a native post-LN one trained here for a few steps (its training.json and tokenizer; it has learnt
one answer so far), a native random one (``tiny_folder``, whose outputs vary from sentence to sentence), both with
the interleaved positions and LayerNorm ε 1e-6, and an imported Marian checkpoint (``marian_checkpoint``), which
comes back exact."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file
from transformers4_worker import generated, padded

from aiayn.bench.web import CHROMIUM
from aiayn.cli import main
from aiayn.core.folder import WEIGHTS_FILE, ModelFolder
from aiayn.data.multi30k import TEST_SPLIT, load_parallel
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import SearchSettings

SENTENCES = 200
JS_SENTENCES = 50  # of them in Chromium (all 200: 200/200, docs/models.md)
# Both searches stop at this many tokens whatever the source's length (generate's max_new_tokens, our max_len), so
# that generate takes all sentences in one batch; a random model's outputs reach it.
MAX_OUTPUT = 40
MakeCheckpoint = Callable[..., Path]
FOLDERS = ["trained", "random", "imported"]
LIMIT = {"max_len": MAX_OUTPUT, "max_extra_len": 1000}


@pytest.fixture(scope="session")
def flickr(multi30k_dir: Path) -> list[str]:
    """The first 200 English sentences of test_2016_flickr."""
    return load_parallel(TEST_SPLIT, "en", "de", multi30k_dir, download=False).src[:SENTENCES]


@pytest.fixture(scope="session")
def trained_post_ln(tmp_path_factory: pytest.TempPathFactory, multi30k_dir: Path) -> Path:
    """A post-LN folder of ours, `aiayn train` on 300 Multi30k pairs for a few steps (its training.json too)."""
    out = tmp_path_factory.mktemp("trained") / "model"
    sizes = ["d_model=32", "n_heads=4", "d_ff=64", "n_encoder_layers=2", "n_decoder_layers=2", "vocab_size=300"]
    flags = [flag for size in ["norm_first=false", "dropout=0", *sizes] for flag in ("--set", size)]
    flags += ["--limit", "300", "--max-steps", "12", "--max-tokens", "1024", "--warmup", "4", "--device", "cpu"]
    assert main(["train", "--src", "en", "--tgt", "de", "--data", str(multi30k_dir), "--out", str(out), *flags]) == 0
    return out


@pytest.fixture(scope="session")
def exported(
    tmp_path_factory: pytest.TempPathFactory,
    trained_post_ln: Path,
    tiny_folder: Path,
    marian_checkpoint: MakeCheckpoint,
) -> Callable[[str], tuple[ModelFolder, Path]]:
    """``exported(kind)``: one of FOLDERS and its transformers folder, each written once."""
    made: dict[str, tuple[ModelFolder, Path]] = {}

    def make(kind: str) -> tuple[ModelFolder, Path]:
        if kind not in made:
            root = tmp_path_factory.mktemp(f"to-transformers-{kind}")
            if kind == "imported":
                source = root / "imported"
                checkpoint = marian_checkpoint("swish", True, zero_pad=True)
                assert main(["import", str(checkpoint), "--out", str(source)]) == 0
            else:
                source = trained_post_ln if kind == "trained" else tiny_folder
            out = root / "hf"
            # The random folder's export carries transformers.js's graphs too (and comes back from them alike).
            graphs = ["--transformers-js"] if kind == "random" else []
            assert main(["export", str(source), "--to", "transformers", "--out", str(out), *graphs]) == 0
            made[kind] = ModelFolder.open(source), out
        return made[kind]

    return make


def marian(out: Path) -> Any:
    from transformers import MarianMTModel

    return MarianMTModel.from_pretrained(str(out)).eval()


def largest_log_prob_difference(folder: ModelFolder, out: Path, src: list[list[int]], outs: list[list[int]]) -> float:
    """max |Δ log-prob| between our PyTorch model and the exported MarianMTModel, teacher-forced on our outputs
    (one padded batch; the padded positions left out)."""
    import torch

    from aiayn.model.weights import load_model

    ours, theirs = load_model(folder), marian(out)
    tokens, vocab = folder.config.special_tokens, folder.config.vocab_size
    source, source_mask = padded(src, tokens.pad)
    target, target_mask = padded([[tokens.bos, *output] for output in outs], tokens.pad)
    their_target = target.clone()
    their_target[:, 0] = theirs.config.decoder_start_token_id  # a folded start's appended row
    with torch.no_grad():
        a = ours(source, target).log_softmax(-1)  # (batch, tgt_len, vocab)
        logits = theirs(input_ids=source, attention_mask=source_mask, decoder_input_ids=their_target).logits
        b = logits[..., :vocab].log_softmax(-1)  # without the appended row, which generate never chooses
    return float(((a - b).abs().amax(-1) * target_mask).max())


def tokenized(out: Path, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    return [tokenizer(text)["input_ids"] for text in texts]


@pytest.mark.parametrize("kind", FOLDERS)
def test_generate_equals_aiayn_translate(
    exported: Callable[[str], tuple[ModelFolder, Path]], flickr: list[str], kind: str
) -> None:
    """Greedy: all 200 for the imported folder (the same function), at least 199 for a native one (LayerNorm's ε
    differs), its largest log-prob difference printed; AutoTokenizer encodes and decodes as ours. Beam 4 with the
    folder's length penalty applied as generate applies it (|Y|^α): at least 95 %, the others named."""
    from transformers import AutoTokenizer

    folder, out = exported(kind)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    src = [tokenizer(text)["input_ids"] for text in flickr]
    assert src == [folder.tokenizer.encode_source(text) for text in flickr]  # AutoTokenizer reads as ours
    translator = translator_for(folder, load_engine(folder, EngineOptions("torch", "cpu")))
    ours = translator.translate_ids(src, SearchSettings(beam_size=1, **LIMIT))
    theirs = generated(marian(out), src, beams=1, max_output=MAX_OUTPUT)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    worst = largest_log_prob_difference(folder, out, src, ours)
    assert tokenizer.batch_decode(ours, skip_special_tokens=True) == folder.tokenizer.decode_batch(ours)
    distinct = len({tuple(ids) for ids in ours})
    print(f"{kind}: greedy {same}/{SENTENCES} identical to generate() ({distinct} distinct outputs); ", end="")
    print(f"max |Δ log-prob| {worst:.1e}")
    # A few steps of training teach the trained folder one answer; the random ones say many things.
    assert kind == "trained" or distinct > 10, "the model should not say one thing to every sentence"
    assert same >= (SENTENCES if kind == "imported" else SENTENCES - 1)
    assert worst < (1e-4 if kind == "imported" else 1e-2)

    settings = SearchSettings.of(folder, beam_size=4, length_normalization="power", **LIMIT)
    beam = translator.translate_ids(src, settings)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["length_penalty"] == settings.length_penalty
    theirs = generated(marian(out), src, beams=4, max_output=MAX_OUTPUT, length_penalty=generation["length_penalty"])
    differing = [i for i, (a, b) in enumerate(zip(beam, theirs, strict=True)) if a != b]
    print(f"{kind}: beam 4 {SENTENCES - len(differing)}/{SENTENCES} identical; differing: {differing}")
    assert len(differing) <= 0.05 * SENTENCES, differing


@pytest.mark.parametrize("kind", FOLDERS)
def test_import_of_the_export_gives_the_folder_back(
    exported: Callable[[str], tuple[ModelFolder, Path]], tmp_path: Path, kind: str
) -> None:
    """Config and weights equal, bit for bit; a native folder's LayerNorm ε comes back as Marian's 1e-5."""
    folder, out = exported(kind)
    back = tmp_path / "back"
    assert main(["import", str(out), "--out", str(back)]) == 0
    assert ModelFolder.open(back).config == folder.config.replace(layer_norm_eps=1e-5)
    ours, again = load_file(str(folder.weights_file)), load_file(str(back / WEIGHTS_FILE))
    assert sorted(ours) == sorted(again)
    assert all(np.array_equal(ours[name], again[name]) for name in ours)


def test_the_folder_holds_what_the_hub_expects(exported: Callable[[str], tuple[ModelFolder, Path]]) -> None:
    folder, out = exported("trained")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "marian" and config["activation_function"] == "relu"
    # The decoder starts from an appended row of zeros, as Marian's own do; <s> (2) is folded into position 0.
    vocab = folder.config.vocab_size
    assert (config["decoder_start_token_id"], config["pad_token_id"], config["eos_token_id"]) == (vocab, 0, 3)
    assert (config["vocab_size"], config["aiayn_start_token_id"]) == (vocab + 1, 2)
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["max_length"]) == (4, folder.config.max_len)
    assert [vocab] in generation["bad_words_ids"]
    weights = load_file(str(out / "model.safetensors"))
    assert not weights["model.shared.weight"][vocab].any()
    # Beside the float16 weights: the position table (float32) and the logits bias (the appended row's -65504).
    table, bias = weights["model.decoder.embed_positions.weight"], weights["final_logits_bias"]
    assert table.dtype == np.float32 and bias[0, vocab] == -65504 and not bias[0, :vocab].any()
    size = (out / "model.safetensors").stat().st_size - table.nbytes - bias.nbytes
    ours = folder.weights_file.stat().st_size
    assert abs(size - ours) <= 0.01 * ours, (size, ours)
    card = (out / "README.md").read_text()
    assert "trained on Multi30k image captions (300 pairs)" in card and "best validation BLEU" in card
    assert "LayerNorm's ε is Marian's 1e-5" in card and "folded into row 0 of the decoder's position table" in card
    assert "hf upload" in "\n".join(export_report(folder.path, out.parent / "again"))


def export_report(model: Path, out: Path) -> list[str]:
    from aiayn.export.transformers_folder import export_transformers

    return export_transformers(ModelFolder.open(model), out)


@pytest.mark.parametrize("name", ["en-de", "de-en"])
def test_a_pre_ln_folder_is_refused_in_one_line(
    bundled: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """The bundled models are pre-LN, which Marian cannot express."""
    assert ModelFolder.open(bundled[name]).config.norm_first
    assert main(["export", name, "--to", "transformers", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pre-LN (norm_first: true in config.json)" in err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kind", ["random", "imported"])  # the trained one starts as the random one does
def test_ct2_transformers_converter_gives_our_ctranslate2_model(
    exported: Callable[[str], tuple[ModelFolder, Path]], flickr: list[str], tmp_path: Path, kind: str
) -> None:
    """CTranslate2's own converter of the exported folder and `aiayn export --to ctranslate2` translate alike,
    greedy: all 200 for the imported folder (Marian's conventions: <pad> last, its row zeros, the decoder's start),
    at least 199 for the native one, whose start the export folded (and whose ε the converter's model has as
    Marian's, 1e-5). The converter does not know the ids the folder never generates: both are told those it kept."""
    import ctranslate2

    from aiayn.export.ctranslate2 import ctranslate2_greedy, ctranslate2_sources, suppressed
    from aiayn.search.greedy import EXTRA_LEN

    source, out = exported(kind)
    copy = tmp_path / "ours"  # the session's folders stay as they are
    shutil.copytree(source.path, copy)
    folder = ModelFolder.open(copy)
    assert main(["export", str(copy), "--to", "ctranslate2", "--check-sentences", "0"]) == 0
    ours = ctranslate2_greedy(copy, folder.tokenizer, flickr)
    converted = tmp_path / "ct2"
    converter = Path(sys.executable).with_name("ct2-transformers-converter")
    subprocess.run([str(converter), "--model", str(out), "--output_dir", str(converted)], check=True)
    translator = ctranslate2.Translator(str(converted), device="cpu", compute_type="float32", inter_threads=1)
    vocab = folder.tokenizer.tokenizer.get_vocab()
    kept = set(json.loads((converted / "shared_vocabulary.json").read_text()))  # without the <pad> it dropped
    suppress = [ids for ids in suppressed(folder.config, folder.tokenizer) or [] if ids[0] in kept] or None
    sources = ctranslate2_sources(folder.tokenizer, flickr)
    theirs: list[list[int]] = [[] for _ in sources]
    for length in sorted({len(source) for source in sources}):  # each group with ctranslate2_greedy's limit
        group = [i for i, source in enumerate(sources) if len(source) == length]
        results = translator.translate_batch(
            [sources[i] for i in group],
            beam_size=1,
            max_decoding_length=length + EXTRA_LEN,
            suppress_sequences=suppress,
        )
        for i, result in zip(group, results, strict=True):
            theirs[i] = [vocab[token] for token in result.hypotheses[0]]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    distinct = len({tuple(ids) for ids in ours})
    print(f"{kind}: ct2-transformers-converter greedy {same}/{SENTENCES} identical to `aiayn export --to ctranslate2`")
    print(f"({distinct} distinct outputs)")
    assert same >= (SENTENCES if kind == "imported" else SENTENCES - 1)


# transformers 4's last release and Optimum's ONNX exporter for it (which requires transformers<4.58): the
# environment that has what transformers 5 removed, pipeline("translation"), and Optimum.
TRANSFORMERS_4 = ("transformers==4.57.6", "optimum-onnx==0.1.0")
TRANSFORMERS_4_SENTENCES = 50  # of the 200 (all 200: docs/models.md)
TRANSFORMERS_4_FOLDERS = ["random", "imported"]  # the trained one starts as the random one does
# A folder, our greedy ids on the sentences and transformers4_worker.py's answer on its export.
Transformers4Run = tuple[ModelFolder, list[list[int]], dict[str, Any]]
PYTHON_CACHE = Path.home() / ".cache" / "aiayn" / "python"


@pytest.fixture(scope="session")
def transformers4_python() -> Path:
    """The Python of a virtual environment holding TRANSFORMERS_4 over this one's packages: a .pth file puts this
    environment's site-packages (torch, ONNX Runtime, ...) after its own, whose transformers 4 and Hugging Face Hub
    shadow ours. Installed once by pip from the user's configured index into aiayn's cache (built beside it and
    moved in whole, so a run that stops halfway leaves none); skipped, saying why, where pip cannot reach the
    index."""
    outer = site.getsitepackages()
    venv = PYTHON_CACHE / "-".join(requirement.replace("==", "-") for requirement in TRANSFORMERS_4)
    stamp = {"requirements": list(TRANSFORMERS_4), "site-packages": outer}

    def ready() -> bool:
        made = venv / "aiayn-ready.json"
        return made.is_file() and json.loads(made.read_text()) == stamp

    if ready():
        return venv / "bin" / "python"
    PYTHON_CACHE.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f"{venv.name}-", dir=PYTHON_CACHE))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(build)], check=True)
        python = build / "bin" / "python"
        where = [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        purelib = Path(subprocess.run(where, capture_output=True, text=True, check=True).stdout.strip())
        (purelib / "aiayn-outer.pth").write_text("".join(f"{path}\n" for path in outer))
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        probe = subprocess.run([*pip, "index", "versions", "optimum-onnx"], capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            reason = probe.stderr.strip().rpartition("\n")[2]
            pytest.skip(f"pip cannot find optimum-onnx on the package index ({reason}): transformers 4 is not tested")
        result = subprocess.run([*pip, "install", "-q", *TRANSFORMERS_4], capture_output=True, text=True, timeout=1200)
        assert result.returncode == 0, result.stderr[-3000:]
        (build / "aiayn-ready.json").write_text(json.dumps(stamp))
        if not ready():  # else another run has put its own there meanwhile, which it may be running
            shutil.rmtree(venv, ignore_errors=True)
            build.rename(venv)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def under_transformers4(
    exported: Callable[[str], tuple[ModelFolder, Path]],
    flickr: list[str],
    transformers4_python: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], Transformers4Run]:
    """``under_transformers4(kind)``: that folder, our greedy ids and transformers4_worker.py's answer on its export,
    run once in transformers4_python on the first TRANSFORMERS_4_SENTENCES sentences (offline: the folder is
    local)."""
    answers: dict[str, Transformers4Run] = {}

    def run(kind: str) -> Transformers4Run:
        if kind not in answers:
            folder, out = exported(kind)
            scratch = tmp_path_factory.mktemp(f"transformers4-{kind}")
            texts = flickr[:TRANSFORMERS_4_SENTENCES]
            request = {
                "folder": str(out),
                "texts": texts,
                "sources": [folder.tokenizer.encode_source(text) for text in texts],
                "max_output": MAX_OUTPUT,
                "onnx": str(scratch / "onnx"),
                "answer": str(scratch / "answer.json"),
            }
            (scratch / "request.json").write_text(json.dumps(request))
            worker = Path(__file__).with_name("transformers4_worker.py")
            # Its own packages first: no PYTHONPATH of ours before them.
            env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1"}
            command = [str(transformers4_python), str(worker), str(scratch / "request.json")]
            result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=scratch)
            assert result.returncode == 0, result.stderr[-3000:]
            answer = json.loads((scratch / "answer.json").read_text())
            answers[kind] = folder, ours_greedy(folder, texts), answer
        return answers[kind]

    return run


def ours_greedy(folder: ModelFolder, texts: list[str]) -> list[list[int]]:
    """`aiayn translate`'s greedy ids (PyTorch), at most MAX_OUTPUT tokens."""
    translator = translator_for(folder, load_engine(folder, EngineOptions("torch", "cpu")))
    src = [folder.tokenizer.encode_source(text) for text in texts]
    return translator.translate_ids(src, SearchSettings(beam_size=1, **LIMIT))


@pytest.mark.parametrize("kind", TRANSFORMERS_4_FOLDERS)
def test_transformers4_loads_the_folder_and_its_pipeline_translates_as_ours(
    under_transformers4: Callable[[str], Transformers4Run], kind: str
) -> None:
    """transformers 4 loads the native folder's decoder position table (row 0 holding <s>) from model.safetensors
    as it is, and its pipeline("translation"), greedy, gives our texts but for at most one sentence (the ε)."""
    folder, ours, got = under_transformers4(kind)
    assert got["versions"]["transformers"] == TRANSFORMERS_4[0].split("==")[1]
    assert got["position_table_difference"] == (0.0 if kind == "random" else None)
    expected = folder.tokenizer.decode_batch(ours)
    same = sum(a == b for a, b in zip(expected, got["pipeline"], strict=True))
    distinct = len(set(expected))
    print(f"{kind}: transformers {got['versions']['transformers']} pipeline('translation') greedy ", end="")
    print(f"{same}/{len(expected)} identical ({distinct} distinct outputs)")
    assert distinct > 5 and same >= len(expected) - 1


@pytest.mark.parametrize("kind", TRANSFORMERS_4_FOLDERS)
def test_optimums_onnx_export_translates_as_ours(
    under_transformers4: Callable[[str], Transformers4Run], kind: str
) -> None:
    """Optimum exports the folder to ONNX (as `optimum-cli export onnx` does, its outputs checked by Optimum against
    the PyTorch model's) and ORTModelForSeq2SeqLM's greedy generate gives our ids but for at most one sentence."""
    _, ours, got = under_transformers4(kind)
    same = sum(a == b for a, b in zip(ours, got["optimum"], strict=True))
    distinct = len({tuple(ids) for ids in ours})
    print(f"{kind}: optimum-onnx {got['versions']['optimum-onnx']} greedy {same}/{len(ours)} identical ", end="")
    print(f"({distinct} distinct outputs)")
    assert distinct > 5 and same >= len(ours) - 1


def test_a_multi_target_folder_puts_its_token_before_every_source(
    marian_checkpoint: MakeCheckpoint, flickr: list[str], tmp_path: Path
) -> None:
    """tokenizer.json adds the folder's >>por<< itself (the card says not to type it); the import, told the same
    target, gives the folder back."""
    source, out, back = tmp_path / "en-por", tmp_path / "hf", tmp_path / "back"
    checkpoint = marian_checkpoint("swish", True, ("pob", "por"))
    assert main(["import", str(checkpoint), "--tgt", "por", "--out", str(source)]) == 0
    assert main(["export", str(source), "--to", "transformers", "--out", str(out)]) == 0
    folder = ModelFolder.open(source)
    assert tokenized(out, flickr[:20]) == [folder.tokenizer.encode_source(text) for text in flickr[:20]]
    assert "puts `>>por<<` before every source by itself" in (out / "README.md").read_text()
    assert main(["import", str(out), "--tgt", "por", "--out", str(back)]) == 0
    assert ModelFolder.open(back).config == folder.config


TRANSFORMERS_JS = "4.3.2"  # @huggingface/transformers, installed by npm from the user's configured registry
# The page: transformers.js and the ONNX Runtime it imports, from the installed packages, the model from the folder,
# nothing from elsewhere (allowRemoteModels false; the test aborts every other request and fails on any).
PAGE = """<!doctype html>
<meta charset="utf-8">
<script type="importmap">
{"imports": {
  "@huggingface/transformers": "/node_modules/@huggingface/transformers/dist/transformers.web.js",
  "onnxruntime-web/webgpu": "/node_modules/onnxruntime-web/dist/ort.webgpu.bundle.min.mjs",
  "onnxruntime-common": "/node_modules/onnxruntime-web/dist/ort.webgpu.bundle.min.mjs"
}}
</script>
<script type="module">
import { env, AutoTokenizer, AutoModelForSeq2SeqLM } from "@huggingface/transformers";
Object.assign(env, { allowRemoteModels: false, allowLocalModels: true, localModelPath: "/models/" });
Object.assign(env, { useBrowserCache: false, useWasmCache: false });
env.backends.onnx.wasm.wasmPaths = "/node_modules/onnxruntime-web/dist/";
window.translate = async (texts, maxNewTokens) => {
  const tokenizer = await AutoTokenizer.from_pretrained("hf");
  const model = await AutoModelForSeq2SeqLM.from_pretrained("hf", { device: "wasm" });
  const inputs = await tokenizer(texts, { padding: true });
  const ids = await model.generate({ ...inputs, num_beams: 1, do_sample: false, max_new_tokens: maxNewTokens });
  return { sources: texts.map((text) => tokenizer.encode(text)), outputs: ids.tolist().map((row) => row.map(Number)) };
};
window.ready = true;
</script>
"""


@pytest.fixture(scope="session")
def transformers_js() -> Path:
    """node_modules holding @huggingface/transformers and its ONNX Runtime, installed once by npm into aiayn's npm
    cache (no install scripts, no optional packages: the browser needs neither onnxruntime-node's binaries nor
    sharp's)."""
    from aiayn.export.npm import CACHE_DIR

    prefix = CACHE_DIR / f"transformers.js-{TRANSFORMERS_JS}"
    installed = prefix / "node_modules" / "@huggingface" / "transformers" / "package.json"
    if installed.is_file() and json.loads(installed.read_text())["version"] == TRANSFORMERS_JS:
        return prefix / "node_modules"
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: apt-get install -y npm")
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "package.json").write_text('{"private": true}\n')
    flags = ["--ignore-scripts", "--omit=optional", "--no-audit", "--no-fund", "--prefix", str(prefix)]
    result = subprocess.run(
        [npm, "install", *flags, f"@huggingface/transformers@{TRANSFORMERS_JS}"], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(
            f"npm could not install @huggingface/transformers@{TRANSFORMERS_JS}: {result.stderr.strip()[-300:]}"
        )
    return prefix / "node_modules"


def transformers_js_translations(out: Path, node_modules: Path, texts: list[str]) -> dict[str, list[list[int]]]:
    """transformers.js in Chromium on the exported folder: each text's source ids and generated ids (greedy, at
    most MAX_OUTPUT new tokens, all in one padded batch)."""
    from aiayn.bench.web import chromium, served_folder

    with tempfile.TemporaryDirectory(prefix="aiayn-transformers-js-") as name:
        site = Path(name)
        (site / "index.html").write_text(PAGE, encoding="utf-8")
        (site / "node_modules").symlink_to(node_modules)
        (site / "models").mkdir()
        (site / "models" / "hf").symlink_to(out)
        elsewhere: list[str] = []
        with served_folder(site, isolated=False) as url, chromium() as browser:
            page = browser.new_page()

            def only_local(route: Any) -> None:
                if route.request.url.startswith(url):
                    route.continue_()
                else:
                    elsewhere.append(route.request.url)
                    route.abort()

            page.route("**/*", only_local)
            page.goto(url)
            page.wait_for_function("window.ready === true")
            result = page.evaluate("([texts, n]) => window.translate(texts, n)", [texts, MAX_OUTPUT])
    assert not elsewhere, f"the page asked for files elsewhere: {elsewhere}"
    return dict(result)


def test_transformers_js_graphs_go_with_the_transformers_folder(
    tiny_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(tiny_folder), "--to", "onnx", "--transformers-js"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--transformers-js goes with --to transformers" in err


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: apt-get install -y chromium")
def test_transformers_js_translates_as_ours_in_chromium(
    exported: Callable[[str], tuple[ModelFolder, Path]], transformers_js: Path, flickr: list[str]
) -> None:
    """transformers.js loads the folder (its onnx/ graphs, tokenizer.json, generation_config.json) from local files
    in Chromium: its tokenizer gives our source ids, its greedy `generate` our outputs, but for at most one
    sentence (WASM's kernels sum in another order). JS_SENTENCES of the 200 here."""
    folder, out = exported("random")
    texts = flickr[:JS_SENTENCES]
    got = transformers_js_translations(out, transformers_js, texts)
    src = [folder.tokenizer.encode_source(text) for text in texts]
    assert got["sources"] == src
    ours = ours_greedy(folder, texts)
    eos = folder.config.special_tokens.eos
    theirs = [row[1:][: row[1:].index(eos)] if eos in row[1:] else row[1:] for row in got["outputs"]]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    distinct = len({tuple(ids) for ids in ours})
    print(f"transformers.js {TRANSFORMERS_JS}: greedy {same}/{len(texts)} identical ({distinct} distinct outputs)")
    assert distinct > 5 and same >= len(texts) - 1
