"""§5.1: sentence pairs batched together by approximate length, each batch holding about N tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# ± tokens of sort noise, so that pairs of similar length meet in different batches each epoch.
LENGTH_JITTER = 1.0


@dataclass(frozen=True)
class BatchPlan:
    """One epoch's batches as slices of one length-sorted order of the pairs, visited in shuffled order.

    Three arrays whatever the number of batches, so millions of pairs cost a few bytes each, not a Python
    list apiece.
    """

    order: np.ndarray  # (pairs,) pair indices sorted by jittered cost
    bounds: np.ndarray  # (sorted batches + 1,) sorted batch j is order[bounds[j]:bounds[j + 1]]
    visits: np.ndarray  # (batches,) the sorted batches in training order

    def __len__(self) -> int:
        return len(self.visits)

    def __getitem__(self, i: int) -> np.ndarray:
        """The pair indices of the i-th batch to train on."""
        j = self.visits[i]
        return self.order[self.bounds[j] : self.bounds[j + 1]]


def plan_batches(
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
) -> BatchPlan:
    """Batches whose padded size stays within ``max_tokens``, in shuffled order.

    Lengths are token counts without <s>/</s>: a pair costs the longer side + 1 (the </s> of the
    source, the <s> or </s> of the target), and a batch costs its costliest pair × its size, padding
    included. Sorting by jittered length keeps padding low while batches still change per epoch.
    Deterministic for one (seed, epoch), so a resumed run sees the same batches. A pair longer than
    ``max_tokens`` gets a batch of its own rather than being dropped.
    """
    n_src, n_tgt = len(src_lengths), len(tgt_lengths)
    if n_src != n_tgt:
        raise ValueError(f"{n_src} source lengths but {n_tgt} target lengths; give one per pair")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    costs = np.maximum(src, tgt) + 1
    if costs.size and costs.min() < 1:
        raise ValueError("sequence lengths must not be negative")
    rng = np.random.default_rng((seed, epoch))
    order = np.argsort(costs + rng.uniform(-LENGTH_JITTER, LENGTH_JITTER, costs.size), kind="stable")
    bounds = greedy_bounds(costs[order], max_tokens)
    return BatchPlan(order, bounds, rng.permutation(len(bounds) - 1))


def greedy_bounds(costs: np.ndarray, max_tokens: int) -> np.ndarray:
    """Where batches start in the sorted ``costs``: each takes pairs while (its costliest) × (its size) fits.

    The first pair of a batch is always taken; a batch of k pairs costs at least k × its first pair's cost,
    so only the next max_tokens // that cost pairs can join, and the first that does not fit ends it.
    """
    bounds = [0]
    start = 0
    while start < costs.size:
        window = costs[start : start + max_tokens // int(costs[start]) + 1]
        widest = np.maximum.accumulate(window)  # the batch's costliest pair if it ended at each position
        too_big = np.flatnonzero(widest[1:] * np.arange(2, window.size + 1) > max_tokens)
        start += int(too_big[0]) + 1 if too_big.size else window.size
        bounds.append(start)
    return np.asarray(bounds, dtype=np.int64)


def token_batches(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int, seed: int, epoch: int
) -> list[list[int]]:
    """``plan_batches`` as lists of pair indices, for small corpora (validation)."""
    plan = plan_batches(src_lengths, tgt_lengths, max_tokens, seed, epoch)
    return [plan[i].tolist() for i in range(len(plan))]
