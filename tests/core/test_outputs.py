"""A command writes over nothing but its own earlier output, replaced whole once the new one is complete."""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

from aiayn.core.outputs import MANIFEST_FILE, Command, claim, mark, read_manifest, write_file, written_whole

MAKER = Command("aiayn make", "choose another --out, or pass --overwrite")
OTHER = Command("aiayn other", "choose another --out")


Bytes = Callable[[Path], dict[str, str]]


def make(out: Path, files: dict[str, str], command: Command = MAKER) -> None:
    with written_whole(out, command) as staging:
        for name, text in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)


def test_a_new_folder_is_written_with_its_manifest_and_nothing_left_beside(folder_bytes: Bytes, tmp_path: Path) -> None:
    make(tmp_path / "out", {"a.txt": "a", "sub/b.txt": "b"})
    assert set(folder_bytes(tmp_path / "out")) == {"a.txt", "sub/b.txt", MANIFEST_FILE}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_its_own_output_is_replaced_whole_stale_files_gone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    make(out, {"a.txt": "a", "stale.txt": "s"})
    make(out, {"a.txt": "A"})
    assert (out / "a.txt").read_text() == "A" and not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("foreign", ["notes.txt", "sub/deep.bin"])
def test_a_folder_holding_a_file_it_did_not_write_is_refused_and_left_as_it_was(
    folder_bytes: Bytes, tmp_path: Path, foreign: str
) -> None:
    out = tmp_path / "out"
    make(out, {"a.txt": "a"})
    (out / foreign).parent.mkdir(parents=True, exist_ok=True)
    (out / foreign).write_text("mine")
    before = folder_bytes(out)
    with pytest.raises(FileExistsError, match=f"holds {foreign}, which aiayn make did not write; choose another"):
        make(out, {"a.txt": "A"})
    assert folder_bytes(out) == before and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_another_commands_output_and_a_file_are_refused(tmp_path: Path) -> None:
    make(tmp_path / "theirs", {"a.txt": "a"}, OTHER)
    with pytest.raises(FileExistsError, match="holds a.txt, which aiayn make did not write"):
        claim(tmp_path / "theirs", MAKER)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is not a folder"):
        claim(tmp_path / "file", MAKER, overwrite=True)
    (tmp_path / "link").symlink_to(tmp_path / "theirs")
    with pytest.raises(FileExistsError, match="is not a folder"):
        claim(tmp_path / "link", MAKER)


def test_a_link_inside_is_an_entry_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("p")
    out = tmp_path / "out"
    make(out, {"a.txt": "a"})
    (out / "link").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match="holds link, which"):
        claim(out, MAKER)
    with written_whole(out, MAKER, overwrite=True) as staging:
        (staging / "a.txt").write_text("b")
    assert (elsewhere / "precious").read_text() == "p"  # the link went, not what it pointed to


def test_an_empty_folder_and_a_missing_one_are_the_commands(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    make(tmp_path / "empty", {"a.txt": "a"})
    make(tmp_path / "new" / "deeper", {"a.txt": "a"})
    assert (tmp_path / "empty" / "a.txt").is_file() and (tmp_path / "new" / "deeper" / "a.txt").is_file()


def test_overwrite_writes_into_a_foreign_folder_keeping_its_files_but_never_an_input_the_current_or_home_folder(
    folder_bytes: Bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)
    (out / "model" / "config.json").write_text("{}")
    before = folder_bytes(out)
    with pytest.raises(FileExistsError, match=f"--overwrite would delete {out / 'model'}"):
        claim(out, MAKER, overwrite=True, inputs=[out / "model"])
    monkeypatch.chdir(out / "model")
    with pytest.raises(FileExistsError, match="--overwrite would delete"):
        claim(out, MAKER, overwrite=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(out))
    with pytest.raises(FileExistsError, match="--overwrite would delete"):
        claim(out, MAKER, overwrite=True)
    assert folder_bytes(out) == before
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with written_whole(out, MAKER, overwrite=True) as staging:
        (staging / "a.txt").write_text("a")
    assert folder_bytes(out) == {**before, "a.txt": folder_bytes(out)["a.txt"], MANIFEST_FILE: mock.ANY}


def test_overwrite_replaces_its_own_files_and_keeps_and_names_every_other(
    folder_bytes: Bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`aiayn export en-de --to web --out ~/Documents --overwrite` must not remove ~/Documents."""
    documents = tmp_path / "Documents"
    (documents / "taxes").mkdir(parents=True)
    (documents / "taxes" / "2026.pdf").write_bytes(b"%PDF")
    (documents / "notes.txt").write_text("mine")
    (documents / "index.html").write_text("my own page")  # a name the command writes: its own now
    with written_whole(documents, MAKER, overwrite=True) as staging:
        (staging / "index.html").write_text("<html>")
        (staging / "model.onnx").write_bytes(b"graph")
    got = folder_bytes(documents)
    assert set(got) == {"taxes/2026.pdf", "notes.txt", "index.html", "model.onnx", MANIFEST_FILE}
    assert (documents / "taxes" / "2026.pdf").read_bytes() == b"%PDF"
    assert (documents / "notes.txt").read_text() == "mine"
    assert sorted(json.loads((documents / MANIFEST_FILE).read_text())["files"]) == ["index.html", "model.onnx"]
    assert "--overwrite kept 2 file(s) in " in capsys.readouterr().err
    with written_whole(documents, MAKER, overwrite=True) as staging:  # again: its own files replaced, stale gone
        (staging / "index.html").write_text("<html>2")
    assert set(folder_bytes(documents)) == {"taxes/2026.pdf", "notes.txt", "index.html", MANIFEST_FILE}
    assert "notes.txt, taxes/2026.pdf" in capsys.readouterr().err
    with pytest.raises(FileExistsError, match="holds notes.txt"):  # still not the command's to write without it
        claim(documents, MAKER)


def test_overwrite_refuses_a_file_in_the_way_of_the_output_and_moves_nothing(
    folder_bytes: Bytes, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "model").write_text("a file where the command writes a folder")
    before = folder_bytes(out)
    with pytest.raises(FileExistsError, match="model is in the way"), written_whole(out, MAKER, True) as staging:
        (staging / "model").mkdir()
        (staging / "model" / "config.json").write_text("{}")
    assert folder_bytes(out) == before and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_temporary_twin_is_made_anew_and_never_through_a_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "d"
    out.mkdir()
    (out / f"{MANIFEST_FILE}.tmp").symlink_to(victim)  # the name earlier releases wrote through
    mark(out, MAKER, ["config.json"])
    assert victim.read_text() == "precious" and read_manifest(out) == (MAKER.name, {"config.json"})
    monkeypatch.setattr(secrets, "token_hex", lambda _: "0" * 16)  # a guessed name, a link planted there
    (out / f".config.json.{'0' * 16}.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_file(out / "config.json", b"{}")
    assert victim.read_text() == "precious" and not (out / "config.json").exists()
    monkeypatch.undo()
    write_file(out / "config.json", b"{}")
    twins = sorted(p.name for p in out.iterdir() if p.name.startswith(".config.json."))
    assert twins == [f".config.json.{'0' * 16}.tmp"]  # only the planted link: the new twin was renamed into place
    assert oct((out / "config.json").stat().st_mode & 0o777) == oct(0o666 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failure_while_writing_leaves_the_old_output_whole(folder_bytes: Bytes, tmp_path: Path) -> None:
    out = tmp_path / "out"
    make(out, {"a.txt": "a", "sub/b.txt": "b"})
    before = folder_bytes(out)
    with pytest.raises(RuntimeError, match="disk full"), written_whole(out, MAKER) as staging:
        (staging / "a.txt").write_text("half")
        raise RuntimeError("disk full")
    assert folder_bytes(out) == before and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_failure_at_the_swap_puts_the_old_output_back(
    folder_bytes: Bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    make(out, {"a.txt": "a"})
    before = folder_bytes(out)
    rename = Path.rename

    def failing(self: Path, target: Path) -> Path:
        if self.name.endswith(".new"):  # the new output, as it is moved into place
            raise OSError("power cut")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", failing)
    with pytest.raises(OSError, match="power cut"), written_whole(out, MAKER) as staging:
        (staging / "a.txt").write_text("new")
    assert folder_bytes(out) == before and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_files_arrived_while_writing_are_refused_before_the_swap(tmp_path: Path) -> None:
    out = tmp_path / "out"
    make(out, {"a.txt": "a"})
    with pytest.raises(FileExistsError, match="holds late.txt"), written_whole(out, MAKER) as staging:
        (staging / "a.txt").write_text("new")
        (out / "late.txt").write_text("arrived meanwhile")
    assert (out / "late.txt").is_file() and (out / "a.txt").read_text() == "a"


def test_a_folder_written_in_place_owns_its_names_folders_and_their_temporary_twins(tmp_path: Path) -> None:
    out = tmp_path / "run"
    mark(out, MAKER, ["config.json", "checkpoints/"])
    (out / "config.json").write_text("{}")
    (out / "config.json.tmp").write_text("{")  # left by a kill mid-write (the name earlier releases used)
    (out / f".config.json.{'a' * 16}.tmp").write_text("{")  # and the name used now
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "last.pt").write_bytes(b"x")
    claim(out, MAKER)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds notes.txt"):
        claim(out, MAKER)


def test_every_file_is_fsynced_before_it_is_renamed_into_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc to name a file descriptor's file (Linux only)")
    monkeypatch.setattr(os, "fsync", recording)
    write_file(tmp_path / "config.json", b"{}")
    assert any(re.fullmatch(rf"{tmp_path}/\.config\.json\.[0-9a-f]{{16}}\.tmp", name) for name in synced)
    assert str(tmp_path) in synced
    synced.clear()
    with written_whole(tmp_path / "out", MAKER) as staging:
        (staging / "model.safetensors").write_bytes(b"w")
        staging_name = str(staging)
    assert f"{staging_name}/model.safetensors" in synced and f"{staging_name}/{MANIFEST_FILE}" in synced
