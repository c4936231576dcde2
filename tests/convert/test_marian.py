"""`aiayn import` of tiny Marian checkpoints made here, against transformers' own MarianMTModel and MarianTokenizer:
greedy output ids identical to ``generate`` on 200 sentences for every engine, teacher-forced log-probabilities
within 1e-4, beam 4's agreement stated, and each refusal in one line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import pytest

from aiayn.cli import main
from aiayn.core.folder import ModelFolder
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import SearchSettings

SENTENCES = 200
MakeCheckpoint = Callable[..., Path]
EXTRA = 50  # the search's limit: source tokens + 50, as `generate(max_new_tokens=...)` is given
ENGINES = [("torch", "cpu"), ("onnx-portable", "cpu"), ("onnx", "cpu")]


def imported(checkpoint: Path, tmp_path: Path, *flags: str) -> ModelFolder:
    out = tmp_path / "model"
    assert main(["import", str(checkpoint), "--out", str(out), *flags]) == 0
    return ModelFolder.open(out)


def hf_outputs(
    checkpoint: Path, src_ids: list[list[int]], beams: int, never: tuple[int, ...] | None = None
) -> list[list[int]]:
    """``generate``'s output ids per source (without the start token and what follows </s>), sentences grouped by
    source length so that each group's max_new_tokens is its own source length + 50. ``never``: ids banned in place
    of the checkpoint's ``bad_words_ids``."""
    import torch
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(str(checkpoint)).eval()
    eos = model.config.eos_token_id
    banned = {} if never is None else {"bad_words_ids": [[i] for i in never]}
    outputs: list[list[int]] = [[] for _ in src_ids]
    for length in sorted({len(ids) for ids in src_ids}):
        group = [i for i, ids in enumerate(src_ids) if len(ids) == length]
        with torch.no_grad():
            generated = model.generate(
                torch.tensor([src_ids[i] for i in group]),
                num_beams=beams,
                do_sample=False,
                max_new_tokens=length + EXTRA,
                forced_eos_token_id=None,
                **banned,
            )
        for i, row in zip(group, generated.tolist(), strict=True):
            row = row[1:]  # the decoder's start token
            outputs[i] = row[: row.index(eos)] if eos in row else [t for t in row if t != model.config.pad_token_id]
    return outputs


def source_ids(checkpoint: Path, texts: list[str]) -> list[list[int]]:
    from transformers import MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(str(checkpoint))
    return [tokenizer(text)["input_ids"] for text in texts]


@pytest.mark.parametrize(("activation", "eos_first"), [("swish", True), ("relu", False)])
def test_greedy_equals_generate_for_every_engine(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path, activation: str, eos_first: bool
) -> None:
    checkpoint = marian_checkpoint(activation, eos_first)
    folder = imported(checkpoint, tmp_path)
    assert main(["export", str(folder.path), "--check-sentences", "0"]) == 0
    src = source_ids(checkpoint, held_out)
    assert [folder.tokenizer.encode_source(text) for text in held_out] == src
    expected = hf_outputs(checkpoint, src, beams=1)
    assert len({tuple(ids) for ids in expected}) > SENTENCES // 4, "the random model should not say one thing"
    for engine, device in ENGINES:
        translator = translator_for(folder, load_engine(folder, EngineOptions(engine, device)))
        ours = translator.translate_ids(src, SearchSettings(beam_size=1, max_extra_len=EXTRA))
        same = sum(a == b for a, b in zip(ours, expected, strict=True))
        assert same == SENTENCES, f"{engine}: {same}/{SENTENCES} identical to generate()"


def test_teacher_forced_log_probs_within_1e4(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path
) -> None:
    import torch
    from transformers import MarianMTModel

    checkpoint = marian_checkpoint("swish", True)
    folder = imported(checkpoint, tmp_path)
    assert main(["export", str(folder.path), "--check-sentences", "0"]) == 0
    src = source_ids(checkpoint, held_out[:16])
    targets = hf_outputs(checkpoint, src, beams=1)
    reference = MarianMTModel.from_pretrained(str(checkpoint)).eval()
    start = folder.config.special_tokens.bos
    for engine, device in ENGINES:
        model = load_engine(folder, EngineOptions(engine, device))
        worst = 0.0
        for ids, out in zip(src, targets, strict=True):
            decoder_in = [start, *out]
            with torch.no_grad():
                theirs = reference(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([decoder_in]))
            expected = theirs.logits.log_softmax(-1)[0].numpy()  # (len, vocab)
            state = model.start(np.array([ids], dtype=np.int64))
            for position, token in enumerate(decoder_in):
                log_probs, state = model.step(state, np.array([[token]], dtype=np.int64))
                worst = max(worst, float(np.abs(log_probs[0] - expected[position]).max()))
        assert worst < 1e-4, f"{engine}: max |Δ log-prob| {worst:.2e}"


def test_beam_4_with_the_checkpoints_normalisation(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path
) -> None:
    """generate(num_beams=4) stops by its own rule (while the best live beam could still win), ours by fairseq's
    (once 4 hypotheses ended); both rank finished ones by log-probability / |Y|^1.0. The share that agrees is
    stated here, and must be most of them."""
    checkpoint = marian_checkpoint("swish", True)
    folder = imported(checkpoint, tmp_path)
    settings = json.loads(folder.config_file.read_text())["search"]
    assert settings == {"beam_size": 4, "length_penalty": 1.0, "length_normalization": "power"}
    src = source_ids(checkpoint, held_out)
    expected = hf_outputs(checkpoint, src, beams=4)
    translator = translator_for(folder, load_engine(folder, EngineOptions("onnx", "cpu")))
    from aiayn.search.translator import SearchSettings

    ours = translator.translate_ids(src, SearchSettings.of(folder, max_extra_len=EXTRA))
    same = sum(a == b for a, b in zip(ours, expected, strict=True))
    print(f"beam 4, power normalisation: {same}/{SENTENCES} identical to generate(num_beams=4)")
    assert same >= 0.9 * SENTENCES


def test_translate_and_page_route_take_the_imported_folder(
    marian_checkpoint: MakeCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`aiayn translate --model FOLDER`, and the page's API and JSON route serving it: each gives the serving
    engine's beam-4 translation of each line with the folder's tokenizer and search settings."""
    import socket
    import urllib.request

    from gradio_client import Client

    from aiayn.serve.api import json_route
    from aiayn.serve.page import build_app
    from aiayn.serve.server import launch
    from aiayn.serve.service import TranslationService

    folder = imported(marian_checkpoint("swish", True), tmp_path)
    lines = ["Two dogs play in the snow.", "A man sits."]
    translator = translator_for(folder, load_engine(folder, EngineOptions("onnx", "cpu")))
    expected = translator.translate(lines, SearchSettings.of(folder, beam_size=4))
    assert all(expected)
    capsys.readouterr()
    assert main(["translate", "--model", str(folder.path), "--beam", "4", "\n".join(lines)]) == 0
    assert capsys.readouterr().out.splitlines() == expected

    service = TranslationService(EngineOptions(device="cpu"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    page = build_app(service, [str(folder.path)])
    launch(page, port=port, routes=[json_route(service)])
    try:
        url = f"http://127.0.0.1:{port}/"
        answer = Client(url, verbose=False).predict("\n".join(lines), "en-de", 4, api_name="/translate")[0]
        assert answer.splitlines() == expected
        body = json.dumps({"sentences": lines, "direction": "en-de", "beam": 4}).encode()
        request = urllib.request.Request(f"{url}v1/translate", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.loads(response.read())["translations"] == expected
    finally:
        page.close()


def test_refusals_name_what_and_why(
    marian_checkpoint: MakeCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = marian_checkpoint("swish", True)
    capsys.readouterr()  # transformers' progress bar, where the checkpoint is made now

    def refused(change_config: dict[str, object], vocab_extra: dict[str, int] | None = None) -> str:
        broken = tmp_path / f"broken-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(source, broken)
        config = json.loads((broken / "config.json").read_text())
        (broken / "config.json").write_text(json.dumps({**config, **change_config}))
        if vocab_extra:
            vocab = json.loads((broken / "vocab.json").read_text())
            (broken / "vocab.json").write_text(json.dumps({**vocab, **vocab_extra}))
        assert main(["import", str(broken), "--out", str(broken / "out")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and not (broken / "out").exists()
        return err

    assert "model_type 'bart' is not supported" in refused({"model_type": "bart"})
    assert "separate source and target vocabularies" in refused({"share_encoder_decoder_embeddings": False})
    assert "import it once per target with --tgt, one of fra" in refused({}, {">>fra<<": 10**6})
    assert "activation_function 'gelu_new'" in refused({"activation_function": "gelu_new"})
    assert "neither a folder nor a Hugging Face Hub id" in refused_source("no such/place/x", tmp_path, capsys)


def test_import_refuses_a_folder_it_did_not_write_before_reading_and_replaces_its_own_whole(
    marian_checkpoint: MakeCheckpoint,
    tiny_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    folder_bytes: Callable[[Path], dict[str, str]],
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_folder, model)  # a model folder `aiayn import` did not write
    before = folder_bytes(model)
    assert main(["import", "no such/place/x", "--out", str(model)]) == 2  # refused before the source is read
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{model} holds config.json, which aiayn import did not write; choose another --out" in err
    assert "--overwrite" in err and folder_bytes(model) == before
    source = marian_checkpoint("swish", True)
    folder = imported(source, tmp_path / "again")
    first = folder_bytes(folder.path)
    assert imported(source, tmp_path / "again").path == folder.path  # its own output: imported again, whole
    assert set(folder_bytes(folder.path)) == set(first)
    (folder.path / "notes.txt").write_text("mine", encoding="utf-8")
    assert main(["import", str(source), "--out", str(folder.path)]) == 2
    assert "holds notes.txt, which aiayn import did not write" in capsys.readouterr().err
    assert imported(source, tmp_path / "again", "--overwrite")  # its own files replaced, the others kept
    assert (folder.path / "notes.txt").read_text(encoding="utf-8") == "mine"


def refused_source(source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["import", source, "--out", str(tmp_path / "never")]) == 2
    return capsys.readouterr().err.strip()


def test_bundled_folders_keep_their_fingerprint(bundled: dict[str, Path]) -> None:
    """The config's new fields leave the bundled folders' config, and so their exported graphs' stamp, as they were."""
    import onnx

    from aiayn.core.contract import CONFIG_FINGERPRINT_KEY

    for path in bundled.values():
        folder = ModelFolder.open(path)
        stamped = {p.key: p.value for p in onnx.load(str(folder.onnx_file("encoder.onnx"))).metadata_props}
        assert stamped[CONFIG_FINGERPRINT_KEY] == folder.config.fingerprint()


def test_the_browser_folder_translates_as_generate(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path
) -> None:
    """The imported folder's browser folder (tokenizers.js with the converted SentencePiece, onnxruntime-web, the
    ported search) in Chromium: greedy, each line's text is the decode of generate()'s ids, as `aiayn translate`'s."""
    from transformers import MarianTokenizer

    from aiayn.bench.web import CHROMIUM, chromium, cli_translations, open_page, served_folder, translate_in_page
    from aiayn.serve.service import TranslationService

    if CHROMIUM is None:
        pytest.skip("Chromium is not installed: apt-get install -y chromium (Debian's package)")
    checkpoint = marian_checkpoint("swish", True)
    folder = imported(checkpoint, tmp_path)
    assert main(["export", str(folder.path), "--check-sentences", "0"]) == 0
    web = tmp_path / "web"
    if main(["export", str(folder.path), "--to", "web", "--out", str(web)]) != 0:
        pytest.skip("the npm files for the browser folder are unavailable")
    reference = MarianTokenizer.from_pretrained(str(checkpoint))
    expected = [
        reference.decode(ids, skip_special_tokens=True)
        for ids in hf_outputs(checkpoint, source_ids(checkpoint, held_out), beams=1)
    ]
    model = TranslationService(EngineOptions(device="cpu")).model(str(folder.path))
    assert cli_translations(model, held_out, 1) == expected
    with chromium() as browser, served_folder(web) as url:
        page, _ = open_page(browser, url)
        got, _ = translate_in_page(page, held_out, 1)
        page.close()
    same = sum(a == b for a, b in zip(got, expected, strict=True))
    assert same == SENTENCES, f"browser: {same}/{SENTENCES} identical to generate()"


def test_a_hub_id_is_read_through_the_hubs_cache(
    marian_checkpoint: MakeCheckpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hub id goes through huggingface_hub (its cache, its settings): here an offline cache that holds the
    checkpoint, laid out as the Hub's client lays out a download."""
    cache = tmp_path / "hub"
    repo = cache / "models--Helsinki-NLP--opus-mt-en-de"
    commit = "0" * 40
    shutil.copytree(marian_checkpoint("swish", True), repo / "snapshots" / commit)
    (repo / "snapshots" / commit / "README.md").write_text(
        "---\nlanguage: [en, de]\nlicense: cc-by-4.0\n---\n# A card\n"
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    folder = imported(Path("Helsinki-NLP/opus-mt-en-de"), tmp_path)
    assert folder.section("imported")["from"] == "Helsinki-NLP/opus-mt-en-de"
    assert (folder.config.src_lang, folder.config.tgt_lang) == ("en", "de")
    assert folder.provenance() == "imported from Helsinki-NLP/opus-mt-en-de (licence cc-by-4.0)"


def fine_tune(
    parent: ModelFolder, parallel: tuple[list[str], list[str]], tgt: str, tmp_path: Path
) -> tuple[Path, dict[tuple[str, str], Path]]:
    """`aiayn train --init-from parent` for 3 epochs on 300 pairs (60 to validate) written as train/valid.en/.tgt:
    the new folder and the files."""
    files = {}
    for split, rows in (("train", slice(0, 300)), ("valid", slice(300, 360))):
        for lang, lines in (("en", parallel[0]), (tgt, parallel[1])):
            files[split, lang] = tmp_path / f"{split}.{lang}"
            files[split, lang].write_text("\n".join(lines[rows]) + "\n", encoding="utf-8")
    out = tmp_path / "fine-tuned"
    command = ["train", "--init-from", str(parent.path), "--out", str(out), "--epochs", "3", "--device", "cpu"]
    command += ["--train-files", str(files["train", "en"]), str(files["train", tgt])]
    command += ["--valid-files", str(files["valid", "en"]), str(files["valid", tgt])]
    assert main(command) == 0
    return out, files


def test_fine_tuning_an_imported_model_lowers_validation_loss(
    marian_checkpoint: MakeCheckpoint, parallel: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """`aiayn train --init-from` an imported folder on the user's files: both tokenizers kept, the loss falls,
    and the new folder translates and exports."""
    parent = imported(marian_checkpoint("swish", True), tmp_path)
    english = parallel[0]
    out, files = fine_tune(parent, parallel, "de", tmp_path)
    record = json.loads((out / "training.json").read_text())
    losses = [epoch["val_loss"] for epoch in record["epochs"]]
    assert losses[-1] < losses[0], losses
    for name in ("tokenizer.json", "target_tokenizer.json"):
        assert (out / name).read_bytes() == (parent.path / name).read_bytes()
    checkpoint = marian_checkpoint("swish", True).name
    assert parent.provenance() == f"imported from the checkpoint folder {checkpoint} (no licence in its model card)"
    assert ModelFolder.open(out).provenance() == (
        f"trained further on train.en + train.de (300 pairs) from model, which was {parent.provenance()}"
    )
    assert main(["export", str(out), "--check-sentences", "20"]) == 0
    assert main(["translate", "--model", str(out), english[0]]) == 0
    test_files = [str(files["valid", "en"]), str(files["valid", "de"])]
    assert main(["eval", "--model", str(parent.path), "--engine", "onnx", "--test-files", *test_files]) == 0


def test_an_imported_folder_serves_as_a_space_from_a_fresh_environment(
    marian_checkpoint: MakeCheckpoint,
    space_python: Path,
    serve_space: Callable[..., AbstractContextManager[str]],
    tmp_path: Path,
) -> None:
    """`aiayn export --to space` of an imported folder: its licence in the front matter, its Hub id or source on the
    page, and its API answering as `aiayn translate --model FOLDER` in a fresh environment of its requirements."""
    import subprocess
    import sys
    import urllib.request

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(marian_checkpoint("swish", True), checkpoint)
    (checkpoint / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    folder = imported(checkpoint, tmp_path)
    space = tmp_path / "space"
    assert main(["export", str(folder.path), "--to", "space", "--out", str(space)]) == 0
    readme = (space / "README.md").read_text()
    assert '\nlicense: "apache-2.0"\n' in readme and "imported from the checkpoint folder checkpoint" in readme
    lines = ["Two dogs play in the snow.", "A man sits on a bench."]
    with serve_space(space_python, space, tmp_path / "space.log") as url:
        for beam in (1, 4):
            command = [sys.executable, "-m", "aiayn.cli", "translate", "--model", str(folder.path), "--beam", str(beam)]
            done = subprocess.run(command, input="\n".join(lines), capture_output=True, text=True, check=True)
            body = json.dumps({"sentences": lines, "direction": "en-de", "beam": beam}).encode()
            request = urllib.request.Request(f"{url}v1/translate", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as answer:
                assert json.loads(answer.read())["translations"] == done.stdout.split("\n")[: len(lines)]


# A multi-target checkpoint: its vocabulary holds >>pob<< and >>por<<, and a source that starts with one is
# translated into that language (random weights here: the two tokens steer the decoder as any two ids would).
TARGETS = ("pob", "por")


def language_ids(checkpoint: Path) -> set[int]:
    vocab = json.loads((checkpoint / "vocab.json").read_text(encoding="utf-8"))
    return {vocab[f">>{code}<<"] for code in TARGETS}


def with_token(code: str, texts: list[str]) -> list[str]:
    """What transformers' users type: the target's token in front of every sentence."""
    return [f">>{code}<< {text}" for text in texts]


def test_a_target_of_a_multi_target_checkpoint_translates_as_generate_with_its_token(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`aiayn import --tgt por`: the folder's sources start with >>por<< exactly as MarianTokenizer(">>por<< " +
    line) encodes them, and greedy search on the torch engine and the serving graphs gives generate()'s ids. The
    folder never generates a language token, where generate bans only <pad>: equal to generate with those banned
    too on all 200, and to plain generate on every sentence where it emits none."""
    checkpoint = marian_checkpoint("swish", True, TARGETS)
    folder = imported(checkpoint, tmp_path, "--tgt", "por")
    assert "every source starts with >>por<<, one of 2 targets" in capsys.readouterr().out
    config, languages = folder.config, language_ids(checkpoint)
    vocab = json.loads((checkpoint / "vocab.json").read_text(encoding="utf-8"))
    assert (config.tgt_lang, config.source_prefix) == ("por", (vocab[">>por<<"],))
    assert languages <= set(config.never_generate)
    src = source_ids(checkpoint, with_token("por", held_out))
    assert [folder.tokenizer.encode_source(text) for text in held_out] == src
    assert all(ids[0] == vocab[">>por<<"] for ids in src)
    expected = hf_outputs(checkpoint, src, beams=1, never=config.never_generate)
    plain = hf_outputs(checkpoint, src, beams=1)
    assert len({tuple(ids) for ids in expected}) > SENTENCES // 4, "the random model should not say one thing"
    emitting = [i for i, ids in enumerate(plain) if languages & set(ids)]
    print(f"plain generate() emits a language token in {len(emitting)}/{SENTENCES} sentences")
    for engine, device in [("torch", "cpu"), ("onnx", "cpu")]:
        translator = translator_for(folder, load_engine(folder, EngineOptions(engine, device)))
        ours = translator.translate_ids(src, SearchSettings(beam_size=1, max_extra_len=EXTRA))
        same = sum(a == b for a, b in zip(ours, expected, strict=True))
        assert same == SENTENCES, f"{engine}: {same}/{SENTENCES} identical to generate()"
        differ = [i for i, (a, b) in enumerate(zip(ours, plain, strict=True)) if a != b]
        assert set(differ) <= set(emitting), f"{engine}: differs from plain generate() on {differ[:5]}"


def test_beam_4_of_a_target_with_the_checkpoints_normalisation(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path
) -> None:
    """As ``test_beam_4_with_the_checkpoints_normalisation``, with >>por<< before every source: the share that
    agrees with generate(num_beams=4) (language tokens banned in both) is stated, and must be most of them."""
    from aiayn.search.translator import SearchSettings

    checkpoint = marian_checkpoint("swish", True, TARGETS)
    folder = imported(checkpoint, tmp_path, "--tgt", "por")
    src = source_ids(checkpoint, with_token("por", held_out))
    expected = hf_outputs(checkpoint, src, beams=4, never=folder.config.never_generate)
    translator = translator_for(folder, load_engine(folder, EngineOptions("onnx", "cpu")))
    ours = translator.translate_ids(src, SearchSettings.of(folder, max_extra_len=EXTRA))
    same = sum(a == b for a, b in zip(ours, expected, strict=True))
    print(f"multi-target, beam 4, power normalisation: {same}/{SENTENCES} identical to generate(num_beams=4)")
    assert same >= 0.9 * SENTENCES


def test_two_targets_of_one_checkpoint_translate_differently_and_share_their_files(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One folder per target: each translates 50 lines as transformers does with its own token (the CLI's text
    too), the two differ, and the second can take the first's weights file and graphs as hard links (one copy on
    disk)."""
    import os

    from safetensors.numpy import load_file
    from transformers import MarianTokenizer

    from aiayn.serve.service import TranslationService

    checkpoint = marian_checkpoint("swish", True, TARGETS)
    reference = MarianTokenizer.from_pretrained(str(checkpoint))
    folders = {code: imported(checkpoint, tmp_path / code, "--tgt", code) for code in TARGETS}
    por, pob = folders["por"], folders["pob"]
    assert por.config.fingerprint() == pob.config.fingerprint()
    por_weights, pob_weights = (load_file(str(folder.weights_file)) for folder in (por, pob))
    assert por_weights.keys() == pob_weights.keys()
    assert all(np.array_equal(por_weights[k], pob_weights[k]) for k in por_weights)
    assert main(["export", str(por.path), "--check-sentences", "0"]) == 0
    for graph in por.path.glob("*.onnx"):
        os.link(graph, pob.path / graph.name)
    pob.weights_file.unlink()
    os.link(por.weights_file, pob.weights_file)
    capsys.readouterr()
    lines = held_out[:50]

    translations = {}
    for code, folder in folders.items():
        src = source_ids(checkpoint, with_token(code, lines))
        expected = hf_outputs(checkpoint, src, beams=1, never=folder.config.never_generate)
        contract = load_engine(folder, EngineOptions("onnx-portable", "cpu"))  # the contract's graphs
        translator = translator_for(folder, contract)
        ours = translator.translate_ids(src, SearchSettings(beam_size=1, max_extra_len=EXTRA))
        same = sum(a == b for a, b in zip(ours, expected, strict=True))
        assert same == len(lines), f"{code}: {same}/{len(lines)} identical to generate()"
        translations[code] = [reference.decode(ids, skip_special_tokens=True) for ids in expected]
        # The doors that take text: `aiayn translate` and the service behind the page and its JSON route.
        assert main(["translate", "--model", str(folder.path), "--beam", "1", lines[0]]) == 0
        assert capsys.readouterr().out.strip() == translations[code][0]
        service = TranslationService(EngineOptions(device="cpu"))
        result = service.translate("\n".join(lines[:20]), str(folder.path), beam_size=1)
        assert result.text.split("\n") == translations[code][:20]
    differ = sum(a != b for a, b in zip(translations["por"], translations["pob"], strict=True))
    print(f"two targets of one checkpoint: {differ}/{len(lines)} lines translated differently")
    assert differ > len(lines) // 2


def test_a_multi_target_checkpoint_without_a_known_target_is_refused_with_its_codes(
    marian_checkpoint: MakeCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = marian_checkpoint("swish", True, TARGETS)
    for flags, says in (
        ([], "import it once per target with --tgt, one of pob, por"),
        (["--tgt", "pt"], "--tgt pt is not a target of this checkpoint; choose one of pob, por"),
    ):
        out = tmp_path / f"never-{len(flags)}"
        assert main(["import", str(checkpoint), "--out", str(out), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1 and not out.exists()


def test_ctranslate2_gets_the_target_token_before_each_source(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path
) -> None:
    """The CTranslate2 export of a target's folder: its sources start with >>por<< as ours do, and its greedy ids
    are generate()'s."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 (the dev install) is not installed")
    from aiayn.export.ctranslate2 import ctranslate2_greedy, ctranslate2_sources, export_ctranslate2
    from aiayn.model.weights import load_model

    checkpoint = marian_checkpoint("swish", True, TARGETS)
    folder = imported(checkpoint, tmp_path, "--tgt", "por")
    assert {source[0] for source in ctranslate2_sources(folder.tokenizer, held_out)} == {">>por<<"}
    export_ctranslate2(load_model(folder), folder.tokenizer, folder.path)
    src = source_ids(checkpoint, with_token("por", held_out))
    expected = hf_outputs(checkpoint, src, beams=1, never=folder.config.never_generate)
    assert ctranslate2_greedy(folder.path, folder.tokenizer, held_out, EXTRA) == expected


def test_the_browser_folder_of_a_target_translates_as_generate(
    marian_checkpoint: MakeCheckpoint, held_out: list[str], tmp_path: Path
) -> None:
    """A target's browser folder in Chromium: the page reads the config's source prefix, and each line's greedy
    text is the decode of generate()'s ids for ">>por<< " + line."""
    from transformers import MarianTokenizer

    from aiayn.bench.web import CHROMIUM, chromium, open_page, served_folder, translate_in_page

    if CHROMIUM is None:
        pytest.skip("Chromium is not installed: apt-get install -y chromium (Debian's package)")
    checkpoint = marian_checkpoint("swish", True, TARGETS)
    folder = imported(checkpoint, tmp_path, "--tgt", "por")
    assert main(["export", str(folder.path), "--check-sentences", "0"]) == 0
    web = tmp_path / "web"
    if main(["export", str(folder.path), "--to", "web", "--out", str(web)]) != 0:
        pytest.skip("the npm files for the browser folder are unavailable")
    reference = MarianTokenizer.from_pretrained(str(checkpoint))
    src = source_ids(checkpoint, with_token("por", held_out))
    expected = [
        reference.decode(ids, skip_special_tokens=True)
        for ids in hf_outputs(checkpoint, src, beams=1, never=folder.config.never_generate)
    ]
    with chromium() as browser, served_folder(web) as url:
        page, _ = open_page(browser, url)
        got, _ = translate_in_page(page, held_out, 1)
        page.close()
    same = sum(a == b for a, b in zip(got, expected, strict=True))
    assert same == SENTENCES, f"browser: {same}/{SENTENCES} identical to generate()"


def test_fine_tuning_a_target_puts_its_token_before_every_training_source(
    marian_checkpoint: MakeCheckpoint, parallel: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """`aiayn train --init-from` a target's folder: the prepared source ids start with >>por<<, as MarianTokenizer
    encodes ">>por<< " + line, the loss falls, and the new folder keeps the prefix (and `aiayn eval` takes it)."""
    from transformers import MarianTokenizer

    from aiayn.data.prepare import PreparedData

    checkpoint = marian_checkpoint("swish", True, TARGETS)
    parent = imported(checkpoint, tmp_path, "--tgt", "por")
    english = parallel[0]
    out, files = fine_tune(parent, parallel, "por", tmp_path)
    reference = MarianTokenizer.from_pretrained(str(checkpoint))
    prepared = PreparedData.open(out / "data").train
    expected = [reference(text)["input_ids"][:-1] for text in with_token("por", english[:300])]
    assert [prepared.src[i] for i in range(len(prepared))] == expected
    record = json.loads((out / "training.json").read_text())
    losses = [epoch["val_loss"] for epoch in record["epochs"]]
    assert losses[-1] < losses[0], losses
    assert ModelFolder.open(out).config.source_prefix == parent.config.source_prefix
    test_files = [str(files["valid", "en"]), str(files["valid", "por"])]
    assert main(["eval", "--model", str(out), "--engine", "onnx", "--test-files", *test_files]) == 0


def test_a_hub_import_reads_the_revision_asked_and_records_the_commit_it_read(
    marian_checkpoint: MakeCheckpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No network: the Hub's download is replaced by one that answers from a cache laid out as the Hub's is."""
    import huggingface_hub

    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--org--opus-mt-en-de" / "snapshots" / commit
    shutil.copytree(marian_checkpoint("swish", True), snapshot)
    asked: list[tuple[str, str | None]] = []

    def download(repo_id: str, revision: str | None = None, **_: object) -> str:
        asked.append((repo_id, revision))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    out = tmp_path / "model"
    assert main(["import", "org/opus-mt-en-de", "--revision", "v1.0", "--out", str(out)]) == 0
    assert asked == [("org/opus-mt-en-de", "v1.0")]
    imported = ModelFolder.open(out).section("imported")
    assert (imported["from"], imported["hub"], imported["revision"]) == ("org/opus-mt-en-de", True, commit)


def test_a_revision_for_a_local_folder_is_refused_in_one_line(
    marian_checkpoint: MakeCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = marian_checkpoint("swish", True)
    capsys.readouterr()  # what making the checkpoint printed
    assert main(["import", str(checkpoint), "--revision", "v1.0", "--out", str(tmp_path / "model")]) == 2
    assert capsys.readouterr().err == (
        f"aiayn import: error: --revision picks a commit of a Hub id; {checkpoint} is a folder, read as it is\n"
    )
    assert not (tmp_path / "model").exists()


def test_a_pytorch_model_bin_that_pickles_code_is_refused_and_never_runs(
    marian_checkpoint: MakeCheckpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return open, (str(marker), "w")

    marker, checkpoint = tmp_path / "ran", tmp_path / "shared"
    shutil.copytree(marian_checkpoint("swish", True), checkpoint)
    (checkpoint / "model.safetensors").unlink()
    torch.save({"model.shared.weight": torch.zeros(2), "config": Payload()}, checkpoint / "pytorch_model.bin")
    capsys.readouterr()  # what making the checkpoint printed
    assert main(["import", str(checkpoint), "--out", str(tmp_path / "model")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aiayn import: error: {checkpoint / 'pytorch_model.bin'} cannot be read as data alone")
    assert err.endswith("which could run code), so it is refused unread\n") and err.count("\n") == 1
    assert not marker.exists() and not (tmp_path / "model").exists()
