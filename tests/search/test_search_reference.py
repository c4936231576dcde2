"""The NumPy search against a straightforward one: each sentence alone, every candidate of the whole vocabulary
ranked in Python, on seeded step models full of ties, -inf, banned ids and </s> (the searches' outputs must be
identical, not close: the same ids, the same floats, the same hypotheses in the same order)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from aiayn.search import beam_search_nbest, greedy_search, length_penalty_of
from aiayn.search.step import FullDistributionStep

PAD, BOS, EOS = 0, 1, 2


@dataclass(frozen=True)
class Tied(FullDistributionStep[list[list[int]]]):
    """Log-probabilities seeded by each row's prefix, rounded to few levels (ties everywhere), some -inf."""

    vocab: int
    seed: int
    levels: float
    impossible: float
    never_generate: tuple[int, ...] = ()
    bos_id, eos_id, pad_id = BOS, EOS, PAD

    def row(self, prefix: list[int]) -> np.ndarray:
        """(vocab,) float32 after ``prefix`` (<s> first)."""
        rng = np.random.default_rng(zlib.crc32(repr((self.seed, prefix)).encode()))
        values = np.round(rng.normal(size=self.vocab) * self.levels) / self.levels - 3
        values[rng.random(self.vocab) < self.impossible] = -np.inf
        return values.astype(np.float32)

    def start(self, src_ids: np.ndarray) -> list[list[int]]:
        return [[] for _ in range(src_ids.shape[0])]

    def step(self, state: list[list[int]], tgt_ids: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
        state = [prefix + [int(t)] for prefix, t in zip(state, tgt_ids[:, 0], strict=True)]
        return np.stack([self.row(prefix) for prefix in state]), state

    def select(self, state: list[list[int]], rows: np.ndarray) -> list[list[int]]:
        return [state[i] for i in rows]


def banned_at(model: Tied, length: int, min_len: int) -> set[int]:
    return {*model.never_generate, *([] if length > min_len else [EOS])}


def reference_greedy(model: Tied, limit: int, min_len: int) -> tuple[list[int], float, bool, list[float]]:
    """The best allowed token each step (ties to the lower id) until </s> or ``limit``."""
    tokens: list[int] = []
    own: list[float] = []
    total = 0.0
    for length in range(1, limit + 1):
        values = model.row([BOS, *tokens])
        banned = banned_at(model, length, min_len)
        token = min((i for i in range(model.vocab) if i not in banned), key=lambda i: (-values[i], i))
        total += float(values[token])
        if token == EOS:
            return tokens, total, True, own
        tokens.append(token)
        own.append(float(values[token]))
    return tokens, total, False, own


def reference_beam(
    model: Tied, k: int, limit: int, min_len: int, alpha: float, normalization: str
) -> list[tuple[list[int], float, bool, list[float], float]]:
    """fairseq's finishing and stopping rules as beam.py states them, one sentence: every allowed (beam, token) of
    the vocabulary ranked by its log-probability, then beam, then id; a </s> ranked among the best k ends a
    hypothesis, any other is dropped, and the first k live ones are the beams."""
    beams: list[tuple[list[int], list[float], float]] = [([], [], 0.0)]  # the live ones: tokens, own, log-prob
    finished: list[tuple[list[int], float, bool, list[float], float]] = []
    ended = 0
    for length in range(1, limit + 1):
        lp = length_penalty_of(length, alpha, normalization)
        banned = banned_at(model, length, min_len)
        candidates = []
        for b, (tokens, _, score) in enumerate(beams):
            values = model.row([BOS, *tokens])
            candidates += [(score + float(values[i]), b, i, float(values[i])) for i in range(model.vocab)]
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        allowed = [c for c in candidates if c[2] not in banned]
        taken: list[tuple[list[int], list[float], float]] = []
        for rank, (total, b, token, value) in enumerate(allowed):
            if len(taken) == k or not np.isfinite(total):
                break
            tokens, own, _ = beams[b]
            if token == EOS:
                if rank < k:
                    finished.append((tokens, total, True, own, total / lp))
                    ended += 1
            else:
                taken.append(([*tokens, token], [*own, value], total))
        beams = taken
        if length == limit:
            finished += [(tokens, score, False, own, score / lp) for tokens, own, score in beams]
        if length == limit or ended >= k or not beams:
            break
    return sorted(finished, key=lambda h: -h[4])[:k]


def models(count: int) -> list[tuple[Tied, int, int, int]]:
    """(model, sentences' limit, min_len, beam) seeded: small vocabularies, ties, banned ids (of the vocabulary:
    ``allowed_top`` counts each as one column it leaves out), -inf."""
    rng = np.random.default_rng(70)
    chosen = []
    for seed in range(count):
        vocab = int(rng.choice([3, 5, 8, 30]))
        banned = tuple(
            int(b) for b in rng.choice([PAD, 3, 4], size=int(rng.integers(0, 3)), replace=False) if b < vocab
        )
        model = Tied(vocab, seed, float(rng.choice([1, 2, 50])), float(rng.choice([0, 0.3, 0.8])), banned)
        chosen.append((model, int(rng.integers(1, 9)), int(rng.integers(0, 3)), int(rng.integers(1, 6))))
    return chosen


@pytest.mark.parametrize("alpha,normalization", [(0.6, "gnmt"), (1.0, "power")])
def test_the_beam_is_the_straightforward_one_to_the_bit(alpha: float, normalization: str) -> None:
    for model, limit, min_len, k in models(120):
        # Sentences of one batch share the model: each row's log-probabilities depend on its prefix only.
        src = np.full((3, 2), 7)
        limits = np.array([limit, max(1, limit - 2), limit + 1])
        got = beam_search_nbest(model, src, k, alpha, limits, normalization, min_len)
        for sentence_limit, hypotheses in zip(limits.tolist(), got, strict=True):
            want = reference_beam(model, k, sentence_limit, min_len, alpha, normalization)
            assert [(h.tokens, h.log_prob, h.ended, h.token_log_probs, h.score) for h in hypotheses] == want


def test_greedy_is_the_straightforward_one_to_the_bit() -> None:
    for model, limit, min_len, _ in models(120):
        limits = np.array([limit, max(1, limit - 2), limit + 1])
        got = greedy_search(model, np.full((3, 2), 7), limits, min_len)
        want = [reference_greedy(model, n, min_len) for n in limits.tolist()]
        assert [(o.tokens, o.log_prob, o.ended, o.token_log_probs) for o in got] == want
