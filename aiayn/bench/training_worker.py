"""One training variant in a process of its own (``process.Worker``): timed updates on request.

``python -m aiayn.bench.training_worker VARIANT FOLDER BATCHES.npz``, then lines ``{"warmup", "steps"}``.
A step is forward, label-smoothed loss (ε 0.1), backward and Adam (β 0.9/0.98, ε 1e-9) at a fixed learning
rate; its tokens are the batch's real target tokens.

* ``today fp32``: the trainer's step before --update-freq and --precision: every position projected to
  the vocabulary, ``F.cross_entropy`` over the padded logits, PyTorch's default (for-loop) Adam, ``.item()``.
* ``ours fp32`` / ``ours bf16``: the trainer's step now (``train.step``): real targets only, the fused
  projection + loss, fused Adam; bf16 is autocast.
* ``marian fp32`` / ``marian bf16``: Hugging Face ``MarianMTModel`` with the same sizes, vocabulary, tied
  embeddings and dropout, trained the way its examples do (its logits, ``F.cross_entropy`` with padding
  ignored, Adam). What its config cannot match: post-LN with no final norms (ours: the folder's norm_first),
  its [sin | cos] position layout, a zero ``final_logits_bias``, LayerNorm ε 1e-5, its initialisation.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.bench.process import answer, requests, status_mb
from aiayn.core.config import ModelConfig
from aiayn.core.folder import ModelFolder

SMOOTHING = 0.1
LEARNING_RATE = 1e-4  # fixed: the rate does not change a step's work
VARIANTS = ("today fp32", "ours fp32", "ours bf16", "marian fp32", "marian bf16")
Batch = tuple[Tensor, Tensor, Tensor]  # source ids (batch, src_len), decoder input and target (batch, tgt_len)
Step = Callable[[Batch], None]


def adam(parameters: Any, fused: bool = False) -> torch.optim.Adam:
    return torch.optim.Adam(parameters, lr=LEARNING_RATE, betas=(0.9, 0.98), eps=1e-9, fused=fused or None)


def todays_step(config: ModelConfig) -> Step:
    from aiayn.model.transformer import Transformer

    model = Transformer(config).train()
    optimizer = adam(model.parameters())
    pad = config.special_tokens.pad

    def step(batch: Batch) -> None:
        src_ids, tgt_in, tgt_out = batch
        update_from_logits(model(src_ids, tgt_in), tgt_out, pad, optimizer)

    return step


def update_from_logits(logits: Tensor, tgt_out: Tensor, pad: int, optimizer: torch.optim.Optimizer) -> None:
    """Today's objective on (batch, tgt_len, vocab) logits: smoothed CE over every non-pad position, Adam."""
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=pad, label_smoothing=SMOOTHING)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    loss.item()


def our_step(config: ModelConfig, precision: str) -> Step:
    from aiayn.model.transformer import Transformer
    from aiayn.train.loss import SmoothedLoss
    from aiayn.train.precision import resolve_precision
    from aiayn.train.step import accumulate_gradients

    precision = resolve_precision(precision, torch.device("cpu"))
    model = Transformer(config).train()
    objective = SmoothedLoss(model, SMOOTHING)
    optimizer = adam(model.parameters(), fused=True)

    def step(batch: Batch) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_sum, _ = accumulate_gradients(objective, [batch], config.special_tokens.pad, precision)
        optimizer.step()
        loss_sum.item()

    return step


def marian_config(config: ModelConfig) -> Any:
    from transformers import MarianConfig

    tokens = config.special_tokens
    return MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.n_encoder_layers,
        decoder_layers=config.n_decoder_layers,
        encoder_attention_heads=config.n_heads,
        decoder_attention_heads=config.n_heads,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        activation_function="relu",
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        max_position_embeddings=config.max_len,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=tokens.pad,
        bos_token_id=tokens.bos,
        eos_token_id=tokens.eos,
        forced_eos_token_id=tokens.eos,
        decoder_start_token_id=tokens.bos,
    )


def marian_step(config: ModelConfig, precision: str) -> Step:
    from transformers import MarianMTModel

    from aiayn.train.precision import autocast, resolve_precision

    precision = resolve_precision(precision, torch.device("cpu"))
    model = MarianMTModel(marian_config(config)).train()
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared and model.model.decoder.embed_tokens.weight is shared, "not tied"
    optimizer = adam(model.parameters())
    pad = config.special_tokens.pad

    def step(batch: Batch) -> None:
        src_ids, tgt_in, tgt_out = batch
        with autocast(precision, torch.device("cpu")):
            logits = model(
                input_ids=src_ids, attention_mask=src_ids != pad, decoder_input_ids=tgt_in, use_cache=False
            ).logits
        update_from_logits(logits, tgt_out, pad, optimizer)

    return step


def make_step(variant: str, config: ModelConfig) -> Step:
    kind, precision = variant.split()
    torch.manual_seed(1)
    if kind == "today":
        return todays_step(config)
    return our_step(config, precision) if kind == "ours" else marian_step(config, precision)


def load_batches(path: str) -> list[Batch]:
    """The batches ``training.write_batches`` saved: arrays src_i, tgt_in_i, tgt_out_i."""
    arrays = np.load(path)
    names = ("src", "tgt_in", "tgt_out")
    return [
        (
            torch.from_numpy(arrays[f"src_{i}"]),
            torch.from_numpy(arrays[f"tgt_in_{i}"]),
            torch.from_numpy(arrays[f"tgt_out_{i}"]),
        )
        for i in range(len(arrays.files) // len(names))
    ]


def main() -> None:
    from aiayn.bench.engines import THREADS

    torch.set_num_threads(THREADS)
    variant, folder, batches_path = sys.argv[1:4]
    batches = load_batches(batches_path)
    config = ModelFolder.open(folder).config
    try:
        step = make_step(variant, config)
    except (ValueError, ImportError) as err:  # bf16 without hardware support; transformers not installed
        answer({"ready": False, "reason": str(err)})
        return
    answer({"ready": True})
    warmed = False
    for request in requests():
        if not warmed:  # the first steps pay for allocations and the allocator's growth: not timed
            for i in range(request["warmup"]):
                step(batches[i % len(batches)])
            warmed = True
        timed = [batches[(request["warmup"] + i) % len(batches)] for i in range(request["steps"])]
        started = time.perf_counter()
        for batch in timed:
            step(batch)
        seconds = time.perf_counter() - started
        tokens = sum(int((tgt_out != config.special_tokens.pad).sum()) for _, _, tgt_out in timed)
        answer({"tokens": tokens, "seconds": seconds, "peak_rss_mb": status_mb("VmHWM")})


if __name__ == "__main__":
    main()
