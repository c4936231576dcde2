"""Greedy search: the most probable next token at each step, per sentence, until </s>."""

from __future__ import annotations

import numpy as np

from aiayn.search.step import StepModel


def default_max_len(src_ids: np.ndarray, pad_id: int, extra: int = 50) -> np.ndarray:
    """§6.1: at most the source length + 50 output tokens, per sentence. (batch,)"""
    return (src_ids != pad_id).sum(axis=1) + extra


def greedy_search(model: StepModel, src_ids: np.ndarray, max_len: np.ndarray | int | None = None) -> list[list[int]]:
    """Output ids (without <s>, </s>) for each row of ``src_ids`` (batch, src_len)."""
    batch = src_ids.shape[0]
    limits = np.broadcast_to(default_max_len(src_ids, model.pad_id) if max_len is None else max_len, (batch,))
    state = model.start(src_ids)
    last = np.full((batch, 1), model.bos_id, dtype=np.int64)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    finished = np.zeros(batch, dtype=bool)
    for step in range(int(limits.max())):
        log_probs, state = model.step(state, last)  # (batch, vocab)
        choice = log_probs.argmax(axis=1)
        for row in np.flatnonzero(~finished):
            if choice[row] == model.eos_id:
                finished[row] = True
            else:
                outputs[row].append(int(choice[row]))
        finished |= step + 1 >= limits
        if finished.all():
            break
        last = np.where(finished, model.eos_id, choice)[:, None].astype(np.int64)
    return outputs
