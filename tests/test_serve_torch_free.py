"""The serve path never imports torch: the CLI translate path and the page run where `import torch` fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BLOCK_TORCH = """
import sys

class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
        return None

sys.meta_path.insert(0, BlockTorch())
"""

SERVE = """
import sys
from aiayn.cli import main
from aiayn.serve.app import build_app
from aiayn.serve.service import TranslationService

service = TranslationService(engine="onnx", device="auto")
print(service.translate("Two dogs play in the snow.", "en-de", 4).text)
build_app(service)
assert main(["translate", "--model", "de-en", "Zwei Hunde spielen im Schnee."]) == 0
assert not any(name == "torch" or name.startswith("torch.") for name in sys.modules)
"""


def test_serve_path_runs_without_torch(bundled: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCK_TORCH)
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
    assert result.stdout.splitlines() == ["Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."]
