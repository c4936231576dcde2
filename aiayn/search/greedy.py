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
    longest = int(limits.max())
    # Each step writes every live row's choice in place; an output is its row's first ``lengths`` ids.
    tokens = np.empty((batch, longest), np.int64)  # (batch, longest)
    token_log_probs = np.empty((batch, longest))  # each output id's, as its step gave it
    lengths = limits.copy()  # (batch,) a sentence that chooses </s> ends one short of that step
    log_probs = np.zeros(batch)  # (batch,) each sentence's sum so far, </s>'s included
    state = model.start(src_ids)
    rows = np.arange(batch)  # the sentence of each state row
    every = True  # rows is every sentence, in order
    next_limit = int(limits.min())  # the first step at which a row reaches its limit
    last = np.full((batch, 1), model.bos_id, dtype=np.int64)  # (rows, 1)
    for length in range(1, longest + 1):
        top_log_probs, best, state = allowed_top(model, state, last, 1, length > min_len)  # (rows, 1) each
        choice, chosen = best[:, 0], top_log_probs[:, 0]  # (rows,) ties go to the lower id
        if every:
            log_probs += chosen
            tokens[:, length - 1], token_log_probs[:, length - 1] = choice, chosen
        else:
            log_probs[rows] += chosen
            tokens[rows, length - 1], token_log_probs[rows, length - 1] = choice, chosen
        ended = choice == model.eos_id  # (rows,)
        if length < next_limit and not ended.any():
            last = best
            continue
        going = ~ended & (limits[rows] > length)  # (rows,)
        lengths[rows[ended]] = length - 1
        if not going.any():
            break
        last = best
        if not going.all():
            state = model.select(state, np.flatnonzero(going))
            rows, last, every = rows[going], best[going], False
            next_limit = int(limits[rows].min())
    # A sentence that fills its limit was cut there; one that is shorter chose </s>.
    return [
        Output(tokens[i, :n].tolist(), float(log_prob), n < limit, token_log_probs[i, :n].tolist())
        for i, (n, log_prob, limit) in enumerate(zip(lengths.tolist(), log_probs, limits.tolist(), strict=True))
    ]
