"""The serve path never imports torch: load, translate, the page and its API, and the CLI run where torch fails."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

SERVE = """
import socket
import sys

from gradio_client import Client

from aiayn.cli import main
from aiayn.engines.options import EngineOptions
from aiayn.serve.page import build_app
from aiayn.serve.server import launch
from aiayn.serve.service import TranslationService

service = TranslationService(EngineOptions("onnx", "auto"))
print(service.translate("Two dogs play in the snow.", "en-de", 4).text)
app = build_app(service)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
launch(app, port=port)
print(Client(f"http://127.0.0.1:{port}/", verbose=False).predict("A girl jumps.", "en-de", 1, api_name="/translate")[0])
app.close()
assert main(["translate", "--model", "de-en", "Zwei Hunde spielen im Schnee."]) == 0
assert main(["translate", "--engine", "torch", "A dog."]) == 2
assert not any(name == "torch" or name.startswith("torch.") for name in sys.modules)
"""


def test_serve_path_runs_without_torch(
    import_blocker: Callable[[str], str], bundled: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(import_blocker("torch"))
    check = subprocess.run(
        [sys.executable, "-c", "import torch"], env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True
    )
    assert "blocked" in check.stderr  # the blocker works
    result = subprocess.run(
        [sys.executable, "-c", SERVE],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if not line.startswith("Closing server")]
    assert lines == ["Zwei Hunde spielen im Schnee.", "Ein Mädchen springt.", "Two dogs play in the snow."]
    assert "the torch engine needs PyTorch" in result.stderr


def test_eval_takes_the_onnx_engine_where_torch_is_missing(
    import_blocker: Callable[[str], str], bundled: dict[str, Path], multi30k_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(import_blocker("torch"))
    command = [sys.executable, "-m", "aiayn.cli", "eval", "--limit", "2", "--beam", "1", "--device", "cpu"]
    result = subprocess.run(
        [*command, "--data", str(multi30k_dir)],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "engine onnx (fp32)" in result.stderr and "BLEU" in result.stdout


def test_commands_that_need_torch_say_so_in_one_line(import_blocker: Callable[[str], str], tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(import_blocker("torch"))
    train = ["train", "--src", "en", "--tgt", "de", "--out", str(tmp_path / "m")]
    for command in (train, ["export", "en-de"], ["bench"]):
        result = subprocess.run(
            [sys.executable, "-m", "aiayn.cli", *command],
            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2 and result.stdout == "", command
        assert result.stderr.splitlines() == [
            f"aiayn {command[0]}: error: needs PyTorch, which the demo install leaves out; "
            'install everything with `pip install torch==2.13.0 -e ".[dev]"`'
        ]


def test_export_to_web_runs_without_torch(
    import_blocker: Callable[[str], str], bundled: dict[str, Path], tmp_path: Path
) -> None:
    """The browser folder only rewrites graphs already exported, w8's blocks included: the demo install writes it
    too."""
    (tmp_path / "sitecustomize.py").write_text(import_blocker("torch"))
    result = subprocess.run(
        [sys.executable, "-m", "aiayn.cli", "export", "en-de", "--to", "web", "--out", str(tmp_path / "site")]
        + ["--variant", "w8"],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "could not download" in result.stderr:
        pytest.skip(f"the npm registry is unreachable: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "weights.bin").is_file()
    assert "w8 graphs" in result.stdout


def test_export_to_space_runs_without_torch(
    import_blocker: Callable[[str], str], bundled: dict[str, Path], tmp_path: Path
) -> None:
    """A Space copies the weights and the modules its app.py reaches: the demo install writes it too."""
    (tmp_path / "sitecustomize.py").write_text(import_blocker("torch"))
    result = subprocess.run(
        [sys.executable, "-m", "aiayn.cli", "export", "en-de", "--to", "space", "--out", str(tmp_path / "space")],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "space" / "app.py").is_file() and "publish it: hf repos create" in result.stdout
