"""A model folder's weights file: written like the folder's other files, read back exactly, and only as declared."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from aiayn.core.config import ModelConfig
from aiayn.core.folder import ModelFolder
from aiayn.core.tokenizer import train_tokenizer
from aiayn.core.weight_spec import weight_shapes
from aiayn.model.transformer import Transformer
from aiayn.model.weights import load_model, load_state_strict, save_weights


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_weights_file_follows_the_umask_like_the_other_files(tmp_path: Path, umask: int) -> None:
    config = ModelConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1)
    tokenizer = train_tokenizer(["a red dog runs", "ein roter Hund rennt"] * 3, 40, config.special_tokens)
    config = config.replace(vocab_size=tokenizer.vocab_size)
    model = Transformer(config)
    previous = os.umask(umask)
    try:
        folder = ModelFolder.create(tmp_path, config, tokenizer)
        save_weights(model, folder)
    finally:
        os.umask(previous)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (folder.weights_file, folder.config_file)}
    assert modes == {"model.safetensors": 0o666 & ~umask, "config.json": 0o666 & ~umask}
    loaded = load_model(folder)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.half().float()), name


@pytest.mark.parametrize("norm_first", [True, False])
def test_the_model_has_exactly_the_declared_weights(norm_first: bool) -> None:
    """The torch modules and the serving graph builder read one spec (``core/weight_spec.py``)."""
    config = ModelConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=3)
    config = config.replace(norm_first=norm_first)
    state = Transformer(config).state_dict()
    assert {name: tuple(tensor.shape) for name, tensor in state.items()} == weight_shapes(config)


def test_loading_names_every_gap_at_once() -> None:
    config = ModelConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1)
    model = Transformer(config)
    state = dict(model.state_dict())
    state.pop("decoder_layers.0.cross_attn.w_o.bias")
    state["extra.weight"] = torch.zeros(1)
    state["encoder_layers.0.feed_forward.w_1.weight"] = torch.zeros(3, 16)
    with pytest.raises(ValueError) as refused:
        load_state_strict(model, state, "model.safetensors")
    message = str(refused.value)
    assert "missing ['decoder_layers.0.cross_attn.w_o.bias']" in message and "unexpected ['extra.weight']" in message
    assert "encoder_layers.0.feed_forward.w_1.weight (3, 16) != (32, 16)" in message
