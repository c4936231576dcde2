"""Greedy search: the most probable next token at each step, per sentence, until </s>."""

from __future__ import annotations

from typing import Any

import numpy as np

from aiayn.search.output import Output
from aiayn.search.step import StepModel, allowed_top

EXTRA_LEN = 50  # §6.1: "maximum output length ... input length + 50"


def max_lengths(src_ids: np.ndarray, pad_id: int, max_len: int | np.ndarray | None) -> np.ndarray:
    """The most output tokens per sentence, (batch,): ``max_len``, or §6.1's real source length + 50."""
    batch = src_ids.shape[0]
    if max_len is None:
        return (src_ids != pad_id).sum(axis=1) + EXTRA_LEN
    limits = np.broadcast_to(np.asarray(max_len, dtype=np.int64), (batch,))
    if (limits < 1).any():
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    return limits


def greedy_search(
    model: StepModel[Any], src_ids: np.ndarray, max_len: int | np.ndarray | None = None, min_len: int = 0
) -> list[Output]:
    """The output of each row of ``src_ids`` (batch, src_len), right-padded, with its log-probability.

    ``max_len`` is one limit for all rows or one per row, (batch,); </s> cannot end an output of fewer than
    ``min_len`` tokens. A sentence that ends is dropped from the decoder state, so it costs nothing while others
    go on.
    """
    batch = src_ids.shape[0]
    limits = max_lengths(src_ids, model.pad_id, max_len)  # (batch,)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    token_log_probs: list[list[float]] = [[] for _ in range(batch)]  # each output id's, as its step gave it
    log_probs = np.zeros(batch)  # (batch,) each sentence's sum so far
    state = model.start(src_ids)
    rows = np.arange(batch)  # the sentence of each state row
    last = np.full((batch, 1), model.bos_id, dtype=np.int64)  # (rows, 1)
    for length in range(1, int(limits.max()) + 1):
        top_log_probs, best, state = allowed_top(model, state, last, 1, length > min_len)  # (rows, 1) each
        choice = best[:, 0]  # (rows,) ties go to the lower id
        log_probs[rows] += top_log_probs[:, 0]
        for row, token, log_prob in zip(rows.tolist(), choice.tolist(), top_log_probs[:, 0].tolist(), strict=True):
            if token != model.eos_id:
                outputs[row].append(token)
                token_log_probs[row].append(log_prob)
        going = (choice != model.eos_id) & (limits[rows] > length)  # (rows,)
        if not going.any():
            break
        if not going.all():
            state = model.select(state, np.flatnonzero(going))
            rows, choice = rows[going], choice[going]
        last = choice[:, None].astype(np.int64)
    # A sentence that fills its limit was cut there; one that is shorter chose </s>.
    return [
        Output(out, float(log_prob), len(out) < limit, own)
        for out, log_prob, limit, own in zip(outputs, log_probs, limits.tolist(), token_log_probs, strict=True)
    ]
