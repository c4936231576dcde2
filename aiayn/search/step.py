"""The step interface: what a search needs from an engine (PyTorch or ONNX Runtime).

An engine keeps its decoder state (the KV cache, the source padding) opaque;
the search only hands it token ids and row indices as NumPy arrays and gets
NumPy log-probabilities back. Both engines implement this protocol, so greedy
and beam search are written once.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

State = TypeVar("State")


class StepModel(Protocol[State]):
    """An encoder-decoder seen one decoding step at a time."""

    bos_id: int
    eos_id: int
    pad_id: int

    def start(self, src_ids: np.ndarray) -> State:
        """Encode a batch; ``src_ids`` (batch, src_len) int64, right-padded with ``pad_id``."""
        ...

    def step(self, state: State, tgt_ids: np.ndarray) -> tuple[np.ndarray, State]:
        """Feed ``tgt_ids`` (rows, new_len) after the cached prefix.

        Returns the log-probabilities of the next token after the last fed
        position, (rows, vocab) float32, and the state with the new keys/values.
        """
        ...

    def select(self, state: State, rows: np.ndarray) -> State:
        """Keep, repeat or reorder rows of the state: row ``i`` of the result is ``rows[i]``."""
        ...
