"""The step interface: what a search needs from an engine (PyTorch or ONNX Runtime).

An engine keeps its decoder state (the KV cache, the source padding) opaque;
the search only hands it token ids and row indices as NumPy arrays. A search
never needs the whole distribution over the vocabulary, only each row's best
few next tokens, so that is what ``step_top`` returns: the ONNX engine computes
them inside its graph (a TopK node), and only (rows, k) values leave ONNX
Runtime instead of (rows, vocab). Engines that compute the full distribution
anyway (PyTorch) take ``step_top`` from :class:`FullDistributionStep`.
Both orderings break ties the same way (the lower token id first, like ONNX's
TopK), so every engine drives greedy and beam search to the same outputs.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import numpy as np

State = TypeVar("State")
# Up to this many columns a full stable sort is cheaper than a partition (beam candidates after the TopK head).
SORT_UP_TO = 256


class StepModel(Protocol[State]):
    """An encoder-decoder seen one decoding step at a time."""

    bos_id: int
    eos_id: int
    pad_id: int
    never_generate: tuple[int, ...]  # ids the search never chooses (the config's; Marian: <pad>)

    def start(self, src_ids: np.ndarray) -> State:
        """Encode a batch; ``src_ids`` (batch, src_len) int64, right-padded with ``pad_id``."""
        ...

    def step(self, state: State, tgt_ids: np.ndarray) -> tuple[np.ndarray, State]:
        """Feed ``tgt_ids`` (rows, new_len) after the cached prefix.

        Returns the log-probabilities of the next token after the last fed
        position, (rows, vocab) float32, and the state with the new keys/values.
        """
        ...

    def step_top(self, state: State, tgt_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, State]:
        """Like ``step``, but only each row's ``k`` most probable next tokens (fewer if the vocabulary is smaller).

        Returns their log-probabilities (rows, k) float32 and ids (rows, k) int64,
        best first, ties to the lower id, and the state with the new keys/values.
        """
        ...

    def select(self, state: State, rows: np.ndarray) -> State:
        """Keep, repeat or reorder rows of the state: row ``i`` of the result is ``rows[i]``."""
        ...


def top_columns(scores: np.ndarray, m: int) -> np.ndarray:
    """Column indices of the ``m`` largest ``scores`` (rows, columns) per row, best first, (rows, m).

    Ties go to the lower index, so the result never depends on how np.partition
    orders them: at the m-th largest value, the tied columns are taken from the left.
    """
    if m >= scores.shape[1] or scores.shape[1] <= SORT_UP_TO:
        return np.argsort(-scores, axis=1, kind="stable")[:, :m]  # a stable sort keeps equal ones in index order
    candidates = np.argpartition(scores, -m, axis=1)[:, -m:]  # (rows, m) some m largest, any order
    threshold = np.take_along_axis(scores, candidates, axis=1).min(axis=1, keepdims=True)  # (rows, 1)
    if ((scores >= threshold).sum(axis=1) == m).all():
        # No tie at the threshold left out (the usual case): the partition's columns are the answer.
        columns = np.sort(candidates, axis=1)
    else:
        columns = tie_aware_columns(scores, threshold, m)
    order = np.argsort(-np.take_along_axis(scores, columns, axis=1), axis=1, kind="stable")
    return np.take_along_axis(columns, order, axis=1)


def tie_aware_columns(scores: np.ndarray, threshold: np.ndarray, m: int) -> np.ndarray:
    """The ``m`` best columns per row, ascending, taking tied columns at ``threshold`` from the left."""
    above = scores > threshold
    tied = scores == threshold
    room = m - above.sum(axis=1, keepdims=True)  # (rows, 1) how many tied columns to take
    chosen = above | (tied & (np.cumsum(tied, axis=1) <= room))  # m per row
    return np.nonzero(chosen)[1].reshape(-1, m)  # (rows, m) ascending


def allowed_top(
    model: StepModel[State], state: State, tgt_ids: np.ndarray, k: int, end_allowed: bool = True
) -> tuple[np.ndarray, np.ndarray, State]:
    """``model.step_top`` without the ids the model never generates (and without </s> unless ``end_allowed``: an
    output shorter than its minimum): each row's ``k`` best of the others.

    As Hugging Face's ``bad_words_ids`` do, the banned tokens are left out after the log-softmax, so the
    others' log-probabilities stay as the model gave them (not renormalised)."""
    banned = model.never_generate if end_allowed else (*model.never_generate, model.eos_id)
    if not banned:
        return model.step_top(state, tgt_ids, k)
    log_probs, ids, state = model.step_top(state, tgt_ids, k + len(banned))  # (rows, ≤ k + banned) each
    # Every row loses at most len(banned) columns; with the whole vocabulary returned it loses exactly that many.
    m = min(k, ids.shape[1] - len(banned))
    hit = ids == banned[0]  # (rows, ≤ k + banned); a few comparisons cost less than np.isin's sort
    for token in banned[1:]:
        hit |= ids == token
    if not hit.any():  # the usual step: no banned id among any row's best
        return log_probs[:, :m], ids[:, :m], state
    keep = np.argsort(hit, axis=1, kind="stable")[:, :m]  # (rows, m) the allowed, best first
    return np.take_along_axis(log_probs, keep, axis=1), np.take_along_axis(ids, keep, axis=1), state


class FullDistributionStep(Generic[State]):
    """``step_top`` for an engine whose ``step`` computes the whole distribution: the k best in NumPy."""

    def step(self, state: State, tgt_ids: np.ndarray) -> tuple[np.ndarray, State]:
        raise NotImplementedError

    def step_top(self, state: State, tgt_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, State]:
        log_probs, state = self.step(state, tgt_ids)  # (rows, vocab)
        ids = top_columns(log_probs, min(k, log_probs.shape[1]))  # (rows, k)
        return np.take_along_axis(log_probs, ids, axis=1), ids.astype(np.int64), state
