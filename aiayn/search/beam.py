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
    batch, k, eos = src_ids.shape[0], beam_size, model.eos_id
    limits = max_lengths(src_ids, model.pad_id, max_len)  # (batch,)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    # State rows are sentence-major: row r * k + b is beam b of the r-th active sentence.
    state = model.select(model.start(src_ids), np.repeat(np.arange(batch), k))
    active = np.arange(batch)  # (n,) the sentences still searched
    scores = np.full((batch, k), -np.inf)  # (n, k) log-probabilities of the live beams
    scores[:, 0] = 0.0  # one live beam at first, so that the beams do not start as copies
    tokens = np.zeros((batch, k, 0), dtype=np.int64)  # (n, k, length - 1)
    token_log_probs = np.zeros((batch, k, 0))  # (n, k, length - 1) each token's, as the step that chose it gave it
    last = np.full((batch * k, 1), model.bos_id, dtype=np.int64)  # (n * k, 1)
    finished_count = np.zeros(batch, dtype=np.int64)  # (batch,) each sentence's hypotheses ended by </s>
    for length in range(1, int(limits.max()) + 1):
        # A beam's share of the sentence's best 2k candidates is among that beam's own best 2k.
        top_log_probs, top_ids, state = allowed_top(model, state, last, 2 * k, length > min_len)  # (n * k, kk)
        n, kk = active.size, top_ids.shape[1]
        row = np.arange(n)[:, None]  # (n, 1) for indexing row by row
        candidates = (scores[:, :, None] + top_log_probs.reshape(n, k, kk)).reshape(n, k * kk)
        # Columns run beam by beam, each beam's tokens best first and equal ones by id, so among equal
        # scores the column order is the (beam, token) order: ties break as over the whole vocabulary.
        # Each beam has one </s> candidate, so the best 2k hold k live ones whenever k exist.
        flat = top_columns(candidates, min(2 * k, k * kk))  # (n, m)
        top = candidates[row, flat]  # (n, m)
        parent = flat // kk  # (n, m)
        token = top_ids.reshape(n, k * kk)[row, flat]  # (n, m)
        step_log_prob = top_log_probs.reshape(n, k * kk)[row, flat]  # (n, m) the candidate token's own
        possible, is_eos = np.isfinite(top), token == eos
        live = possible & ~is_eos
        live_rank = np.cumsum(live, axis=1)  # (n, m) live candidates up to each, itself included
        in_beam = live_rank - live < k  # (n, m) fewer than k live candidates better than each
        penalty = length_penalty_of(length, length_penalty, length_normalization)
        ends = possible & is_eos & in_beam  # (n, m) the </s> candidates that rank in the beam
        if ends.any():
            for r, c in zip(*np.nonzero(ends), strict=True):
                log_prob = float(top[r, c])
                own = token_log_probs[r, parent[r, c]].tolist()
                hypothesis = Hypothesis(tokens[r, parent[r, c]].tolist(), log_prob, True, own, log_prob / penalty)
                finished[active[r]].append(hypothesis)
                finished_count[active[r]] += 1
        rows, cols = np.nonzero(live & in_beam)
        slot = live_rank[rows, cols] - 1  # (live ones,) the beam each live candidate takes
        beams = np.zeros((n, k), dtype=np.int64)  # (n, k) parent of each new beam; dead ones copy beam 0
        scores = np.full((n, k), -np.inf)
        new_tokens = np.full((n, k), eos, dtype=np.int64)  # dead beams are fed </s>, their outputs ignored
        new_log_probs = np.zeros((n, k))
        beams[rows, slot] = parent[rows, cols]
        scores[rows, slot] = top[rows, cols]
        new_tokens[rows, slot] = token[rows, cols]
        new_log_probs[rows, slot] = step_log_prob[rows, cols]
        tokens = np.concatenate([tokens[row, beams], new_tokens[:, :, None]], axis=2)
        token_log_probs = np.concatenate([token_log_probs[row, beams], new_log_probs[:, :, None]], axis=2)

        at_limit = limits[active] <= length  # (n,)
        if at_limit.any():
            for r in np.flatnonzero(at_limit):
                live_beams = np.flatnonzero(np.isfinite(scores[r]))
                finished[active[r]] += [
                    Hypothesis(
                        tokens[r, b].tolist(),
                        float(scores[r, b]),
                        False,
                        token_log_probs[r, b].tolist(),
                        float(scores[r, b] / penalty),
                    )
                    for b in live_beams
                ]
        going = ~at_limit & (finished_count[active] < k) & np.isfinite(scores[:, 0])  # (n,) slot 0 is live if any is
        if not going.any():
            break
        state = model.select(state, (np.flatnonzero(going)[:, None] * k + beams[going]).reshape(-1))
        active, scores, tokens, token_log_probs = active[going], scores[going], tokens[going], token_log_probs[going]
        last = tokens[:, :, -1].reshape(-1, 1)
    return [sorted(hyps, key=lambda h: -h.score)[:k] for hyps in finished]


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
