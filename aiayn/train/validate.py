"""Validation after each epoch: loss without label smoothing, and greedy BLEU through the one search; at the end,
the confidence threshold of the weights the run kept."""

from __future__ import annotations

from typing import Any

import torch

from aiayn.core.folder import ModelFolder
from aiayn.data.batching import token_batches
from aiayn.data.prepare import PreparedData
from aiayn.engines import TORCH
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.options import EngineOptions
from aiayn.evaluation.confidence import calibrate_confidence
from aiayn.evaluation.metrics import score
from aiayn.model.transformer import Transformer
from aiayn.model.weights import load_model
from aiayn.search.translator import SearchSettings
from aiayn.train.batches import to_tensors
from aiayn.train.loss import label_smoothed_sum, real_targets


def torch_engine(folder: ModelFolder, model: Transformer, device: torch.device) -> Any:
    """The torch engine over the model in training, where it is."""
    return load_engine(folder, EngineOptions(TORCH, device.type, lanes=1), model)


def validate(
    model: Transformer, folder: ModelFolder, data: PreparedData, device: torch.device, max_tokens: int
) -> dict[str, float]:
    """Validation loss (no label smoothing) and greedy BLEU on the prepared validation split."""
    model.eval()
    special = model.config.special_tokens
    valid = data.valid
    total_loss, total_tokens = 0.0, 0
    with torch.inference_mode():
        for rows in token_batches(*valid.lengths(), max_tokens, 0, 0):
            src_ids, tgt_in, tgt_out = to_tensors(valid.padded(rows, special), device)
            states, target = real_targets(model.teacher_forced_states(src_ids, tgt_in), tgt_out, special.pad)
            embedding = model.embedding
            total_loss += label_smoothed_sum(states, embedding.weight, target, 0.0, embedding.bias).item()
            total_tokens += target.numel()
    translator = translator_for(folder, torch_engine(folder, model, device), max_sentences=256)
    hypotheses = translator.translate_ids(valid.source_ids(special.eos), SearchSettings(beam_size=1))
    scores = score([folder.tokenizer.decode(h) for h in hypotheses], data.valid_references)
    model.train()
    return {"val_loss": total_loss / total_tokens, "val_bleu": scores.bleu}


def calibrate_kept_weights(folder: ModelFolder, data: PreparedData, device: torch.device) -> dict[str, Any]:
    """The folder's ``confidence`` section for the weights it kept, set on the run's validation split and
    searched with the folder's settings, as `aiayn translate` and the page will search."""
    model = load_model(folder, device)
    translator = translator_for(folder, torch_engine(folder, model, device), max_sentences=256)
    sources = data.valid.source_ids(model.config.special_tokens.eos)
    return calibrate_confidence(folder, translator, sources, SearchSettings.of(folder), "validation split of the run")
