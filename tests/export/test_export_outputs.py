"""`aiayn export --to web|space|transformers|ctranslate2` writes over nothing but its own earlier output: a folder
holding anything else is refused in one line and left byte for byte; its own is replaced whole."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from aiayn.cli import main
from aiayn.core.outputs import MANIFEST_FILE

Bytes = Callable[[Path], dict[str, str]]
FOLDERS = ("web", "space", "transformers")  # the targets written into --out


def export(model: Path, to: str, out: Path | None, *flags: str) -> int:
    """`aiayn export MODEL --to TO`: into --out, or (ctranslate2) into MODEL/ctranslate2, checked on one sentence
    written beside the model folder."""
    if out is not None:
        return main(["export", str(model), "--to", to, "--out", str(out), *flags])
    check = model.parent / "check.en"
    check.write_text("the red cat sleeps on the old chair.\n", encoding="utf-8")
    return main(["export", str(model), "--to", to, "--check-sentences", "1", "--check-files", str(check), *flags])


def refused_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("to", FOLDERS)
def test_a_model_folder_as_out_is_refused_and_left_byte_for_byte(
    to: str, tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], folder_bytes: Bytes
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_folder, model)
    before = folder_bytes(model)
    assert export(tiny_folder, to, model) == 2
    err = refused_line(capsys)
    assert f"{model} holds config.json, which aiayn export --to {to} did not write; choose another --out" in err
    assert "--overwrite" in err and folder_bytes(model) == before
    assert export(model, to, model, "--overwrite") == 2  # the model folder itself, the export's input
    assert f"--overwrite would delete {model.resolve()}" in refused_line(capsys) and folder_bytes(model) == before


def test_a_ctranslate2_folder_it_did_not_write_is_refused_and_the_model_folder_left_byte_for_byte(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], folder_bytes: Bytes
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_folder, model)
    (model / "ctranslate2").mkdir()
    (model / "ctranslate2" / "notes.txt").write_text("mine", encoding="utf-8")
    before = folder_bytes(model)
    assert export(model, "ctranslate2", None) == 2
    err = refused_line(capsys)
    assert f"{model / 'ctranslate2'} holds notes.txt, which aiayn export --to ctranslate2 did not write" in err
    assert "--overwrite" in err and folder_bytes(model) == before


@pytest.mark.parametrize("to", [*FOLDERS, "ctranslate2"])
def test_its_own_output_is_replaced_whole_a_foreign_file_in_it_needs_overwrite(
    to: str, tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], folder_bytes: Bytes
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_folder, model)
    out = model / "ctranslate2" if to == "ctranslate2" else tmp_path / to
    given = None if to == "ctranslate2" else out
    assert export(model, to, given) == 0
    first = folder_bytes(out)
    listed = json.loads((out / MANIFEST_FILE).read_text())["files"]
    assert sorted([*listed, MANIFEST_FILE]) == sorted(first)  # the manifest lists every file the export wrote
    assert export(model, to, given) == 0  # its own: written again, whole
    assert set(folder_bytes(out)) == set(first)
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    capsys.readouterr()
    before = folder_bytes(out)
    assert export(model, to, given) == 2
    assert f"holds notes.txt, which aiayn export --to {to} did not write" in refused_line(capsys)
    assert folder_bytes(out) == before
    assert export(model, to, given, "--overwrite") == 0
    assert set(folder_bytes(out)) == {*first, "notes.txt"}  # its own files replaced, the foreign one kept, named
    assert f"--overwrite kept 1 file(s) in {out} that aiayn export --to {to} did not write: notes.txt" in (
        capsys.readouterr().err
    )
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # nothing left beside


def test_a_space_exported_again_keeps_no_stale_file(tiny_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "space"
    assert export(tiny_folder, "space", out, "--device", "cuda") == 0
    assert (out / "model" / "encoder.onnx").is_file()  # a GPU Space carries the graphs
    assert export(tiny_folder, "space", out) == 0
    assert not (out / "model" / "encoder.onnx").exists()  # a CPU Space builds them from the weights


def test_an_export_that_fails_midway_leaves_the_old_output_whole(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder_bytes: Bytes
) -> None:
    out = tmp_path / "space"
    assert export(tiny_folder, "space", out) == 0
    before = folder_bytes(out)

    def disk_full(*args: object) -> list[str]:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("aiayn.export.space.requirements", disk_full)  # after the model and app.py are written
    with pytest.raises(OSError, match="No space left"):
        export(tiny_folder, "space", out, "--variant", "w8")
    assert folder_bytes(out) == before and [p.name for p in tmp_path.iterdir()] == ["space"]
