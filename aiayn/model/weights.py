"""Saving and loading a model folder's weights, with a strict key mapping (no silent partial loads)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from aiayn.model.config import ModelConfig, load_config
from aiayn.model.folder import TOKENIZER_FILE, WEIGHTS_FILE, require_files
from aiayn.model.transformer import Transformer

# Weights are stored in half precision: the bundled folders stay small enough to commit without
# Git LFS, and every engine computes in fp32 from the very same rounded values, so they agree exactly.
STORAGE_DTYPE = torch.float16


def save_weights(model: Transformer, folder: Path) -> None:
    """Write ``model.safetensors`` atomically (temp file + rename)."""
    state = {name: tensor.detach().to("cpu", STORAGE_DTYPE).contiguous() for name, tensor in model.state_dict().items()}
    tmp = Path(folder) / (WEIGHTS_FILE + ".tmp")
    save_file(state, str(tmp), metadata={"format": "pt", "config_fingerprint": model.config.fingerprint()})
    tmp.replace(Path(folder) / WEIGHTS_FILE)


def load_state_strict(model: Transformer, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``state`` into ``model``; refuse, naming every missing, unexpected or misshapen key."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshapen = sorted(
        f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    )
    if missing or unexpected or misshapen:
        raise ValueError(
            f"{source} does not match its config.json: missing {missing}, unexpected {unexpected}, "
            f"wrong shape {misshapen}; the weights and config.json must come from the same training run"
        )
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})


def load_model(folder: Path, device: str | torch.device = "cpu") -> Transformer:
    """Build the model of a folder from its ``config.json`` and load ``model.safetensors`` into it (eval mode)."""
    folder = Path(folder)
    require_files(folder, [WEIGHTS_FILE, TOKENIZER_FILE], "train it with `aiayn train` or point --model elsewhere")
    config: ModelConfig = load_config(folder)
    model = Transformer(config)
    load_state_strict(model, load_file(str(folder / WEIGHTS_FILE)), str(folder / WEIGHTS_FILE))
    return model.to(device).eval()
