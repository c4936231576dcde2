"""Training checkpoints: written atomically, so a kill at any moment leaves a loadable one; averaging (§6.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from aiayn.core.outputs import replacing
from aiayn.model.weights import UnsafePickle, UnsafeTorch, read_tensor_pickle


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` to a temp file in the same folder, fsync, then rename over ``path``. ``obj`` holds tensors and
    plain values only (dicts, lists, numbers, text), which is all ``load_checkpoint`` reads back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as f:
        torch.save(obj, f)


# At the end of a run a resumed run goes straight to averaging, so it averages the checkpoints that are left.
AVERAGE_FIX = "delete it and run the same command with --resume: the other epochs' checkpoints are averaged"


def load_checkpoint(path: Path, fix: str = AVERAGE_FIX) -> dict[str, Any]:
    """A checkpoint, or an error that names the file and ``fix``, what can be done without it. Read as data only
    (``read_tensor_pickle``): one from a shared folder that would run code is refused, the code never run."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; start without --resume")
    try:
        state = read_tensor_pickle(path)
    except UnsafePickle as err:  # it says what the pickle asked for; the file stays, unread
        raise ValueError(f"checkpoint {err}; {fix}") from None
    except UnsafeTorch:  # the file may be fine: the fix is a newer torch
        raise
    except Exception as err:  # a truncated or foreign file: say which and what to do
        raise ValueError(f"checkpoint {path} cannot be read ({err}); {fix}") from err
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path} holds a {type(state).__name__}, not a training state; {fix}")
    return state


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
