"""Proof that the ONNX graphs compute what the PyTorch model computes; a failure is an error, not a warning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aiayn.search.step import StepModel
from aiayn.search.translator import SearchSettings, Translator, pad_batch

TOLERANCE = 1e-4  # max |log-prob difference| in fp32
BATCH_SIZES = (1, 7, 32)  # several shapes: a single sentence, a small and a large padded batch


class ParityError(ValueError):
    pass


@dataclass(frozen=True)
class ParityReport:
    max_abs_diff: float
    steps: int
    sentences: int


def lockstep_max_diff(
    reference: StepModel, candidate: StepModel, src_ids: np.ndarray, max_steps: int
) -> tuple[float, int]:
    """Greedy-decode with the reference's choices fed to both engines; the largest log-prob gap of any step."""
    ref_state, cand_state = reference.start(src_ids), candidate.start(src_ids)
    last = np.full((src_ids.shape[0], 1), reference.bos_id, dtype=np.int64)
    worst, steps = 0.0, 0
    for _ in range(max_steps):
        ref_log_probs, ref_state = reference.step(ref_state, last)
        cand_log_probs, cand_state = candidate.step(cand_state, last)
        worst = max(worst, float(np.abs(ref_log_probs - cand_log_probs).max()))
        steps += 1
        last = ref_log_probs.argmax(axis=1)[:, None].astype(np.int64)
        if (last == reference.eos_id).all():
            break
    return worst, steps


def several_sizes(n: int) -> list[slice]:
    """Batches of 1, 7, then 32 sentences: several shapes and paddings."""
    bounds, start = [], 0
    sizes = iter(BATCH_SIZES)
    while start < n:
        size = next(sizes, BATCH_SIZES[-1])
        bounds.append(slice(start, min(n, start + size)))
        start += size
    return bounds


def check_logits(
    reference: StepModel, candidate: StepModel, src_ids: Sequence[Sequence[int]], tolerance: float = TOLERANCE
) -> ParityReport:
    """Compare at every decoding step on padded batches of several sizes; raise above ``tolerance``."""
    worst, steps = 0.0, 0
    for rows in several_sizes(len(src_ids)):
        padded = pad_batch(src_ids[rows], reference.pad_id)
        diff, n = lockstep_max_diff(reference, candidate, padded, max_steps=padded.shape[1] + 10)
        worst, steps = max(worst, diff), steps + n
    if worst > tolerance:
        raise ParityError(
            f"ONNX and PyTorch disagree: max |log-prob difference| {worst:.2e} > {tolerance:.0e}; the export is wrong"
        )
    return ParityReport(worst, steps, len(src_ids))


def count_identical(
    reference: Translator, candidate: Translator, src_ids: Sequence[Sequence[int]], settings: SearchSettings
) -> int:
    """How many sentences get token-identical outputs from both engines under one search setting."""
    ref_out = reference.translate_ids(src_ids, settings)
    cand_out = candidate.translate_ids(src_ids, settings)
    return sum(a == b for a, b in zip(ref_out, cand_out, strict=True))
