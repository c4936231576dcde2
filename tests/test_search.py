"""The one NumPy search against a toy step model: greedy, beam = greedy at size 1, beam = exhaustive search."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from aiayn.search.beam import beam_search, length_penalty
from aiayn.search.greedy import greedy_search

BOS, EOS, PAD = 2, 3, 0


@dataclass(frozen=True)
class ToyState:
    prefixes: list[list[int]]  # fed tokens per row
    sources: list[int]  # a per-row number that conditions the table


class ToyModel:
    """Log-probabilities from a fixed random table keyed by (source, last token, position)."""

    bos_id, eos_id, pad_id = BOS, EOS, PAD

    def __init__(self, vocab: int, seed: int) -> None:
        self.vocab = vocab
        rng = np.random.default_rng(seed)
        logits = rng.normal(size=(8, vocab, 12, vocab)) * 2
        logits[..., [PAD, BOS]] = -np.inf  # never generated
        self.table = logits - np.log(np.exp(logits).sum(-1, keepdims=True))

    def start(self, src_ids: np.ndarray) -> ToyState:
        return ToyState([[] for _ in src_ids], [int(row[0]) % 8 for row in src_ids])

    def step(self, state: ToyState, tgt_ids: np.ndarray) -> tuple[np.ndarray, ToyState]:
        prefixes = [p + list(t) for p, t in zip(state.prefixes, tgt_ids.tolist(), strict=True)]
        rows = [self.table[s, p[-1], (len(p) - 1) % 12] for s, p in zip(state.sources, prefixes, strict=True)]
        return np.stack(rows).astype(np.float32), ToyState(prefixes, state.sources)

    def select(self, state: ToyState, rows: np.ndarray) -> ToyState:
        return ToyState([list(state.prefixes[r]) for r in rows], [state.sources[r] for r in rows])

    def score(self, source: int, output: list[int]) -> float:
        """log P(output </s>) under the table."""
        tokens, total = [BOS, *output, EOS], 0.0
        for position in range(len(tokens) - 1):
            total += self.table[source, tokens[position], position % 12, tokens[position + 1]]
        return float(total)


def sources(*firsts: int, length: int = 3) -> np.ndarray:
    return np.array([[f] + [5] * (length - 2) + [EOS] for f in firsts])


def test_greedy_takes_the_argmax_and_stops_at_eos() -> None:
    model = ToyModel(vocab=9, seed=0)
    out = greedy_search(model, sources(4), max_len=10)[0]
    assert EOS not in out and len(out) <= 10
    prefix = [BOS]
    for token in out + [EOS]:
        if len(prefix) > 10:
            break
        assert token == int(model.table[4 % 8, prefix[-1], len(prefix) - 1].argmax())
        prefix.append(token)


def test_beam_of_one_is_greedy() -> None:
    for seed in range(5):
        model = ToyModel(vocab=9, seed=seed)
        src = sources(4, 5, 6, 7)
        assert beam_search(model, src, beam_size=1, max_len=8) == greedy_search(model, src, max_len=8)


@pytest.mark.parametrize("seed", range(6))
def test_a_wide_beam_finds_the_exhaustive_optimum(seed: int) -> None:
    vocab, max_len, alpha = 6, 4, 0.6
    model = ToyModel(vocab=vocab, seed=seed)
    words = [t for t in range(vocab) if t not in (PAD, BOS, EOS)]
    best = max(
        (
            (model.score(1, list(out)) / length_penalty(len(out) + 1, alpha), list(out))
            for n in range(max_len)
            for out in itertools.product(words, repeat=n)
        ),
        key=lambda pair: pair[0],
    )
    found = beam_search(model, sources(1), beam_size=len(words) ** max_len, alpha=alpha, max_len=max_len)[0]
    # At the limit the search finishes its live beams as they are, so compare with the best of both kinds.
    score = model.score(1, found) / length_penalty(len(found) + 1, alpha)
    assert score >= best[0] - 1e-5 or len(found) == max_len


def test_beam_beats_greedy_on_the_length_penalised_score() -> None:
    wins = 0
    for seed in range(20):
        model = ToyModel(vocab=9, seed=seed)
        greedy = greedy_search(model, sources(2), max_len=6)[0]
        beam = beam_search(model, sources(2), beam_size=4, max_len=6)[0]
        g = model.score(2, greedy) / length_penalty(len(greedy) + 1, 0.6)
        b = model.score(2, beam) / length_penalty(len(beam) + 1, 0.6)
        wins += b > g + 1e-6
        assert b >= g - 1e-6 or len(greedy) == 6
    assert wins > 0


def test_batched_search_equals_one_sentence_at_a_time() -> None:
    model = ToyModel(vocab=9, seed=3)
    src = np.array([[4, 5, 6, EOS], [5, EOS, PAD, PAD], [6, 7, EOS, PAD]])
    for search in (greedy_search, beam_search):
        batched = search(model, src)
        single = [search(model, src[i : i + 1, : int((src[i] != PAD).sum())])[0] for i in range(3)]
        assert batched == single


def test_default_max_len_is_source_length_plus_50() -> None:
    class NeverEnds(ToyModel):
        def step(self, state: ToyState, tgt_ids: np.ndarray) -> tuple[np.ndarray, ToyState]:
            log_probs, state = super().step(state, tgt_ids)
            log_probs[:, EOS] = -np.inf
            return log_probs, state

    model = NeverEnds(vocab=7, seed=0)
    src = np.array([[4, 5, EOS], [4, EOS, PAD]])
    assert [len(o) for o in greedy_search(model, src)] == [53, 52]
    assert [len(o) for o in beam_search(model, src, beam_size=2)] == [53, 52]
