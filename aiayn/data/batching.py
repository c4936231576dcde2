"""§5.1: sentence pairs batched together by approximate length, each batch holding about N tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# ± tokens of sort noise, so that pairs of similar length meet in different batches each epoch.
LENGTH_JITTER = 1.0


def token_batches(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int, seed: int, epoch: int
) -> list[list[int]]:
    """Index lists whose padded size stays within ``max_tokens``, in shuffled order.

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
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index, cost in zip(order.tolist(), costs[order].tolist(), strict=True):
        if current and max(longest, cost) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, cost)
    if current:
        batches.append(current)
    return [batches[i] for i in rng.permutation(len(batches))]
