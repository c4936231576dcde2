"""Saving and loading a model folder's weights, with a strict key mapping (no silent partial loads)."""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from aiayn.core.dependencies import SECURITY_FLOORS, release_number
from aiayn.core.folder import ModelFolder
from aiayn.core.weight_spec import check_weights
from aiayn.model.transformer import Transformer

# Weights are stored in half precision: the bundled folders stay small enough to commit without
# Git LFS, and every engine computes in fp32 from the very same rounded values, so they agree exactly.
STORAGE_DTYPE = torch.float16


# What torch's refusal names: the global a pickle asked for (GLOBAL posix.system), or the opcode it does not run.
REFUSED_GLOBAL = re.compile(r"GLOBAL [\w.]+")
REFUSED_OPCODE = re.compile(r"Unsupported operand \S+")


class UnsafePickle(ValueError):
    """A ``torch.save`` file that asks for more than tensors and plain values (or damaged bytes that read as such a
    request): the message starts with its path."""


class UnsafeTorch(ValueError):
    """A torch whose ``weights_only`` a pickle can get around: the message says which release to install."""


def read_tensor_pickle(path: Path) -> Any:
    """The tensors and plain values (dicts, lists, numbers, text) of a ``torch.save`` file, without running any of
    its code: torch's ``weights_only`` unpickler makes no object of another type, so a pickle that would call
    something (``os.system`` in a ``__reduce__``) is refused before it runs, in one line naming what it asked for."""
    floor = SECURITY_FLOORS["torch"]
    if release_number(torch.__version__) < release_number(floor):
        raise UnsafeTorch(
            f"{path} is not read with torch {torch.__version__}: before {floor} such a file can run code despite "
            f"weights_only (CVE-2025-32434); pip install 'torch>={floor}'"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note on a pickle protocol it does not expect: refused below
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # torch's message runs over lines: one line says it
        if named := REFUSED_GLOBAL.search(str(err)):
            raise UnsafePickle(
                f"{path} cannot be read as data alone (its pickle asks for {named.group()}, which could run code), "
                "so it is refused unread"
            ) from None
        opcode = REFUSED_OPCODE.search(str(err))
        raise ValueError(f"{opcode.group() if opcode else 'not a pickle'} of a file read as data only") from None


def save_weights(model: Transformer, folder: ModelFolder) -> None:
    """Write ``model.safetensors`` atomically (temp file + rename)."""
    state = {name: tensor.detach().to("cpu", STORAGE_DTYPE).contiguous() for name, tensor in model.state_dict().items()}
    tmp = folder.weights_file.with_name(folder.weights_file.name + ".tmp")
    # Written by Python's open, so the file's mode follows the umask like the folder's other files
    # (safetensors' own save_file creates it 0600).
    tmp.write_bytes(save(state, metadata={"format": "pt", "config_fingerprint": model.config.fingerprint()}))
    tmp.replace(folder.weights_file)
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
