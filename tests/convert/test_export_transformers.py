"""`aiayn export --to transformers`: the written folder is a Marian model (post-LN) or a Pegasus one (pre-LN) that
transformers loads with no code of ours and whose ``generate`` translates as `aiayn translate` does, on Multi30k's
test_2016_flickr sentences; `aiayn import` gives the folder back; ``ct2-transformers-converter`` makes our
CTranslate2 model where the folder follows Marian's conventions, and translates as `aiayn translate` does from a
Pegasus one; transformers 4 (in an environment of its own, cached: transformers4_python) loads it too, its
``pipeline("translation")``, which transformers 5 removed, translates as ours, and so does Optimum's ONNX export of
it.

Six folders: native post-LN and pre-LN ones trained here for a few steps by `aiayn train` (its training.json and
tokenizer; they have learnt one answer so far; pre-LN is the default), a native random one (``tiny_folder``, whose
outputs vary from sentence to sentence), all with the interleaved positions and LayerNorm ε 1e-6, an imported
Marian checkpoint (``marian_checkpoint``), which comes back exact, and the bundled en-de and de-en (pre-LN: Pegasus),
on 200 sentences of their source language."""

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
BUNDLED = ["en-de", "de-en"]
JS_SENTENCES = 50  # of them in Chromium (all 200: 200/200, docs/models.md)
# Both searches stop at this many tokens whatever the source's length (generate's max_new_tokens, our max_len), so
# that generate takes all sentences in one batch; a random model's outputs reach it.
MAX_OUTPUT = 40
MakeCheckpoint = Callable[..., Path]
FOLDERS = ["trained", "random", "imported", "trained-pre-ln"]
LIMIT = {"max_len": MAX_OUTPUT, "max_extra_len": 1000}


@pytest.fixture(scope="session")
def flickr(multi30k_dir: Path) -> list[str]:
    """The first 200 English sentences of test_2016_flickr."""
    return load_parallel(TEST_SPLIT, "en", "de", multi30k_dir, download=False).src[:SENTENCES]


def quick_train(out: Path, multi30k_dir: Path, *settings: str) -> Path:
    """`aiayn train` (its default preset, tiny, pre-LN, at smaller sizes) on 300 Multi30k pairs for a few steps."""
    sizes = ["d_model=32", "n_heads=4", "d_ff=64", "n_encoder_layers=2", "n_decoder_layers=2", "vocab_size=300"]
    flags = [flag for size in [*settings, "dropout=0", *sizes] for flag in ("--set", size)]
    flags += ["--limit", "300", "--max-steps", "12", "--max-tokens", "1024", "--warmup", "4", "--device", "cpu"]
    assert main(["train", "--src", "en", "--tgt", "de", "--data", str(multi30k_dir), "--out", str(out), *flags]) == 0
    return out


@pytest.fixture(scope="session")
def trained_post_ln(tmp_path_factory: pytest.TempPathFactory, multi30k_dir: Path) -> Path:
    """A post-LN folder of ours, trained for a few steps (its training.json too)."""
    return quick_train(tmp_path_factory.mktemp("trained") / "model", multi30k_dir, "norm_first=false")


@pytest.fixture(scope="session")
def trained_pre_ln(tmp_path_factory: pytest.TempPathFactory, multi30k_dir: Path) -> Path:
    """A folder as `aiayn train` makes it by default: pre-LN."""
    return quick_train(tmp_path_factory.mktemp("trained-pre-ln") / "model", multi30k_dir)


# The fixture each kind of folder comes from, asked for only when that kind is (a bundled one needs no training).
SOURCES = {"trained": "trained_post_ln", "trained-pre-ln": "trained_pre_ln", "random": "tiny_folder"}


@pytest.fixture(scope="session")
def exported(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Callable[[str], tuple[ModelFolder, Path]]:
    """``exported(kind)``: one of FOLDERS or BUNDLED and its transformers folder, each written once (a bundled one
    by its name, as users export it)."""
    made: dict[str, tuple[ModelFolder, Path]] = {}

    def make(kind: str) -> tuple[ModelFolder, Path]:
        if kind not in made:
            root = tmp_path_factory.mktemp(f"to-transformers-{kind}")
            if kind == "imported":
                source = root / "imported"
                checkpoint = request.getfixturevalue("marian_checkpoint")("swish", True, zero_pad=True)
                assert main(["import", str(checkpoint), "--out", str(source)]) == 0
            elif kind in BUNDLED:
                source = request.getfixturevalue("bundled")[kind]
            else:
                source = request.getfixturevalue(SOURCES[kind])
            out = root / "hf"
            # The random folder's export carries transformers.js's graphs too (and comes back from them alike).
            graphs = ["--transformers-js"] if kind == "random" else []
            name = kind if kind in BUNDLED else str(source)
            assert main(["export", name, "--to", "transformers", "--out", str(out), *graphs]) == 0
            made[kind] = ModelFolder.open(source), out
        return made[kind]

    return make


def seq2seq(out: Path) -> Any:
    """The written folder as transformers loads it: its MarianMTModel or PegasusForConditionalGeneration."""
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()


def largest_log_prob_difference(folder: ModelFolder, out: Path, src: list[list[int]], outs: list[list[int]]) -> float:
    """max |Δ log-prob| between our PyTorch model and the exported model, teacher-forced on our outputs
    (one padded batch; the padded positions left out)."""
    import torch

    from aiayn.model.weights import load_model

    ours, theirs = load_model(folder), seq2seq(out)
    tokens, vocab = folder.config.special_tokens, folder.config.vocab_size
    source, source_mask = padded(src, tokens.pad)
    target, target_mask = padded([[tokens.bos, *output] for output in outs], tokens.pad)
    their_target = target.clone()
    their_target[:, 0] = theirs.config.decoder_start_token_id  # a folded start: an appended row, or <pad>
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
    folder's length penalty applied as generate applies it (|Y|^α): all but at most one (the ε), the others named:
    generate finishes and stops hypotheses by our rules (fairseq's)."""
    from transformers import AutoTokenizer

    folder, out = exported(kind)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    src = [tokenizer(text)["input_ids"] for text in flickr]
    assert src == [folder.tokenizer.encode_source(text) for text in flickr]  # AutoTokenizer reads as ours
    translator = translator_for(folder, load_engine(folder, EngineOptions("torch", "cpu")))
    ours = translator.translate_ids(src, SearchSettings(beam_size=1, **LIMIT))
    theirs = generated(seq2seq(out), src, beams=1, max_output=MAX_OUTPUT)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    worst = largest_log_prob_difference(folder, out, src, ours)
    assert tokenizer.batch_decode(ours, skip_special_tokens=True) == folder.tokenizer.decode_batch(ours)
    distinct = len({tuple(ids) for ids in ours})
    print(f"{kind}: greedy {same}/{SENTENCES} identical to generate() ({distinct} distinct outputs); ", end="")
    print(f"max |Δ log-prob| {worst:.1e}")
    # A few steps of training teach the trained folder one answer; the random ones say many things.
    assert kind.startswith("trained") or distinct > 10, "the model should not say one thing to every sentence"
    assert same >= (SENTENCES if kind == "imported" else SENTENCES - 1)
    assert worst < (1e-4 if kind == "imported" else 1e-2)

    settings = SearchSettings.of(folder, beam_size=4, length_normalization="power", **LIMIT)
    beam = translator.translate_ids(src, settings)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["length_penalty"] == settings.length_penalty
    theirs = generated(seq2seq(out), src, beams=4, max_output=MAX_OUTPUT, length_penalty=generation["length_penalty"])
    differing = [i for i, (a, b) in enumerate(zip(beam, theirs, strict=True)) if a != b]
    print(f"{kind}: beam 4 {SENTENCES - len(differing)}/{SENTENCES} identical; differing: {differing}")
    assert len(differing) <= 1, differing


@pytest.mark.parametrize("kind", FOLDERS)
def test_import_of_the_export_gives_the_folder_back(
    exported: Callable[[str], tuple[ModelFolder, Path]], tmp_path: Path, kind: str
) -> None:
    """Config and weights equal, bit for bit (a native folder's LayerNorm ε too, which config.json keeps beside
    transformers' 1e-5), and the search defaults."""
    folder, out = exported(kind)
    back = tmp_path / "back"
    assert main(["import", str(out), "--out", str(back)]) == 0
    assert ModelFolder.open(back).config == folder.config
    assert SearchSettings.of(ModelFolder.open(back)) == SearchSettings.of(folder)
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


def test_a_pre_ln_folder_is_pegasus_as_ctranslate2_reads_it(
    exported: Callable[[str], tuple[ModelFolder, Path]],
) -> None:
    """A folder that `aiayn train` made with its defaults (pre-LN) exports with no flag, as Pegasus: its final
    norms, both sinusoid tables, the decoder starting from <pad> with <s> folded into position 0, the keys
    CTranslate2's converter reads, the folder's ε and search kept for `aiayn import`, and a card that names it."""
    folder, out = exported("trained-pre-ln")
    assert folder.config.norm_first
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("pegasus", ["PegasusForConditionalGeneration"])
    assert (config["normalize_before"], config["normalize_embedding"]) == (True, False)
    assert (config["decoder_start_token_id"], config["pad_token_id"], config["aiayn_start_token_id"]) == (0, 0, 2)
    assert (config["vocab_size"], config["aiayn_layer_norm_eps"]) == (folder.config.vocab_size, 1e-6)
    assert config["forced_eos_token_id"] is None
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["decoder_start_token_id"], generation["early_stopping"], generation["num_beams"]) == (0, True, 4)
    assert generation["aiayn_length_normalization"] == "gnmt" and "bad_words_ids" not in generation
    weights = load_file(str(out / "model.safetensors"))
    assert {"model.encoder.layer_norm.weight", "model.decoder.layer_norm.bias"} <= set(weights)
    encoder_table, decoder_table = (
        weights[f"model.{stack}.embed_positions.weight"] for stack in ("encoder", "decoder")
    )
    np.testing.assert_array_equal(encoder_table[1:], decoder_table[1:])  # the sinusoids, but for the folded row 0
    assert not np.array_equal(encoder_table[0], decoder_table[0])
    card = (out / "README.md").read_text()
    assert "the paper's Transformer, pre-LN: transformers' Pegasus" in card and "tags:\n  - pegasus" in card
    assert "GNMT's ((5 + |Y|) / 6)^α, which neither `generate` nor CTranslate2 can express" in card
    assert "`translate_batch(tokens, beam_size=4, length_penalty=0.6, min_decoding_length=0)`" in card
    assert "LayerNorm's ε is Pegasus's 1e-5 where the aiayn folder's is 1e-06: it changes" in card


def test_transformers_js_refuses_a_pre_ln_folder_in_one_line(
    trained_pre_ln: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers.js (4.3) has no Pegasus, whose config.json the folder holds: said in one line, nothing written."""
    out = tmp_path / "hf"
    assert main(["export", str(trained_pre_ln), "--to", "transformers", "--out", str(out), "--transformers-js"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "transformers.js (4.3) does not run" in err and not out.exists()


def export_report(model: Path, out: Path) -> list[str]:
    from aiayn.export.transformers_folder import export_transformers

    return export_transformers(ModelFolder.open(model), out)


@pytest.fixture(scope="session")
def bundled_sources(multi30k_dir: Path) -> Callable[[ModelFolder], list[str]]:
    """The first 200 test_2016_flickr sentences of a folder's source language."""

    def sources(folder: ModelFolder) -> list[str]:
        config = folder.config
        return load_parallel(TEST_SPLIT, config.src_lang, config.tgt_lang, multi30k_dir, download=False).src[:SENTENCES]

    return sources


def aiayn_translate(folder: ModelFolder, texts: list[str], beam_size: int, **changes: str) -> list[str]:
    """`aiayn translate`'s lines: the serving engine on the CPU, the folder's search defaults at ``beam_size``."""
    translator = translator_for(folder, load_engine(folder, EngineOptions("onnx", "cpu", lanes=1)))
    return translator.translate(texts, SearchSettings.of(folder, beam_size=beam_size, **changes))


def differing(ours: list[str], theirs: list[str]) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]


@pytest.mark.parametrize("name", BUNDLED)
def test_a_bundled_model_generates_as_aiayn_translates(
    exported: Callable[[str], tuple[ModelFolder, Path]], bundled_sources: Callable[[ModelFolder], list[str]], name: str
) -> None:
    """`aiayn export en-de --to transformers`: AutoTokenizer and AutoModelForSeq2SeqLM, no code of ours, one padded
    batch each: greedy, the lines `aiayn translate --beam 1` gives but for at most one (the ε); beam 4 as
    generation_config.json has it (no argument), the lines of `aiayn translate --beam 4` but for at most one: the
    folder's |Y|^α (tuned on val) is generate's, and so are its finishing and stopping rules. Against GNMT's
    normalisation at the same α, which generate does not have, printed."""
    import torch
    from transformers import AutoTokenizer

    folder, out = exported(name)
    assert SearchSettings.of(folder).length_normalization == "power"
    texts = bundled_sources(folder)
    tokenizer, model = AutoTokenizer.from_pretrained(str(out)), seq2seq(out)
    assert type(model).__name__ == "PegasusForConditionalGeneration"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        greedy = tokenizer.batch_decode(model.generate(**batch, num_beams=1), skip_special_tokens=True)
        beam = tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
    greedy_off = differing(aiayn_translate(folder, texts, 1), greedy)
    beam_off = differing(aiayn_translate(folder, texts, 4), beam)
    gnmt_off = differing(aiayn_translate(folder, texts, 4, length_normalization="gnmt"), beam)
    print(f"{name}: generate greedy {SENTENCES - len(greedy_off)}/{SENTENCES}; beam 4 ", end="")
    print(f"{SENTENCES - len(beam_off)}/{SENTENCES}, {SENTENCES - len(gnmt_off)}/{SENTENCES} against GNMT's lp")
    print(f"differing: greedy {greedy_off}, beam 4 {beam_off}")
    assert len(greedy_off) <= 1 and len(beam_off) <= 1


@pytest.mark.parametrize("name", BUNDLED)
def test_ct2_transformers_converter_translates_a_bundled_model_as_aiayn(
    exported: Callable[[str], tuple[ModelFolder, Path]],
    bundled_sources: Callable[[ModelFolder], list[str]],
    tmp_path: Path,
    name: str,
) -> None:
    """CTranslate2's own converter of the Pegasus folder (its PegasusLoader: pre-LN from normalize_before, no
    embedding norm, the decoder starting from the tokenizer's <pad>, the position tables as stored): greedy and
    beam 4 at the card's settings (``translate_batch_options``: the folder's α, min_decoding_length 0), the lines
    of `aiayn translate` but for at most one (its LayerNorm ε is transformers' 1e-5: the converter writes none, and
    CTranslate2's default is that)."""
    import ctranslate2

    from aiayn.export.ctranslate2 import translate_batch_options

    folder, out = exported(name)
    texts = bundled_sources(folder)
    converted = tmp_path / "ct2"
    converter = Path(sys.executable).with_name("ct2-transformers-converter")
    subprocess.run([str(converter), "--model", str(out), "--output_dir", str(converted)], check=True)
    assert json.loads((converted / "config.json").read_text())["decoder_start_token"] == "<pad>"
    translator = ctranslate2.Translator(str(converted), device="cpu", compute_type="float32", inter_threads=1)
    tokenizer = folder.tokenizer
    vocab = tokenizer.tokenizer.get_vocab()
    sources = [[tokenizer.tokenizer.id_to_token(i) for i in tokenizer.encode_source(text)] for text in texts]
    off = {}
    for beam_size in (1, 4):
        options = translate_batch_options(folder.config, tokenizer, SearchSettings.of(folder, beam_size=beam_size))
        assert f"length_penalty={options['length_penalty']}, min_decoding_length=0" in (out / "README.md").read_text()
        results = translator.translate_batch(sources, max_batch_size=64, **options)
        lines = tokenizer.decode_batch([[vocab[t] for t in r.hypotheses[0]] for r in results])
        off[beam_size] = differing(aiayn_translate(folder, texts, beam_size), lines)
    print(f"{name}: ct2-transformers-converter greedy {SENTENCES - len(off[1])}/{SENTENCES}; beam 4 ", end="")
    print(f"{SENTENCES - len(off[4])}/{SENTENCES}; differing: greedy {off[1]}, beam 4 {off[4]}")
    assert len(off[1]) <= 1 and len(off[4]) <= 1


@pytest.mark.parametrize("name", BUNDLED)
def test_import_gives_a_bundled_model_back(
    exported: Callable[[str], tuple[ModelFolder, Path]],
    bundled_sources: Callable[[ModelFolder], list[str]],
    tmp_path: Path,
    name: str,
) -> None:
    """`aiayn import DIR` of the Pegasus folder: config, every weight and the search defaults as they were, bit for
    bit, so the same translations at the folder's defaults (beam 4, its length penalty and |Y|^α). (The
    file's bytes may differ: safetensors writes its metadata's two keys in either order.)"""
    folder, out = exported(name)
    back = tmp_path / "back"
    assert main(["import", str(out), "--out", str(back)]) == 0
    again = ModelFolder.open(back)
    assert again.config == folder.config
    ours, theirs = load_file(str(folder.weights_file)), load_file(str(again.weights_file))
    assert sorted(ours) == sorted(theirs) and all(np.array_equal(ours[name], theirs[name]) for name in ours)
    assert SearchSettings.of(again) == SearchSettings.of(folder)
    assert again.section("imported")["model_type"] == "pegasus"
    texts = bundled_sources(folder)
    same = SENTENCES - len(differing(aiayn_translate(folder, texts, 4), aiayn_translate(again, texts, 4)))
    print(f"{name}: aiayn import of the Pegasus folder translates {same}/{SENTENCES} as the bundled folder")
    assert same == SENTENCES


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
# The trained post-LN one starts as the random one does; en-de is Pegasus.
TRANSFORMERS_4_FOLDERS = ["random", "imported", "en-de"]
# A folder, our greedy ids on the sentences and transformers4_worker.py's answer on its export.
Transformers4Run = tuple[ModelFolder, list[list[int]], dict[str, Any]]


@pytest.fixture(scope="session")
def transformers4_python(venv_cache: Callable[[str, dict[str, Any], Callable[[Path], None]], Path]) -> Path:
    """The Python of a virtual environment holding TRANSFORMERS_4 over this one's packages: a .pth file puts this
    environment's site-packages (torch, ONNX Runtime, ...) after its own, whose transformers 4 and Hugging Face Hub
    shadow ours. Installed once by pip from the user's configured index into aiayn's cache (``venv_cache``);
    skipped, saying why, where pip cannot reach the index."""
    outer = site.getsitepackages()
    stamp = {"requirements": list(TRANSFORMERS_4), "site-packages": outer}

    def install(python: Path) -> None:
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

    return venv_cache("-".join(requirement.replace("==", "-") for requirement in TRANSFORMERS_4), stamp, install)


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
    as it is, Marian's and Pegasus's, and its pipeline("translation"), greedy, gives our texts but for at most one
    sentence (the ε)."""
    folder, ours, got = under_transformers4(kind)
    assert got["versions"]["transformers"] == TRANSFORMERS_4[0].split("==")[1]
    assert got["position_table_difference"] == (None if kind == "imported" else 0.0)
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
