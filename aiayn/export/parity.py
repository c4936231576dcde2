"""Proof that the ONNX graphs compute what the PyTorch model computes; a failure is an error, not a warning.

Both engines are driven in lockstep through the search's step interface:
greedy decoding with the reference's choices fed to both, so every step
compares the same inputs. Then the whole output prefix is fed again in one
call (past_len 0, new_len > 1), the decoder's other shape. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aiayn.search.step import StepModel
from aiayn.search.translator import SearchSettings, Translator, pad_batch

TOLERANCE = 1e-4  # max |log-prob difference| in fp32
BATCH_SIZES = (1, 7, 32)  # several shapes: a single sentence, a small and a large padded batch
EXTRA_STEPS = 10  # decode this far past the longest source, unless every row has ended


class ParityError(ValueError):
    """Raised when an exported graph disagrees with PyTorch (the CLI turns it into exit code 2)."""


@dataclass(frozen=True)
class ParityReport:
    max_abs_diff: float
    steps: int
    sentences: int
    batch_shapes: tuple[tuple[int, int], ...]  # (batch, src_len) of every batch checked


def lockstep_max_diff(
    reference: StepModel, candidate: StepModel, src_ids: np.ndarray, max_steps: int
) -> tuple[float, int]:
    """The largest log-prob gap of any step, and the number of steps, on one padded batch."""
    ref_state, cand_state = reference.start(src_ids), candidate.start(src_ids)
    last = np.full((src_ids.shape[0], 1), reference.bos_id, dtype=np.int64)
    fed = [last]
    worst, steps = 0.0, 0
    while steps < max_steps:
        steps += 1
        ref_log_probs, ref_state = reference.step(ref_state, last)  # (batch, vocab)
        cand_log_probs, cand_state = candidate.step(cand_state, last)
        worst = max(worst, float(np.abs(ref_log_probs - cand_log_probs).max()))
        last = ref_log_probs.argmax(axis=1)[:, None].astype(np.int64)
        if (last == reference.eos_id).all():
            break
        fed.append(last)
    prefix = np.concatenate(fed, axis=1)  # (batch, steps): all at once, after an empty cache
    (ref_log_probs, _), (cand_log_probs, _) = (e.step(e.start(src_ids), prefix) for e in (reference, candidate))
    worst = max(worst, float(np.abs(ref_log_probs - cand_log_probs).max()))
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


def max_log_prob_diff(reference: StepModel, candidate: StepModel, src_ids: Sequence[Sequence[int]]) -> ParityReport:
    """Compare at every decoding step on padded batches of several sizes."""
    worst, steps, shapes = 0.0, 0, []
    for rows in several_sizes(len(src_ids)):
        padded = pad_batch(src_ids[rows], reference.pad_id)
        diff, n = lockstep_max_diff(reference, candidate, padded, max_steps=padded.shape[1] + EXTRA_STEPS)
        worst, steps = max(worst, diff), steps + n
        shapes.append(padded.shape)
    return ParityReport(worst, steps, len(src_ids), tuple(shapes))


def check_logits(
    reference: StepModel, candidate: StepModel, src_ids: Sequence[Sequence[int]], tolerance: float = TOLERANCE
) -> ParityReport:
    """:func:`max_log_prob_diff`, raising :class:`ParityError` above ``tolerance``."""
    report = max_log_prob_diff(reference, candidate, src_ids)
    if not report.max_abs_diff <= tolerance:  # also catches NaN
        raise ParityError(
            f"{getattr(candidate, 'name', 'candidate')} and {getattr(reference, 'name', 'reference')} disagree: "
            f"max |log-prob difference| {report.max_abs_diff:.2e} > {tolerance:.0e} over {report.steps} steps; "
            "the export is wrong"
        )
    return report


def count_identical(
    reference: Translator, candidate: Translator, src_ids: Sequence[Sequence[int]], settings: SearchSettings
) -> int:
    """How many sentences get token-identical outputs from both engines under one search setting."""
    ref_out = reference.translate_ids(src_ids, settings)
    cand_out = candidate.translate_ids(src_ids, settings)
    return sum(a == b for a, b in zip(ref_out, cand_out, strict=True))
