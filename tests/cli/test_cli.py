"""`aiayn translate`: one line in, one line out, batched; exit code 2 and one clear line for every bad input."""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aiayn.cli import main
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import SearchSettings
from aiayn.serve.service import TranslationService
from aiayn.text.sentences import MAX_SENTENCE_TOKENS, split_long

LINES = ["Two dogs play in the snow.", "", "A girl jumps into the pool. A man is cooking.", "A dog runs on the sand."]
EXPECTED = [
    "Zwei Hunde spielen im Schnee.",
    "",
    "Ein Mädchen springt in das Schwimmbecken. Ein Mann kocht.",  # beam 4 at the folder's |Y|^α 1.4
    "Ein Hund rennt auf dem Sand.",
]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_standard_input_line_for_line(bundled: dict[str, Path]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aiayn.cli", "translate", "--device", "cpu"],
        input="\n".join(LINES) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.splitlines() == EXPECTED
    assert "engine onnx, execution provider: CPUExecutionProvider" in result.stderr  # the engine it took


def test_a_file_with_a_progress_bar_and_the_torch_engine_agrees(
    bundled: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    code, out, err = run_cli(["translate", "--input", str(source), "--device", "cpu"], capsys)
    assert code == 0 and out.splitlines() == EXPECTED
    assert "4/4" in err  # tqdm on stderr: 4 sentences searched
    code, torch_out, err = run_cli(["translate", "--input", str(source), "--engine", "torch"], capsys)
    assert code == 0 and torch_out == out and "engine torch" in err


def test_text_argument_and_beam_one(bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["translate", "--model", "de-en", "--beam", "1", "Zwei Hunde spielen im Schnee."], capsys)
    assert code == 0 and out == "Two dogs play in the snow.\n"


@pytest.mark.parametrize("variant", ["w8", "w4"])
def test_the_variant_flag_reaches_the_engine(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str], variant: str
) -> None:
    args = ["translate", "--model", "de-en", "--beam", "1", "--device", "cpu", "--variant", variant]
    code, out, err = run_cli([*args, "Zwei Hunde spielen im Schnee."], capsys)
    assert code == 0 and out.startswith("Two dogs") and out.count("\n") == 1  # w4 says "are playing"
    assert f"execution provider: CPUExecutionProvider, {variant} weights" in err
    code, out, err = run_cli([*args, "--engine", "torch", "Ein Hund."], capsys)
    assert code == 2 and out == "" and "the torch engine runs fp32 only; use --engine onnx" in err


def test_eval_scores_a_variant(
    bundled: dict[str, Path], multi30k_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --engine, a variant other than fp32 takes the onnx engine (torch runs fp32 only)."""
    args = ["eval", "--model", "en-de", "--variant", "w4", "--limit", "8", "--beam", "1", "--json"]
    code, out, err = run_cli([*args, "--data", str(multi30k_dir)], capsys)
    assert code == 0 and "engine onnx (w4)" in err
    assert json.loads(out)["variant"] == "w4"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["translate", "--input", "/no/such/file.txt"], "--input /no/such/file.txt: no such file"),
        (["translate", "--model", "xx-yy", "a"], "model 'xx-yy' is neither a folder nor a bundled model"),
        (["translate", "--input", "README.md", "a dog"], "give either TEXT or --input FILE, not both"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == ""
    assert err.startswith("aiayn translate: error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("flags", [["--beam", "9"], ["--device", "gpu"], ["--cores", "0"], ["--engine", "tf"]])
def test_bad_flags_are_refused_by_the_parser(capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", *flags, "a dog"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("usage: aiayn translate")
    assert "invalid" in err or "must be a positive integer" in err or "must be a whole number from 1 to 8" in err


def test_non_utf8_input_is_refused(
    bundled: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Ein Hund läuft.\n".encode("latin-1"))
    code, _, err = run_cli(["translate", "--model", "de-en", "--input", str(latin1)], capsys)
    assert code == 2 and "is not UTF-8 text (byte 10); convert it to UTF-8 first" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe bad")))
    code, _, err = run_cli(["translate"], capsys)
    assert code == 2 and "standard input is not UTF-8 text" in err


def test_cuda_without_a_gpu_is_a_clear_error(bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["translate", "--device", "cuda", "A dog."], capsys)
    if code == 0:
        pytest.skip("a GPU runs ONNX Runtime here")
    assert code == 2 and "--device cuda: ONNX Runtime cannot run on a GPU here" in err
    assert "Traceback" not in err and "[E:onnxruntime" not in err


def test_the_torch_engine_runs_on_the_device_asked_or_says_why_not(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("PyTorch sees a GPU here")
    code, _, err = run_cli(["translate", "--engine", "torch", "--device", "cuda", "A dog."], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "aiayn translate: error: --device cuda: PyTorch cannot run on a GPU here (it sees no GPU); use --device cpu, "
        "or auto to take the GPU only where it works"
    ]


def test_emoji_other_scripts_and_long_sentences_in_the_service(bundled: dict[str, Path]) -> None:
    model = TranslationService(EngineOptions(device="cpu")).model("en-de")
    plain = model.translate("A dog runs on the beach.", 4).text
    with_emoji = model.translate("A dog 🐕 runs on the beach. Привет!", 4)
    assert with_emoji.text == f"{plain} Привет!"  # the emoji left out and said so; the Russian kept as is
    assert with_emoji.left_out == ["🐕"] and with_emoji.unchanged == 1
    long_sentence = " ".join(["the big dog runs and the small cat sleeps"] * 45)  # ~410 tokens, one sentence
    pieces = split_long(long_sentence, model.count_tokens)
    assert len(pieces) >= 3 and " ".join(pieces) == long_sentence
    assert all(len(ids) <= MAX_SENTENCE_TOKENS for ids in model.prepare(long_sentence).src_ids)
    every_piece = " ".join(model.translator.translate(pieces, SearchSettings(beam_size=1)))
    assert model.translate(long_sentence, 1).text == every_piece  # nothing truncated, nothing dropped
    assert model.translate("", 4).text == "" and model.translate(" \n ", 4).text == ""


def test_no_clauses_translates_every_sentence_whole(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    sentence = "A man in a red shirt is riding a bike down the street, and a woman is walking her dog in the park."
    split = TranslationService(EngineOptions(device="cpu")).model("en-de")
    whole = TranslationService(EngineOptions(device="cpu"), split_clauses=False).model("en-de")
    assert len(split.prepare(sentence).src_ids) == 2 and len(whole.prepare(sentence).src_ids) == 1
    alone = whole.translator.translate([sentence], replace(whole.search, beam_size=1))[0]  # as another runtime would
    assert whole.translate(sentence, 1).text == alone != split.translate(sentence, 1).text
    code, out, _ = run_cli(["translate", "--no-clauses", "--beam", "1", "--device", "cpu", sentence], capsys)
    assert code == 0 and out == alone + "\n"


@pytest.fixture
def damaged_folder(bundled: dict[str, Path], tmp_path: Path) -> Path:
    """A copy of the bundled en-de whose model.safetensors was cut short (an interrupted copy or download)."""
    folder = tmp_path / "damaged"
    shutil.copytree(bundled["en-de"], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])
    return folder


@pytest.mark.parametrize(
    "command",
    [
        ["translate", "--engine", "torch", "A dog."],
        ["translate", "--engine", "onnx", "--device", "cpu", "A dog."],
        ["eval", "--engine", "torch", "--limit", "1"],
        ["export"],
    ],
    ids=["translate-torch", "translate-onnx", "eval", "export"],
)
def test_a_damaged_weights_file_is_one_line_naming_it_in_every_command(
    damaged_folder: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest, command: list[str]
) -> None:
    if command[0] == "eval":
        request.getfixturevalue("multi30k_dir")  # eval reads its split before the weights
    model = [str(damaged_folder)] if command[0] == "export" else ["--model", str(damaged_folder)]
    code, out, err = run_cli([command[0], *model, *command[1:]], capsys)
    lines = [line for line in err.splitlines() if line.startswith(f"aiayn {command[0]}: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert f"{damaged_folder / 'model.safetensors'} is damaged (100000 bytes where its header says" in lines[0]
    assert "restore it" in lines[0] and "exported from other weights" not in err


def test_an_over_long_word_leaves_its_line_untranslated_and_the_rest_translated(
    bundled: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    word = "x" * 2000  # one word of far more than MAX_SENTENCE_TOKENS tokens
    source = tmp_path / "in.txt"
    source.write_text(f"{LINES[0]}\n{word} {LINES[3]}\n{LINES[3]}\n{word}\n", encoding="utf-8")
    code, out, err = run_cli(["translate", "--input", str(source), "--device", "cpu"], capsys)
    assert code == 2 and "Traceback" not in err
    # The sentence with the word is left out of its line (a line of one sentence stays blank); the rest translates.
    assert out.splitlines() == [EXPECTED[0], "", EXPECTED[3], ""]
    assert "line 2 not translated: a single word of" in err and "line 4 not translated:" in err
    assert err.splitlines()[-1] == (
        "aiayn translate: error: 2 sentence(s) not translated, on line(s) 2, 4; the rest is translated"
    )


def test_output_file_is_written_chunk_by_chunk_in_input_order(
    bundled: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiayn.cli.serve as cli_serve
    from aiayn.serve.service import LoadedModel

    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    written_before_each_chunk: list[list[str]] = []
    search = LoadedModel.run

    def run(self: LoadedModel, *args: Any, **kwargs: Any) -> Any:
        written_before_each_chunk.append(target.read_text(encoding="utf-8").splitlines())
        return search(self, *args, **kwargs)

    monkeypatch.setattr(cli_serve, "CHUNK_LINES", 2)
    monkeypatch.setattr(LoadedModel, "run", run)
    code, out, _ = run_cli(["translate", "--input", str(source), "--output", str(target), "--device", "cpu"], capsys)
    assert code == 0 and out == ""
    assert target.read_text(encoding="utf-8").splitlines() == EXPECTED
    assert written_before_each_chunk == [[], EXPECTED[:2]]  # the first chunk was on disk before the second ran


def test_output_into_a_missing_folder_is_one_line(bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["translate", "--output", "/no/such/dir/out.txt", "--device", "cpu", "A dog."], capsys)
    assert code == 2 and err.splitlines()[-1].startswith("aiayn translate: error: --output /no/such/dir/out.txt: ")


def test_folders_and_unwritable_outputs_are_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def load(self: TranslationService, name: str) -> None:
        raise AssertionError("the model was loaded before the files were checked")

    monkeypatch.setattr(TranslationService, "model", load)
    source = tmp_path / "in.txt"
    source.write_text("A dog.\n", encoding="utf-8")
    missing = tmp_path / "no" / "out.txt"
    for args, message in [
        (["--input", str(tmp_path)], f"--input {tmp_path}: is a folder; give a text file"),
        (["--input", str(source), "--output", str(tmp_path)], f"--output {tmp_path}: is a folder; give a file name"),
        (["--output", str(missing), "A dog."], f"--output {missing}: cannot write it (no folder {missing.parent})"),
    ]:
        code, out, err = run_cli(["translate", *args], capsys)
        assert code == 2 and out == "" and err.splitlines() == [f"aiayn translate: error: {message}"]
    assert not missing.parent.exists()


@pytest.mark.parametrize("inside", ["\f", "\v", "\u2028", "\x85"])
def test_only_real_line_breaks_make_output_lines(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str], inside: str
) -> None:
    code, out, _ = run_cli(["translate", "--device", "cpu", f"{LINES[0]}{inside}{LINES[3]}"], capsys)
    assert code == 0 and out.split("\n") == [f"{EXPECTED[0]} {EXPECTED[3]}", ""]


def test_serve_on_a_port_in_use_is_one_line_and_never_says_serving(bundled: dict[str, Path]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "aiayn.cli", "serve", "--port", str(port), "--device", "cpu"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "serving" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"aiayn serve: error: cannot listen on 127.0.0.1:{port}: the port is in use (or 127.0.0.1 is not an "
        "address of this machine); stop what listens there or choose another --port"
    )
