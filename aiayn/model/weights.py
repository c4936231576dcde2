"""Saving and loading a model folder's weights, with a strict key mapping (no silent partial loads)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save

from aiayn.core.folder import ModelFolder
from aiayn.core.outputs import write_file
from aiayn.core.weight_spec import check_weights
from aiayn.model.transformer import Transformer

# Weights are stored in half precision: the bundled folders stay small enough to commit without
# Git LFS, and every engine computes in fp32 from the very same rounded values, so they agree exactly.
STORAGE_DTYPE = torch.float16


def save_weights(model: Transformer, folder: ModelFolder) -> None:
    """Write ``model.safetensors`` atomically (temp file, fsync, rename)."""
    state = {name: tensor.detach().to("cpu", STORAGE_DTYPE).contiguous() for name, tensor in model.state_dict().items()}
    # Written by Python's open, so the file's mode follows the umask like the folder's other files
    # (safetensors' own save_file creates it 0600).
    metadata = {"format": "pt", "config_fingerprint": model.config.fingerprint()}
    write_file(folder.weights_file, save(state, metadata=metadata))
    folder.__dict__.pop("weights_sha256", None)  # the cached hash is of the old file


def load_state_strict(model: Transformer, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy ``state`` into ``model``; refuse, naming every missing, unexpected or misshapen tensor (the spec's
    check, ``aiayn.core.weight_spec``, shared with the serving graph builder)."""
    check_weights(model.config, {name: tuple(tensor.shape) for name, tensor in state.items()}, source)
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})


def load_folder_weights(model: Transformer, folder: ModelFolder) -> None:
    """Copy the folder's ``model.safetensors`` into ``model`` (strictly)."""
    folder.check_weights()
    load_state_strict(model, load_file(str(folder.weights_file)), str(folder.weights_file))


def load_model(folder: ModelFolder | str | Path, device: str | torch.device = "cpu") -> Transformer:
    """Build the model of a folder from its config and load ``model.safetensors`` into it (eval mode)."""
    folder = folder if isinstance(folder, ModelFolder) else ModelFolder.open(folder)
    folder.require(
        [folder.weights_file, folder.tokenizer_file], "train it with `aiayn train` or point --model elsewhere"
    )
    model = Transformer(folder.config)
    load_folder_weights(model, folder)
    return model.to(device).eval()
