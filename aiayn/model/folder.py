"""The model folder: the one unit that moves between train, export, translate and serve.

Torch-free, so the serve path can resolve and check folders too.
"""

from __future__ import annotations

import os
from pathlib import Path

from aiayn.model.config import CONFIG_FILE

TOKENIZER_FILE = "tokenizer.json"
WEIGHTS_FILE = "model.safetensors"
TRAINING_RECORD_FILE = "training.json"
TRAINING_PLOT_FILE = "training.png"
CHECKPOINT_DIR = "checkpoints"
DEFAULT_MODEL = "en-de"  # what the CLI and the page use when no model is named

# The bundled, trained folders live beside the package in a checkout (pip install -e .).
PRETRAINED_DIR = Path(os.environ.get("AIAYN_PRETRAINED", Path(__file__).resolve().parents[2] / "pretrained"))


def bundled_models() -> dict[str, Path]:
    """Short name (``en-de``) → folder of every bundled model, the default first."""
    if not PRETRAINED_DIR.is_dir():
        return {}
    folders = sorted(PRETRAINED_DIR.iterdir(), key=lambda p: (p.name != DEFAULT_MODEL, p.name))
    return {p.name: p for p in folders if (p / CONFIG_FILE).is_file()}


def resolve_model(name_or_path: str | Path) -> Path:
    """A bundled model's short name or a folder path → the folder, checked to exist."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    bundled = bundled_models()
    if str(name_or_path) in bundled:
        return bundled[str(name_or_path)]
    names = ", ".join(bundled) or "none found in " + str(PRETRAINED_DIR)
    raise FileNotFoundError(
        f"model {str(name_or_path)!r} is neither a folder nor a bundled model (bundled: {names}); "
        "pass a folder written by `aiayn train`"
    )


def require_files(folder: Path, names: list[str], fix: str) -> None:
    """Refuse a folder that lacks any of ``names``, listing all that are missing."""
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"model folder {folder} lacks {', '.join(missing)}; {fix}")
