"""Validation after each epoch: loss without label smoothing, and greedy BLEU through the one search."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from aiayn.core.folder import ModelFolder
from aiayn.data.batching import token_batches
from aiayn.data.multi30k import ParallelCorpus
from aiayn.engines.pytorch import TorchEngine
from aiayn.evaluation.metrics import score
from aiayn.model.transformer import Transformer
from aiayn.search.translator import SearchSettings
from aiayn.train.batches import bare_lengths, make_batch


def validate(
    model: Transformer,
    folder: ModelFolder,
    val_src: list[list[int]],
    val_tgt: list[list[int]],
    val: ParallelCorpus,
    device: torch.device,
    max_tokens: int,
) -> dict[str, float]:
    """Validation loss (no label smoothing) and greedy BLEU on the validation split."""
    model.eval()
    pad = model.config.special_tokens.pad
    total_loss, total_tokens = 0.0, 0
    with torch.inference_mode():
        for rows in token_batches(*bare_lengths(val_src, val_tgt), max_tokens, 0, 0):
            src_ids, tgt_in, tgt_out = make_batch(rows, val_src, val_tgt, model.config.special_tokens, device)
            logits = model(src_ids, tgt_in)  # (batch, tgt_len, vocab)
            total_loss += F.cross_entropy(
                logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=pad, reduction="sum"
            ).item()
            total_tokens += int((tgt_out != pad).sum())
    translator = folder.translator(TorchEngine(model, device), max_sentences=256)
    hypotheses = translator.translate_ids(val_src, SearchSettings(beam_size=1))
    scores = score([folder.tokenizer.decode(h) for h in hypotheses], val.tgt)
    model.train()
    return {"val_loss": total_loss / total_tokens, "val_bleu": scores.bleu}
