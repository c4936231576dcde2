"""Training checkpoints: written atomically, so a kill at any moment leaves a loadable one; averaging (§6.1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` to a temp file in the same folder, fsync, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


# At the end of a run a resumed run goes straight to averaging, so it averages the checkpoints that are left.
AVERAGE_FIX = "delete it and run the same command with --resume: the other epochs' checkpoints are averaged"


def load_checkpoint(path: Path, fix: str = AVERAGE_FIX) -> dict[str, Any]:
    """A checkpoint, or an error that names the file and ``fix``, what can be done without it."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; start without --resume")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # a truncated or foreign file: say which and what to do
        raise ValueError(f"checkpoint {path} cannot be read ({err}); {fix}") from err


def average_state_dicts(paths: list[Path]) -> dict[str, torch.Tensor]:
    """§6.1: the element-wise mean of the model weights of several checkpoints."""
    if not paths:
        raise ValueError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        state = load_checkpoint(path)["model"]
        if total and set(state) != set(total):
            raise ValueError(f"{path} holds other weights than {paths[0]}; average checkpoints of one run only")
        for name, tensor in state.items():
            total[name] = total.get(name, 0) + tensor.to(torch.float64)
    return {name: (tensor / len(paths)).to(torch.float32) for name, tensor in total.items()}
