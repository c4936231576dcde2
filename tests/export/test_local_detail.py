"""Exports carry nothing of the exporting machine: a folder whose records hold this machine's absolute paths, home,
user and host name is exported as a Space, a browser folder and a transformers folder, and no file of them holds any
of it; a licence string that is also YAML reads back from the front matter as that string."""

from __future__ import annotations

import ast
import getpass
import json
import platform
import re
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from aiayn.core.folder import IMPORTED_SECTION, TRAINING_RECORD_FILE, ModelFolder
from aiayn.export.space import export_space
from aiayn.export.transformers_folder import export_transformers
from aiayn.export.web import export_web

# A model card's licence as a hostile or careless author may write it: a key, a quote, a backslash, the end of the
# front matter and a new key after it, a comment, a line break of Unicode's and an emoji.
LICENCE = "other: \"mine\" \\ 'q'\n---\nlicense: mit # not this\u2028 and 🔤"
KINDS = ("space", "web", "transformers")


def machine() -> dict[str, str]:
    return {"home": str(Path.home()), "user": getpass.getuser(), "host": socket.gethostname()}


def plant(folder: Path) -> None:
    """Records as a run on this machine keeps them: commands and options with absolute paths under the folder and
    under the home (through folders named after the user and host), the host's fields, a parent trained elsewhere
    here, a checkpoint imported from a local folder with ``LICENCE``."""
    home, user, host = machine().values()
    corpora = f"{home}/{user}-data/{host}/corpora"
    parent = f"{home}/{host}/models/base"
    record: dict[str, Any] = {
        "commands": [
            f"aiayn train --out {folder} --train {corpora}/train.en --tgt-file={corpora}/train.de --src en",
            f"aiayn train --out {folder}/ --resume --init-from ~/{user}/base",
        ],
        "options": {"out": str(folder), "prepared": f"{corpora}/prepared", "init_from": parent, "command": "aiayn"},
        "hardware": {"device": "cpu", "platform": platform.platform(), "host": host, "user": user, "cpu_threads": 2},
        "data": {"sources": {"train": {"kind": "text files", "pairs": 3, "files": [{"path": f"{corpora}/train.en"}]}}},
        "parent": {
            "folder": parent,
            "commands": [f"aiayn train --out {parent} --hf {home}/{user}/sets/opus"],
            "options": {"out": parent},
            "hardware": {"platform": platform.platform(), "host": host},
            "provenance": f"trained on the Hugging Face dataset {home}/{user}/sets/opus (3 pairs)",
        },
        "best_val_bleu": 1.5,
    }
    (folder / TRAINING_RECORD_FILE).write_text(json.dumps(record), encoding="utf-8")
    imported = {"from": f"{home}/{user}/checkpoints/opus-mt", "hub": False, "license": LICENCE}
    ModelFolder.open(folder).write_section(IMPORTED_SECTION, imported)


@pytest.fixture(scope="module")
def exported(marian_like_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The planted folder (a Marian-like one, so that transformers can hold it) exported each way."""
    root = tmp_path_factory.mktemp("local-detail")
    folder = root / "model"
    shutil.copytree(marian_like_folder, folder)
    plant(folder)
    model, out = ModelFolder.open(folder), {kind: root / kind for kind in KINDS}
    export_space(model, out["space"])
    export_transformers(model, out["transformers"])
    try:
        export_web(model, out["web"])
    except FileNotFoundError as err:  # the npm registry unreachable, and nothing cached
        pytest.skip(f"the npm files for the browser folder are unavailable: {err}")
    return {"folder": folder, **out}


@pytest.mark.parametrize("kind", KINDS)
def test_no_exported_file_holds_the_machines_paths_user_or_host(exported: dict[str, Path], kind: str) -> None:
    home, user, host = machine().values()
    folder = str(exported["folder"])
    paths = [folder, str(exported["folder"].parent), f"~/{user}/", *([f"{home}/"] if len(home) > 1 else [])]
    assert (exported["folder"] / TRAINING_RECORD_FILE).read_text().count(folder) == 3  # planted, to be left out
    words = re.compile(rf"\b({re.escape(user)}|{re.escape(host)})\b")
    files = [path for path in exported[kind].rglob("*") if path.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        assert not [p for p in paths if p.encode() in data], f"{path.relative_to(exported[kind])} holds a local path"
        # The records and what is written from them (package sources and npm files come from elsewhere).
        if path.suffix in (".json", ".md") or path.name == "app.py":
            found = words.findall(data.decode("utf-8"))
            assert not found, f"{path.relative_to(exported[kind])} names the user or host: {found}"


def test_the_spaces_record_keeps_its_commands_relative_to_the_folder_and_no_host_fields(
    exported: dict[str, Path],
) -> None:
    record = json.loads((exported["space"] / "model" / TRAINING_RECORD_FILE).read_text(encoding="utf-8"))
    assert record["commands"] == [
        "aiayn train --out . --train train.en --tgt-file=train.de --src en",
        "aiayn train --out . --resume --init-from base",
    ]
    assert record["options"]["out"] == "." and record["options"]["prepared"] == "prepared"
    assert record["hardware"] == {"device": "cpu", "cpu_threads": 2}
    assert record["data"]["sources"]["train"]["files"] == [{"path": "train.en"}]
    parent = record["parent"]
    assert (parent["folder"], parent["commands"], parent["hardware"]) == ("base", ["aiayn train --out . --hf opus"], {})
    assert parent["provenance"] == "trained on the Hugging Face dataset opus (3 pairs)"
    for kind, config in (("space", "model/config.json"), ("web", "config.json")):
        imported = json.loads((exported[kind] / config).read_text(encoding="utf-8"))[IMPORTED_SECTION]
        assert imported["from"] == "opus-mt" and imported["license"] == LICENCE, kind


@pytest.mark.parametrize(("kind", "keys"), [("space", ("license", "title", "sdk")), ("transformers", ("license",))])
def test_a_licence_that_is_also_yaml_reads_back_from_the_front_matter_as_text(
    exported: dict[str, Path], kind: str, keys: tuple[str, ...]
) -> None:
    card = (exported[kind] / "README.md").read_text(encoding="utf-8")
    front_matter, _, body = card.removeprefix("---\n").partition("\n---\n")
    front = yaml.safe_load(front_matter)
    assert front["license"] == LICENCE and "other" not in front and all(key in front for key in keys)
    assert body.startswith("\n# ")  # the front matter ended where the export ended it


def test_app_py_holds_the_provenance_as_text_whatever_it_says(tmp_path: Path, marian_like_folder: Path) -> None:
    """A corpus named to close app.py's docstring and run code stays inside the docstring."""
    folder = tmp_path / "model"
    shutil.copytree(marian_like_folder, folder)
    hostile = 'x.en""" ; import os; os.system("touch owned") ; """\\'
    record = {"data": {"sources": {"train": {"kind": "text files", "pairs": 3, "files": [hostile]}}}}
    (folder / TRAINING_RECORD_FILE).write_text(json.dumps(record), encoding="utf-8")
    export_space(ModelFolder.open(folder), tmp_path / "space")
    tree = ast.parse((tmp_path / "space" / "app.py").read_text(encoding="utf-8"))  # parsed, never run
    assert f"trained on {hostile} (3 pairs)" in (ast.get_docstring(tree) or "")
    calls = {
        node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert "system" not in calls
