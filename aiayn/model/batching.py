"""§5.1: sentence pairs batched together by approximate length, each batch holding about N tokens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def token_batches(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int, seed: int, epoch: int
) -> list[list[int]]:
    """Index lists whose padded size (count × longest side) stays within ``max_tokens``.

    Deterministic for one (seed, epoch), so a resumed run sees the same batches;
    a little length noise makes the batches differ from epoch to epoch. A
    single pair longer than ``max_tokens`` gets a batch of its own.
    """
    rng = np.random.default_rng((seed, epoch))
    lengths = np.maximum(np.asarray(src_lengths), np.asarray(tgt_lengths))
    order = np.lexsort((rng.random(len(lengths)), lengths + rng.uniform(-1, 1, len(lengths))))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order.tolist():
        longest_if_added = max(longest, int(lengths[index]))
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], int(lengths[index])
        current.append(index)
        longest = longest_if_added
    if current:
        batches.append(current)
    return [batches[i] for i in rng.permutation(len(batches))]
