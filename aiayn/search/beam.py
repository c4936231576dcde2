"""Beam search with the GNMT length penalty (§6.1: beam 4, α = 0.6), batched over sentences.

A finished hypothesis is ranked by its log-probability over lp(|Y|): GNMT's ((5 + |Y|) / 6)^α by default,
or |Y|^α (``power``), the normalisation of Hugging Face's ``generate`` that imported checkpoints were tuned with.

Stopping rule (fairseq's): a sentence is done once it holds ``beam_size`` finished
hypotheses, when it reaches its length limit (its live beams are then finished as
they are, without </s>), or when no live beam is left. With beam 1 this is exactly
greedy search. The exact bound of tensor2tensor (stop only when the best live score
over lp(max length) cannot beat the best finished one) would keep nearly every
sentence running to its limit of source length + 50 for a rare gain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from aiayn.search.greedy import max_lengths
from aiayn.search.output import Output
from aiayn.search.step import StepModel, allowed_top, top_columns


@dataclass(frozen=True)
class Hypothesis(Output):
    """A finished output, ranked by ``score``: its log-probability over the length penalty."""

    score: float


LENGTH_NORMALIZATIONS = ("gnmt", "power")


def length_penalty_of(length: int, alpha: float, normalization: str = "gnmt") -> float:
    """lp(Y) = ((5 + |Y|) / 6)^α (``gnmt``: Wu et al., 2016) or |Y|^α (``power``: Hugging Face's); |Y| counts
    the generated tokens, </s> included."""
    if normalization == "power":
        return float(length) ** alpha
    if normalization == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    raise ValueError(
        f"unknown length normalization {normalization!r}; choose one of {', '.join(LENGTH_NORMALIZATIONS)}"
    )


@dataclass(frozen=True)
class Beams:
    """The live beams of the sentences still searched: row r of each array is the r-th active sentence."""

    active: np.ndarray  # (n,) the sentences still searched
    scores: np.ndarray  # (n, w) log-probabilities of the live beams, -inf for a dead one (w: 1 at first, then k)
    tokens: np.ndarray  # (n, w, length - 1)
    token_log_probs: np.ndarray  # (n, w, length - 1) each token's, as the step that chose it gave it

    @classmethod
    def start(cls, batch: int) -> Beams:
        """One beam per sentence, empty: the first step's best tokens become the k beams (the decoder runs that
        step on one row per sentence, not on k copies of it)."""
        return cls(np.arange(batch), np.zeros((batch, 1)), np.zeros((batch, 1, 0), np.int64), np.zeros((batch, 1, 0)))

    def rows(self, keep: np.ndarray) -> Beams:
        """The sentences of ``keep`` (n,) only."""
        return Beams(self.active[keep], self.scores[keep], self.tokens[keep], self.token_log_probs[keep])


@dataclass(frozen=True)
class Candidates:
    """Each active sentence's best continuations of its beams, best first: (n, m) each, m ≤ 2k."""

    log_prob: np.ndarray  # the beam's log-probability with the token's added
    parent: np.ndarray  # the beam each continues
    token: np.ndarray
    token_log_prob: np.ndarray  # the token's own
    ends: np.ndarray  # the </s> candidates that rank in the beam
    takes: np.ndarray  # the live candidates that rank in the beam
    slot: np.ndarray  # the beam a live candidate takes where it ``takes`` one


class Finished:
    """Each sentence's finished hypotheses, and how many of them </s> ended."""

    def __init__(self, batch: int) -> None:
        self.hypotheses: list[list[Hypothesis]] = [[] for _ in range(batch)]
        self.ended = np.zeros(batch, dtype=np.int64)  # (batch,)

    def add(
        self, sentence: int, tokens: np.ndarray, token_log_probs: np.ndarray, log_prob: float, ended: bool, lp: float
    ) -> None:
        """A hypothesis of ``tokens`` (length,), ranked by ``log_prob`` over the length penalty ``lp``."""
        self.hypotheses[sentence].append(
            Hypothesis(tokens.tolist(), log_prob, ended, token_log_probs.tolist(), log_prob / lp)
        )
        self.ended[sentence] += ended

    def best(self, k: int) -> list[list[Hypothesis]]:
        return [sorted(hyps, key=lambda h: -h.score)[:k] for hyps in self.hypotheses]


def beam_search_nbest(
    model: StepModel[Any],
    src_ids: np.ndarray,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    max_len: int | np.ndarray | None = None,
    length_normalization: str = "gnmt",
    min_len: int = 0,
) -> list[list[Hypothesis]]:
    """Up to ``beam_size`` hypotheses per row of ``src_ids`` (batch, src_len), best first.

    ``max_len`` is one limit for all rows or one per row, (batch,); by default the
    real source length + 50. </s> cannot end a hypothesis of fewer than ``min_len`` tokens.
    Done sentences are dropped from the decoder state.
    """
    batch, k = src_ids.shape[0], beam_size
    limits = max_lengths(src_ids, model.pad_id, max_len)  # (batch,)
    finished = Finished(batch)
    # State rows are sentence-major: row r * w + b is beam b of the r-th active sentence (w beams each: 1 on the
    # first step, k after).
    state = model.start(src_ids)
    beams = Beams.start(batch)
    last = np.full((batch, 1), model.bos_id, dtype=np.int64)  # (n * w, 1)
    for length in range(1, int(limits.max()) + 1):
        width = beams.scores.shape[1]
        # A beam's share of the sentence's best 2k candidates is among that beam's own best 2k.
        top_log_probs, top_ids, state = allowed_top(model, state, last, 2 * k, length > min_len)  # (n * w, kk)
        candidates = ranked_candidates(beams.scores, top_log_probs, top_ids, model.eos_id, k)
        lp = length_penalty_of(length, length_penalty, length_normalization)
        finish_ended(finished, beams, candidates, lp)
        beams, parents = advance(beams, candidates, model.eos_id, k)
        at_limit = limits[beams.active] <= length  # (n,)
        finish_at_limit(finished, beams, at_limit, lp)
        # (n,) slot 0 is live if any is
        going = ~at_limit & (finished.ended[beams.active] < k) & np.isfinite(beams.scores[:, 0])
        if not going.any():
            break
        state = model.select(state, (np.flatnonzero(going)[:, None] * width + parents[going]).reshape(-1))
        beams = beams.rows(going)
        last = beams.tokens[:, :, -1].reshape(-1, 1)
    return finished.best(k)


def ranked_candidates(
    scores: np.ndarray, top_log_probs: np.ndarray, top_ids: np.ndarray, eos: int, k: int
) -> Candidates:
    """Each sentence's best 2k continuations of its beams (``scores``, (n, w)) by each beam's best tokens
    (``top_ids`` and ``top_log_probs``, (n * w, kk)), best first: which of them end, which take the next k beams."""
    (n, w), kk = scores.shape, top_ids.shape[1]
    row = np.arange(n)[:, None]  # (n, 1) for indexing row by row
    every = (scores[:, :, None] + top_log_probs.reshape(n, w, kk)).reshape(n, w * kk)
    # Columns run beam by beam, each beam's tokens best first and equal ones by id, so among equal
    # scores the column order is the (beam, token) order: ties break as over the whole vocabulary.
    # Each beam has one </s> candidate, so the best 2k hold k live ones whenever k exist.
    flat = top_columns(every, min(2 * k, w * kk))  # (n, m)
    log_prob, token = every[row, flat], top_ids.reshape(n, w * kk)[row, flat]  # (n, m) each
    possible, is_eos = np.isfinite(log_prob), token == eos
    live = possible & ~is_eos
    live_rank = np.cumsum(live, axis=1)  # (n, m) live candidates up to each, itself included
    in_beam = live_rank - live < k  # (n, m) fewer than k live candidates better than each
    return Candidates(
        log_prob=log_prob,
        parent=flat // kk,
        token=token,
        token_log_prob=top_log_probs.reshape(n, w * kk)[row, flat],
        ends=possible & is_eos & in_beam,
        takes=live & in_beam,
        slot=live_rank - 1,
    )


def finish_ended(finished: Finished, beams: Beams, candidates: Candidates, lp: float) -> None:
    """The hypotheses that </s> ends among the candidates that rank in the beam (</s> itself not in the tokens)."""
    for r, c in zip(*np.nonzero(candidates.ends), strict=True):
        parent = candidates.parent[r, c]
        tokens, own = beams.tokens[r, parent], beams.token_log_probs[r, parent]
        finished.add(beams.active[r], tokens, own, float(candidates.log_prob[r, c]), True, lp)


def advance(beams: Beams, candidates: Candidates, eos: int, k: int) -> tuple[Beams, np.ndarray]:
    """The k beams one token longer, each sentence's live candidates in rank order, and the parent of each new beam
    (n, k). A sentence with fewer than k live candidates keeps dead beams: they copy beam 0, scored -inf."""
    n = beams.scores.shape[0]
    row = np.arange(n)[:, None]  # (n, 1)
    rows, cols = np.nonzero(candidates.takes)
    slot = candidates.slot[rows, cols]  # (live ones,)
    parents = np.zeros((n, k), dtype=np.int64)
    scores = np.full((n, k), -np.inf)
    new_tokens = np.full((n, k), eos, dtype=np.int64)  # dead beams are fed </s>, their outputs ignored
    new_log_probs = np.zeros((n, k))
    parents[rows, slot] = candidates.parent[rows, cols]
    scores[rows, slot] = candidates.log_prob[rows, cols]
    new_tokens[rows, slot] = candidates.token[rows, cols]
    new_log_probs[rows, slot] = candidates.token_log_prob[rows, cols]
    tokens = np.concatenate([beams.tokens[row, parents], new_tokens[:, :, None]], axis=2)
    token_log_probs = np.concatenate([beams.token_log_probs[row, parents], new_log_probs[:, :, None]], axis=2)
    return Beams(beams.active, scores, tokens, token_log_probs), parents


def finish_at_limit(finished: Finished, beams: Beams, at_limit: np.ndarray, lp: float) -> None:
    """The live beams of the sentences ``at_limit`` (n,), finished as they are, without </s>."""
    for r in np.flatnonzero(at_limit):
        for b in np.flatnonzero(np.isfinite(beams.scores[r])):
            finished.add(
                beams.active[r], beams.tokens[r, b], beams.token_log_probs[r, b], float(beams.scores[r, b]), False, lp
            )


def beam_search(
    model: StepModel[Any],
    src_ids: np.ndarray,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    max_len: int | np.ndarray | None = None,
    length_normalization: str = "gnmt",
    min_len: int = 0,
) -> list[Output]:
    """The best output per row of ``src_ids`` (batch, src_len), from the n-best (none found: empty, -inf)."""
    nbest = beam_search_nbest(model, src_ids, beam_size, length_penalty, max_len, length_normalization, min_len)
    return [hyps[0] if hyps else Output([], -np.inf, False, []) for hyps in nbest]
