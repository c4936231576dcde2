"""What the serving engines' state back ends share about the rows a search selects: a state used once, and the
selections the searches make, recognised cheaply."""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

# Compact when live sentences ≤ this share of the physical ones (docs/speed.md: never compacting cost 20–45 % at
# batch 32; thresholds 0.25–0.9 were within noise).
COMPACT_BELOW = 0.5


class Versioned(Protocol):
    version: int  # bumped by every step/select: a state of an older version is consumed


B = TypeVar("B", bound=Versioned)
B_co = TypeVar("B_co", bound=Versioned, covariant=True)


class StateOf(Protocol[B_co]):
    @property
    def batch(self) -> B_co: ...

    @property
    def version(self) -> int: ...


def consume(state: StateOf[B]) -> B:
    """The batch behind ``state``, which may not be stepped or selected again (its buffers change in place)."""
    batch = state.batch
    if state.version != batch.version:
        raise ValueError("this decoder state was already used: a state can be stepped or selected once")
    batch.version += 1
    return batch


def run_length(rows: np.ndarray) -> int:
    """k if ``rows`` is each of its values repeated k times in a row (k ≥ 1), else 0."""
    if rows.size == 0:
        return 0
    change = np.flatnonzero(rows[1:] != rows[:-1])
    k = int(change[0]) + 1 if change.size else rows.size
    if rows.size % k or not (rows.reshape(-1, k) == rows[::k, None]).all():
        return 0
    return k


def distinct(values: np.ndarray) -> bool:
    """No value twice (cheaply when they increase, as the searches' selections do)."""
    if values.size < 2 or bool((values[1:] > values[:-1]).all()):
        return True
    return np.unique(values).size == values.size
