"""The model folder: which folder a name means, and a damaged weights file named before any engine reads it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from aiayn.core.folder import ModelFolder, resolve_model


def test_a_bundled_name_wins_over_a_folder_of_that_name_which_is_reached_as_a_path(
    bundled: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "en-de").mkdir()
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model("en-de") == bundled["en-de"]
    assert resolve_model("./en-de") == Path("./en-de") and resolve_model(str(tmp_path / "en-de")).parent == tmp_path
    assert resolve_model("mine") == Path("mine")  # not a bundled name: the folder
    with pytest.raises(FileNotFoundError, match="'xx-yy' is neither a folder nor a bundled model"):
        resolve_model("xx-yy")


DAMAGES: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "cut in half": (lambda data: data[: len(data) // 2], r"\d+ bytes where its header says \d+"),
    "cut to 4 bytes": (lambda data: data[:4], "4 bytes, fewer than its header needs"),
    "no JSON header": (lambda data: data[:8] + b"\xff" * (len(data) - 8), "its header is not a safetensors header"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_weights_file_is_named_with_the_fix(bundled: dict[str, Path], tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "en-de"
    shutil.copytree(bundled["en-de"], folder)
    weights = folder / "model.safetensors"
    change, reason = DAMAGES[damage]
    weights.write_bytes(change(weights.read_bytes()))
    with pytest.raises(ValueError, match=rf"model\.safetensors is damaged \({reason}\); restore it .*aiayn train"):
        ModelFolder.open(folder).check_weights()
    ModelFolder.open(bundled["en-de"]).check_weights()  # a whole file passes
