"""Beam search with the GNMT length penalty (§6.1: beam 4, α = 0.6), batched over sentences.

A finished hypothesis is ranked by its log-probability over lp(|Y|): GNMT's ((5 + |Y|) / 6)^α by default,
or |Y|^α (``power``), the normalisation of Hugging Face's ``generate`` that imported checkpoints were tuned with.

Finishing rule (fairseq's, which transformers' ``generate`` and CTranslate2 share): each step ranks a sentence's
best 2k candidates (beam, token) by summed log-probability, </s> ones included; a </s> ends a hypothesis only where
it ranks among the best k ("only consider eos when it's among the top beam_size indices", fairseq's
``sequence_generator.py``), the other </s> are dropped, and the first k live candidates are the beams (a freed beam is
refilled from ranks k..2k-1).

Stopping rule (fairseq's): a sentence is done once it holds ``beam_size`` finished
hypotheses, when it reaches its length limit (its live beams are then finished as
they are, without </s>), or when no live beam is left. With beam 1 this is exactly
greedy search. The exact bound of tensor2tensor (stop only when the best live score
over lp(max length) cannot beat the best finished one) would keep nearly every
sentence running to its limit of source length + 50 for a rare gain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from aiayn.search.greedy import max_lengths
from aiayn.search.output import Output
from aiayn.search.step import StepModel, allowed_top, top_columns


@dataclass(frozen=True)
class Hypothesis(Output):
    """A finished output, ranked by ``score``: its log-probability over the length penalty."""

    score: float


LENGTH_NORMALIZATIONS = ("gnmt", "power")
# The val BLEU a folder may give up for |Y|^α (``power``), which transformers' ``generate`` and CTranslate2 reproduce
# (GNMT's they cannot express): α tuned under both, power is kept within this of GNMT's best (``aiayn eval``).
PORTABLE_BLEU_MARGIN = 0.1


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


class History:
    """Every step's beams as back-pointers: a hypothesis's tokens are read back from where it ends, once, at the end
    of the search, instead of every beam's tokens being copied forward at every step."""

    def __init__(self) -> None:
        self.tokens: list[np.ndarray] = []  # per step, (n, k) the token each beam took
        self.own: list[np.ndarray] = []  # per step, (n, k) its log-probability, as the step gave it
        self.back: list[np.ndarray] = []  # per step, (n, k) the beam it continues, in the step before's flattened

    def add(self, tokens: np.ndarray, own: np.ndarray, back: np.ndarray) -> None:
        """A step's beams, (n, k) each: flattened (``ravel`` at the end), beam b of row r is r · k + b."""
        self.tokens.append(tokens)
        self.own.append(own)
        self.back.append(back)

    def trace(self, steps: np.ndarray, beams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens and their log-probabilities, (h, longest) each, of the beams ``beams`` (h,) of the steps
        ``steps`` (h,): row i holds ``steps[i]`` of them (a step of 0: none, an output that </s> ended at once)."""
        longest = int(steps.max(initial=0))
        tokens, own = np.zeros((steps.size, longest), np.int64), np.zeros((steps.size, longest))
        cursor = beams.copy()
        for step in range(longest, 0, -1):
            on = steps >= step  # (h,) the hypotheses as long as this
            at = cursor[on]
            tokens[on, step - 1] = self.tokens[step - 1].ravel()[at]
            own[on, step - 1] = self.own[step - 1].ravel()[at]
            cursor[on] = self.back[step - 1].ravel()[at]
        return tokens, own


class Finished:
    """The finished hypotheses, as added step by step, ranked at the end."""

    def __init__(self) -> None:
        # Each add's (sentence, step, beam in that step's history, log-probability, ended by </s>, score), (h,) each.
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(
        self, sentences: np.ndarray, step: int, beams: np.ndarray, log_probs: np.ndarray, ended: bool, lp: float
    ) -> None:
        """Hypotheses of ``sentences`` (h,) ending at ``beams`` of ``step`` in the history, ranked by ``log_probs``
        over the length penalty ``lp``."""
        h = sentences.size
        self.parts.append((sentences, np.full(h, step), beams, log_probs, np.full(h, ended), log_probs / lp))

    def best(self, batch: int, k: int, history: History) -> list[list[Hypothesis]]:
        """Each sentence's ``k`` best, by score; equal scores in the order they were added."""
        best: list[list[Hypothesis]] = [[] for _ in range(batch)]
        if not self.parts:
            return best
        sentence, step, beam, log_prob, ended, score = (np.concatenate(part) for part in zip(*self.parts, strict=True))
        order = np.lexsort((np.arange(sentence.size), -score, sentence))  # by sentence, best first, then as added
        ranked = sentence[order]
        rank = np.arange(order.size) - np.searchsorted(ranked, ranked)  # (h,) place within its sentence
        chosen = order[rank < k]
        tokens, own = (array.tolist() for array in history.trace(step[chosen], beam[chosen]))
        fields = (sentence, step, log_prob, ended, score)
        for i, (s, n, lp, e, sc) in enumerate(zip(*(f[chosen].tolist() for f in fields), strict=True)):
            best[s].append(Hypothesis(tokens[i][:n], lp, e, own[i][:n], sc))
        return best


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
    finished, history = searched(model, src_ids, beam_size, length_penalty, max_len, length_normalization, min_len)
    return finished.best(src_ids.shape[0], beam_size, history)


def searched(
    model: StepModel[Any],
    src_ids: np.ndarray,
    k: int,
    length_penalty: float,
    max_len: int | np.ndarray | None,
    length_normalization: str,
    min_len: int,
) -> tuple[Finished, History]:
    """The search of ``beam_search_nbest``: every finished hypothesis, and the history their tokens are read from."""
    batch = src_ids.shape[0]
    limits = max_lengths(src_ids, model.pad_id, max_len)  # (batch,)
    history, finished = History(), Finished()
    # The live beams of the sentences still searched, row r for the r-th of ``active``. State rows are
    # sentence-major: row r * w + b is beam b of the r-th active sentence (w beams each: 1 on the first step, as all
    # would start from <s>; k after).
    state = model.start(src_ids)
    active = np.arange(batch)  # (n,) the sentences still searched
    scores = np.zeros((batch, 1))  # (n, w) log-probabilities of the live beams, -inf for a dead one
    came_from = np.zeros((batch, 1), np.int64)  # (n, 1) each sentence's first beam in the last step's history
    ended = np.zeros(batch, np.int64)  # (n,) hypotheses that </s> ended
    row_limits, next_limit = limits, int(limits.min())  # (n,) and the first step at which one is reached
    last = np.full((batch, 1), model.bos_id, dtype=np.int64)  # (n * w, 1)
    every_row = np.arange(batch)  # (n,) 0..n-1, while no sentence stops
    for length in range(1, int(limits.max()) + 1):
        n, width = scores.shape
        # A beam's share of the sentence's best 2k candidates is among that beam's own best 2k.
        top_log_probs, top_ids, state = allowed_top(model, state, last, 2 * k, length > min_len)  # (n * w, kk)
        ranked = ranked_step(scores, top_log_probs, top_ids, model.eos_id, k)
        history.add(ranked.tokens, ranked.own, came_from + ranked.parents)
        going = None  # (n,) the sentences that go on, where any stops
        if ranked.ends is not None:
            rows, beams, log_probs = ranked.ends
            lp = length_penalty_of(length, length_penalty, length_normalization)
            finished.add(active[rows], length - 1, came_from[rows, 0] + beams, log_probs, True, lp)
            ended += np.bincount(rows, minlength=n)
            going = ended < k
        if length >= next_limit:
            at_limit = row_limits <= length  # (n,) their live beams finish as they are, without </s>
            rows, beams = np.nonzero(at_limit[:, None] & np.isfinite(ranked.scores))
            lp = length_penalty_of(length, length_penalty, length_normalization)
            finished.add(active[rows], length, rows * k + beams, ranked.scores[rows, beams], False, lp)
            going = ~at_limit if going is None else going & ~at_limit
        if not ranked.all_live:
            live = np.isfinite(ranked.scores[:, 0])  # (n,) slot 0 is live if any is
            going = live if going is None else going & live
        kept, scores, parents, tokens = every_row, ranked.scores, ranked.parents, ranked.tokens
        if going is not None and not going.all():
            if not going.any():
                break
            kept = np.flatnonzero(going)
            active, ended, row_limits = active[kept], ended[kept], row_limits[kept]
            scores, parents, tokens = scores[kept], parents[kept], tokens[kept]
            next_limit, every_row = int(row_limits.min()), np.arange(kept.size)
        state = model.select(state, (kept[:, None] * width + parents).reshape(-1))
        came_from, last = kept[:, None] * k, tokens.reshape(-1, 1)
    return finished, history


class Ranked(NamedTuple):
    """The k beams one token longer, (n, k) each, each sentence's live candidates in rank order (a sentence with
    fewer than k keeps dead beams: they continue beam 0, scored -inf, fed </s>)."""

    scores: np.ndarray  # the beam's log-probability
    parents: np.ndarray  # the beam it continues
    tokens: np.ndarray
    own: np.ndarray  # the token's log-probability, as the step gave it
    all_live: bool  # no dead beam
    ends: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # the ended ones, if any: (rows, the beams they
    # continue, their log-probabilities), in rank order within a row


def ranked_step(scores: np.ndarray, top_log_probs: np.ndarray, top_ids: np.ndarray, eos: int, k: int) -> Ranked:
    """Each sentence's best 2k continuations of its beams (``scores``, (n, w)) by each beam's best tokens
    (``top_ids`` and ``top_log_probs``, (n * w, kk)), best first: the first k live ones take the beams, and the </s>
    ones among the best k end hypotheses (the module's finishing rule)."""
    (n, w), kk = scores.shape, top_ids.shape[1]
    every = (scores.reshape(-1, 1) + top_log_probs).reshape(n, w * kk)
    # Columns run beam by beam, each beam's tokens best first and equal ones by id, so among equal
    # scores the column order is the (beam, token) order: ties break as over the whole vocabulary.
    # Each beam has one </s> candidate, so the best 2k hold k live ones whenever k exist.
    flat = top_columns(every, min(2 * k, w * kk))  # (n, m)
    at = flat + np.arange(0, n * w * kk, w * kk)[:, None]  # (n, m) the candidates in the arrays flattened
    log_prob, token, own = every.reshape(-1)[at], top_ids.reshape(-1)[at], top_log_probs.reshape(-1)[at]
    # The usual step: the best k are live (finite, sorted best first, and not </s>), so they are the beams and no
    # </s> ranks among them.
    if flat.shape[1] >= k and log_prob[:, k - 1].min() > -np.inf and eos not in token[:, :k]:
        return Ranked(log_prob[:, :k], flat[:, :k] // kk, token[:, :k], own[:, :k], True, None)
    possible, is_eos = np.isfinite(log_prob), token == eos
    live = possible & ~is_eos
    live_rank = np.cumsum(live, axis=1)  # (n, m) live candidates up to each, itself included
    rows, cols = np.nonzero(live & (live_rank <= k))  # the first k live ones
    slot = live_rank[rows, cols] - 1  # (live ones,) the beam each takes
    new_scores = np.full((n, k), -np.inf)
    parents = np.zeros((n, k), dtype=np.int64)
    tokens = np.full((n, k), eos, dtype=np.int64)
    new_own = np.zeros((n, k))
    new_scores[rows, slot] = log_prob[rows, cols]
    parents[rows, slot] = flat[rows, cols] // kk
    tokens[rows, slot] = token[rows, cols]
    new_own[rows, slot] = own[rows, cols]
    all_live = rows.size == n * k
    ended = possible & is_eos
    ended[:, k:] = False  # only a </s> among the best k ends a hypothesis
    if not ended.any():
        return Ranked(new_scores, parents, tokens, new_own, all_live, None)
    rows, cols = np.nonzero(ended)
    return Ranked(new_scores, parents, tokens, new_own, all_live, (rows, flat[rows, cols] // kk, log_prob[rows, cols]))


def beam_search(
    model: StepModel[Any],
    src_ids: np.ndarray,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    max_len: int | np.ndarray | None = None,
    length_normalization: str = "gnmt",
    min_len: int = 0,
) -> list[Output]:
    """The best output per row of ``src_ids`` (batch, src_len), the first of the n-best (none found: empty, -inf)."""
    finished, history = searched(model, src_ids, beam_size, length_penalty, max_len, length_normalization, min_len)
    best = finished.best(src_ids.shape[0], 1, history)
    return [hyps[0] if hyps else Output([], -np.inf, False, []) for hyps in best]
