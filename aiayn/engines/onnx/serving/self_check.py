"""An engine checked against a reference before it serves: never a silent wrong answer on a device nobody tested.

A GPU runs kernels the CPU never does (DecoderMaskedMultiHeadAttention's CUDA kernel, its key layout, fp16), so the
serving engine that loads on one first decodes a few sentences teacher-forced, step by step through the search's
own interface, and compares its log-probabilities with the CPU serving graphs' on each row's likeliest tokens. The
sentences are random ids of the folder's vocabulary: the check is of the arithmetic, not of the translations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aiayn.search.step import StepModel

SENTENCES, SOURCE_LEN, STEPS = 4, 12, 8
LIKELIEST = 10  # the reference's best tokens per row, where the searches look
# fp32: rounding only (the kernels sum in other orders); fp16: the activations' rounding (tests/engines measures
# ≤ 0.05 on the tiny models), far below what a wrong layout or a stale input gives (whole nats).
TOLERANCE = {"float32": 1e-3, "float16": 0.1}


def teacher_forced(engine: StepModel[Any], src_ids: np.ndarray, tgt_ids: np.ndarray) -> np.ndarray:
    """The log-probabilities after each of ``tgt_ids`` (rows, steps) fed one at a time: (steps, rows, vocab)."""
    state = engine.start(src_ids)
    steps = []
    for t in range(tgt_ids.shape[1]):
        log_probs, state = engine.step(state, tgt_ids[:, t : t + 1])
        steps.append(log_probs)
    return np.stack(steps)


def check_pairs(vocab_size: int, special_ids: list[int], bos: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Random sources (ending in </s>) and target prefixes (from <s>) of ordinary ids, the same every time."""
    rng = np.random.default_rng(0)
    ordinary = np.setdiff1d(np.arange(vocab_size), special_ids)
    src = rng.choice(ordinary, (SENTENCES, SOURCE_LEN))
    src[:, -1] = eos
    tgt = rng.choice(ordinary, (SENTENCES, STEPS))
    tgt[:, 0] = bos
    return src.astype(np.int64), tgt.astype(np.int64)


def disagreement(engine: StepModel[Any], reference: StepModel[Any], vocab_size: int, dtype: str) -> str:
    """Why ``engine`` must not serve (its log-probabilities differ from ``reference``'s beyond the tolerance of its
    ``dtype``), or "" when it agrees."""
    special = [engine.bos_id, engine.eos_id, engine.pad_id, *engine.never_generate]
    src, tgt = check_pairs(vocab_size, special, engine.bos_id, engine.eos_id)
    ours, theirs = teacher_forced(engine, src, tgt), teacher_forced(reference, src, tgt)
    likeliest = np.argsort(-theirs, axis=-1, kind="stable")[..., :LIKELIEST]  # (steps, rows, LIKELIEST)
    gap = float(np.abs(np.take_along_axis(ours, likeliest, -1) - np.take_along_axis(theirs, likeliest, -1)).max())
    tolerance = TOLERANCE[dtype]
    if gap <= tolerance:
        return ""
    return f"its log-probabilities differ from the CPU serving graphs' by up to {gap:.3g} (tolerance {tolerance})"
