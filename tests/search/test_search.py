"""The one NumPy search against a toy step model: greedy, beam 1 = greedy, a wide beam = exhaustive search."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from aiayn.search import (
    Output,
    beam_search,
    beam_search_nbest,
    greedy_search,
    length_penalty_of,
    max_lengths,
    mean_log_prob,
)
from aiayn.search.step import FullDistributionStep, allowed_top, top_columns
from aiayn.search.translator import SearchSettings, Translator

PAD, BOS, EOS = 0, 1, 2
KEYS, POSITIONS = 5, 7


@dataclass(frozen=True)
class ToyState:
    """What a real engine keeps as its KV cache: here just the fed tokens and the source key per row."""

    prefixes: list[list[int]]
    keys: list[int]


class ToyModel(FullDistributionStep[ToyState]):
    """Log-probabilities from a fixed table indexed by (source key, last token, position, next token).

    It checks what the search feeds it: one token per step, <s> first and only
    first, never <pad>, nothing after </s>; and it records the rows per step.
    """

    bos_id, eos_id, pad_id = BOS, EOS, PAD
    never_generate: tuple[int, ...] = ()

    def __init__(self, table: np.ndarray) -> None:
        self.table = table.astype(np.float32)  # (keys, vocab, positions, vocab)
        self.rows_per_step: list[int] = []

    @classmethod
    def random(cls, vocab: int, seed: int) -> ToyModel:
        logits = np.random.default_rng(seed).normal(size=(KEYS, vocab, POSITIONS, vocab)) * 2
        logits[..., [PAD, BOS]] = -np.inf  # never generated, as a real engine could mask them
        return cls(logits - np.log(np.exp(logits).sum(-1, keepdims=True)))

    @classmethod
    def from_weights(cls, weights: np.ndarray) -> ToyModel:
        """Normalise non-negative weights (keys, vocab, positions, vocab); <pad> and <s> get none."""
        weights = weights.copy()
        weights[..., [PAD, BOS]] = 0.0
        with np.errstate(divide="ignore"):
            return cls(np.log(weights / weights.sum(-1, keepdims=True)))

    @staticmethod
    def key(src_row: np.ndarray) -> int:
        return int(src_row[src_row != PAD].sum()) % KEYS

    def start(self, src_ids: np.ndarray) -> ToyState:
        return ToyState([[] for _ in src_ids], [self.key(row) for row in src_ids])

    def step(self, state: ToyState, tgt_ids: np.ndarray) -> tuple[np.ndarray, ToyState]:
        assert tgt_ids.shape == (len(state.prefixes), 1) and tgt_ids.dtype == np.int64
        prefixes = [p + t for p, t in zip(state.prefixes, tgt_ids.tolist(), strict=True)]
        for p in prefixes:
            assert p[0] == BOS and BOS not in p[1:] and PAD not in p and EOS not in p[:-1], p
        self.rows_per_step.append(len(prefixes))
        log_probs = [self.table[k, p[-1], (len(p) - 1) % POSITIONS] for k, p in zip(state.keys, prefixes, strict=True)]
        return np.stack(log_probs), ToyState(prefixes, state.keys)

    def select(self, state: ToyState, rows: np.ndarray) -> ToyState:
        return ToyState([list(state.prefixes[r]) for r in rows], [state.keys[r] for r in rows])

    def log_prob(self, key: int, output: list[int], ended: bool = True) -> float:
        """log P(output, then </s> if ``ended``), summed in the search's order."""
        tokens, total = [BOS, *output, *([EOS] if ended else [])], 0.0
        for position in range(len(tokens) - 1):
            total += float(self.table[key, tokens[position], position % POSITIONS, tokens[position + 1]])
        return total


def score(model: ToyModel, key: int, output: list[int], ended: bool, alpha: float) -> float:
    return model.log_prob(key, output, ended) / length_penalty_of(len(output) + ended, alpha)


def source(*tokens: int) -> np.ndarray:
    return np.array([[*tokens, EOS]])


def test_greedy_takes_the_argmax_and_stops_at_eos() -> None:
    for seed in range(10):
        model = ToyModel.random(vocab=8, seed=seed)
        src = source(3, 4)
        out = greedy_search(model, src, max_len=12)[0].tokens
        key, prefix = ToyModel.key(src[0]), [BOS]
        for token in out:
            assert token == model.table[key, prefix[-1], (len(prefix) - 1) % POSITIONS].argmax()
            prefix.append(token)
        if len(out) < 12:  # it stopped because </s> was the argmax
            assert model.table[key, prefix[-1], (len(prefix) - 1) % POSITIONS].argmax() == EOS


def test_beam_of_one_is_greedy() -> None:
    src = np.array([[3, 4, 5, EOS], [6, EOS, PAD, PAD], [4, 4, EOS, PAD]])
    for seed in range(10):
        model = ToyModel.random(vocab=9, seed=seed)
        for max_len in (1, 3, 9, None):
            beam, greedy = beam_search(model, src, beam_size=1, max_len=max_len), greedy_search(model, src, max_len)
            assert [o.tokens for o in beam] == [o.tokens for o in greedy]
            assert [o.ended for o in beam] == [o.ended for o in greedy]
            np.testing.assert_allclose([o.log_prob for o in beam], [o.log_prob for o in greedy], rtol=1e-9)


def test_beam_escapes_the_greedy_trap() -> None:
    vocab, a, b = 6, 3, 4
    table = np.full((KEYS, vocab, POSITIONS, vocab), 1e-3)
    table[:, :, :, EOS] = 1.0  # by default, stop
    table[:, BOS, 0, [a, b, EOS]] = [0.5, 0.4, 0.1]  # greedy takes a ...
    table[:, a, 1, [EOS, a, b, 5]] = [0.3, 0.25, 0.25, 0.2]  # ... which leads nowhere sure
    table[:, b, 1, EOS] = 50.0  # while b is almost surely followed by </s>
    model = ToyModel.from_weights(table)
    greedy, beam = greedy_search(model, source(3))[0].tokens, beam_search(model, source(3), beam_size=2)[0].tokens
    assert greedy == [a] and beam == [b]
    key = ToyModel.key(source(3)[0])
    assert score(model, key, beam, True, 0.6) > score(model, key, greedy, True, 0.6) + 0.5


def test_an_early_eos_does_not_take_a_live_beams_place() -> None:
    vocab, a, b = 6, 3, 4
    table = np.full((KEYS, vocab, POSITIONS, vocab), 1.0)
    table[:, BOS, 0, [EOS, a, b, 5]] = [0.4, 0.3, 0.25, 0.05]
    table[:, b, 1, EOS] = 100.0
    model = ToyModel.from_weights(table)
    nbest = beam_search_nbest(model, source(3), beam_size=2)[0]
    assert [h.tokens for h in nbest] == [[], [b]]


def test_only_an_eos_among_the_best_k_ends_a_hypothesis() -> None:
    """fairseq's, generate's and CTranslate2's finishing rule: beam 2, whose second step ranks <s> a </s>, then the
    live <s> a 5, then <s> b </s> third. That </s> has one live candidate above it, fewer than k, but ranks below the
    best k, so it is dropped; <s> b a takes the second beam and the search goes on to finish <s> a 5 </s>."""
    vocab, a, b, c = 6, 3, 4, 5
    table = np.full((KEYS, vocab, POSITIONS, vocab), 1e-3)
    table[..., EOS] = 1.0  # by default, stop
    table[:, BOS, 0, [a, b, EOS, c]] = [0.6, 0.2, 0.1, 0.1]
    table[:, a, 1, [EOS, c, a, b]] = [0.6, 0.3, 0.05, 0.05]  # <s> a </s>: 0.36, <s> a 5: 0.18
    table[:, b, 1, [EOS, a, b, c]] = [0.4, 0.2, 0.2, 0.2]  # <s> b </s>: 0.08, third
    model = ToyModel.from_weights(table)
    nbest = beam_search_nbest(model, source(3), beam_size=2)[0]
    assert [h.tokens for h in nbest] == [[a], [a, c]]
    assert model.rows_per_step == [1, 2, 2]  # the third step is searched: <s> b </s> did not make 2 finished


def test_top_columns_breaks_ties_by_the_lower_index() -> None:
    scores = np.array([[1.0, 3.0, 3.0, 0.0, 3.0, 2.0], [-np.inf, -np.inf, 0.5, -np.inf, -np.inf, -np.inf]])
    assert top_columns(scores, 2).tolist() == [[1, 2], [2, 0]]
    assert top_columns(scores, 4).tolist() == [[1, 2, 4, 5], [2, 0, 1, 3]]


class WholeVocabularyModel(ToyModel):
    """Returns every token from ``step_top``, whatever k: the search then ranks all k × vocab candidates."""

    def step_top(self, state: ToyState, tgt_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, ToyState]:
        return super().step_top(state, tgt_ids, self.table.shape[-1])


@pytest.mark.parametrize("columns", [6, 40, 1000])
def test_top_columns_is_the_stable_ranking_at_any_width(columns: int) -> None:
    """Narrow rows are sorted, wide ones partitioned first (with or without ties at the cut): same answer."""
    rng = np.random.default_rng(columns)
    for values in (rng.normal(size=(5, columns)), np.round(rng.normal(size=(5, columns)))):
        for m in (1, 3, 8):
            assert np.array_equal(top_columns(values, m), np.argsort(-values, axis=1, kind="stable")[:, :m])


@pytest.mark.parametrize("seed", range(8))
def test_each_beams_best_2k_give_the_same_search_as_the_whole_vocabulary(seed: int) -> None:
    """Beam search takes only each beam's 2k best tokens; with many exact ties, nothing changes."""
    logits = np.round(np.random.default_rng(seed).normal(size=(KEYS, 9, POSITIONS, 9)))  # few distinct values
    logits[..., [PAD, BOS]] = -np.inf
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    src = np.array([[3, 4, 5, EOS], [6, EOS, PAD, PAD], [4, 4, EOS, PAD], [7, EOS, PAD, PAD]])
    for beam in (1, 2, 3, 5):
        reduced = beam_search_nbest(ToyModel(log_probs), src, beam_size=beam, max_len=8)
        whole = beam_search_nbest(WholeVocabularyModel(log_probs), src, beam_size=beam, max_len=8)
        assert reduced == whole


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("seed", range(6))
def test_a_wide_beam_is_exhaustive_search(seed: int, alpha: float) -> None:
    """With a beam as wide as all outputs, nothing is pruned: the n-best is the exact ranking."""
    vocab, max_len = 6, 4
    model = ToyModel.random(vocab=vocab, seed=seed)
    src = source(3, 5)
    key = ToyModel.key(src[0])
    words = range(EOS + 1, vocab)
    ended = [list(o) for n in range(max_len) for o in itertools.product(words, repeat=n)]
    cut = [list(o) for o in itertools.product(words, repeat=max_len)]  # finished at the limit, without </s>
    every = [(score(model, key, o, True, alpha), o) for o in ended]
    every += [(score(model, key, o, False, alpha), o) for o in cut]
    every.sort(key=lambda pair: -pair[0])
    beam = len(words) ** max_len
    nbest = beam_search_nbest(model, src, beam_size=beam, length_penalty=alpha, max_len=max_len)[0]
    assert [h.tokens for h in nbest] == [o for _, o in every[:beam]]
    np.testing.assert_allclose([h.score for h in nbest], [s for s, _ in every[:beam]], rtol=1e-6)
    assert beam_search(model, src, beam_size=beam, length_penalty=alpha, max_len=max_len)[0].tokens == every[0][1]


def test_nbest_scores_are_the_model_scores() -> None:
    model = ToyModel.random(vocab=9, seed=4)
    src = np.array([[3, 4, 5, EOS], [6, EOS, PAD, PAD]])
    for row, hyps in zip(src, beam_search_nbest(model, src, beam_size=4, max_len=5), strict=True):
        assert 1 <= len(hyps) <= 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:  # an output ends with </s> unless it was cut at the limit
            ended = len(h.tokens) < 5
            assert h.score == pytest.approx(score(model, ToyModel.key(row), h.tokens, ended, 0.6))


@pytest.mark.parametrize("beam", [1, 2, 4])
def test_each_output_carries_its_log_probability(beam: int) -> None:
    """The raw sum of the output's log-probabilities, </s>'s included when it ended, whatever the length penalty;
    the mean per token divides by the tokens scored; each token's own is the model's for it after its prefix."""
    src = np.array([[3, 4, 5, EOS], [6, EOS, PAD, PAD], [4, 4, EOS, PAD]])
    for seed in range(6):
        model = ToyModel.random(vocab=9, seed=seed)
        for max_len in (2, 5, None):
            if beam == 1:
                outputs = greedy_search(model, src, max_len)
            else:
                outputs = beam_search(model, src, beam, length_penalty=1.5, max_len=max_len)
            limits = max_lengths(src, PAD, max_len)
            for row, out, limit in zip(src, outputs, limits, strict=True):
                assert out.ended == (len(out.tokens) < limit)
                expected = model.log_prob(ToyModel.key(row), out.tokens, out.ended)
                assert out.log_prob == pytest.approx(expected, rel=1e-6)
                assert mean_log_prob([out]) == pytest.approx(expected / (len(out.tokens) + out.ended), rel=1e-6)
                key, before = ToyModel.key(row), [BOS, *out.tokens]
                own = [model.table[key, before[i], i % POSITIONS, token] for i, token in enumerate(out.tokens)]
                assert out.token_log_probs == pytest.approx(own, rel=1e-6)
    pieces = [Output([5, 6], -3.0, True, [-1.0, -1.0]), Output([7], -1.0, False, [-1.0])]
    assert mean_log_prob(pieces) == -1.0  # pieces pooled


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_a_padded_batch_equals_one_sentence_at_a_time(search: Callable[..., list[Output]]) -> None:
    src = np.array([[3, 4, 5, 6, EOS], [5, EOS, PAD, PAD, PAD], [6, 3, EOS, PAD, PAD], [4, EOS, 0, 0, 0]])
    for seed in range(5):
        model = ToyModel.random(vocab=9, seed=seed)
        for max_len in (None, 4, np.array([2, 7, 1, 5])):
            batched = search(model, src, max_len=max_len)
            limits = np.broadcast_to(max_len, (4,)) if max_len is not None else [None] * 4
            unpadded = [src[i : i + 1, : int((src[i] != PAD).sum())] for i in range(4)]
            single = [search(model, one, max_len=limit)[0] for one, limit in zip(unpadded, limits, strict=True)]
            assert batched == single


class NeverEnds(ToyModel):
    """A model that never gives </s>: every output runs to its limit."""

    def step(self, state: ToyState, tgt_ids: np.ndarray) -> tuple[np.ndarray, ToyState]:
        log_probs, state = super().step(state, tgt_ids)
        log_probs[:, EOS] = -np.inf
        return log_probs, state


def test_default_max_len_is_the_real_source_length_plus_50() -> None:
    model = NeverEnds(ToyModel.random(vocab=7, seed=0).table)
    src = np.array([[4, 5, EOS], [4, EOS, PAD]])
    assert [len(o.tokens) for o in greedy_search(model, src)] == [53, 52]
    assert [len(o.tokens) for o in beam_search(model, src, beam_size=3)] == [53, 52]
    assert [len(o.tokens) for o in beam_search(model, src, beam_size=2, max_len=np.array([4, 9]))] == [4, 9]


def test_outputs_respect_max_len_and_hold_no_special_tokens() -> None:
    src = np.array([[3, 4, 5, EOS], [6, EOS, PAD, PAD]])
    for seed in range(10):
        model = ToyModel.random(vocab=8, seed=seed)
        for max_len in (1, 2, 6):
            for out in greedy_search(model, src, max_len) + beam_search(model, src, 3, max_len=max_len):
                assert len(out.tokens) <= max_len and not {PAD, BOS, EOS} & set(out.tokens)


def test_done_sentences_leave_the_state() -> None:
    model = NeverEnds(ToyModel.random(vocab=7, seed=0).table)
    greedy_search(model, np.array([[4, EOS], [5, EOS]]), max_len=np.array([2, 6]))
    assert model.rows_per_step == [2, 2, 1, 1, 1, 1]
    model.rows_per_step.clear()
    beam_search(model, np.array([[4, EOS], [5, EOS]]), beam_size=3, max_len=np.array([2, 4]))
    assert model.rows_per_step == [2, 6, 3, 3]  # the first step on one row per sentence, then 3 beams each


def test_bad_settings_are_refused() -> None:
    model = ToyModel.random(vocab=7, seed=0)
    for beam_size in (0, 9):  # the one check of a beam size: the search's settings
        with pytest.raises(ValueError, match=f"beam size must be a whole number from 1 to 8, got {beam_size}"):
            SearchSettings(beam_size=beam_size)
    with pytest.raises(ValueError, match="max_len"):
        greedy_search(model, source(3), max_len=0)


class EndsAtOnce(ToyModel):
    """A model whose best next token is always </s>: every output is empty unless </s> is held back."""

    def step(self, state: ToyState, tgt_ids: np.ndarray) -> tuple[np.ndarray, ToyState]:
        log_probs, state = super().step(state, tgt_ids)
        log_probs[:, EOS] = 0.0
        return log_probs, state


@pytest.mark.parametrize("beam", [1, 3])
def test_min_len_holds_eos_back_until_the_output_is_that_long(beam: int) -> None:
    model = EndsAtOnce(ToyModel.random(vocab=7, seed=0).table)
    src = np.array([[4, 5, EOS], [4, EOS, PAD]])

    def search(max_len: int, min_len: int) -> list[Output]:
        if beam == 1:
            return greedy_search(model, src, max_len, min_len)
        return beam_search(model, src, beam, max_len=max_len, min_len=min_len)

    assert [len(o.tokens) for o in search(20, 0)] == [0, 0]
    for min_len in (1, 4):
        outputs = search(20, min_len)
        assert [len(o.tokens) for o in outputs] == [min_len, min_len] and all(o.ended for o in outputs)
    fixed = search(6, 6)  # equal bounds: a fixed length, cut there
    assert [len(o.tokens) for o in fixed] == [6, 6] and not any(o.ended for o in fixed)


class WordLengths:
    """A word's id is 3 + its length mod 4, then </s>; ids decode to their numbers."""

    def encode_source(self, text: str) -> list[int]:
        return [3 + len(word) % 4 for word in text.split()] + [EOS]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))


def test_search_settings_bound_every_output_whatever_its_input() -> None:
    translator = Translator(NeverEnds(ToyModel.random(vocab=7, seed=1).table), WordLengths(), 100)
    sources = [translator.source_ids(text) for text in ("a bb ccc", "dddd", "e f g h i j k")]
    for beam in (1, 3):
        lengths = [len(ids) for ids in translator.translate_ids(sources, SearchSettings(beam, max_len=5))]
        assert lengths == [5, 5, 5]
    with pytest.raises(ValueError, match="min_len"):
        SearchSettings(min_len=-1)
    with pytest.raises(ValueError, match="max_len must be at least 1 and at least min_len"):
        SearchSettings(min_len=4, max_len=3)


def test_a_length_batch_nobody_waits_for_any_more_is_not_searched() -> None:
    translator = Translator(NeverEnds(ToyModel.random(vocab=7, seed=1).table), WordLengths(), 100, max_sentences=1)
    sources = [translator.source_ids(text) for text in ("a bb ccc", "dddd", "e f g h i j k")]
    asked: list[bool] = []

    def wanted() -> bool:  # only the first length batch (the longest source) is still awaited
        asked.append(not asked)
        return asked[-1]

    outputs = translator.outputs(sources, SearchSettings(1, max_len=5), wanted=wanted)
    assert outputs[:2] == [Output([], 0.0, False, [])] * 2  # not searched: nothing, unended, of no probability
    assert len(outputs[2].tokens) == 5 and asked == [True, False, False]
    assert [len(o.tokens) for o in translator.outputs(sources, SearchSettings(1, max_len=5))] == [5, 5, 5]


def test_without_settings_a_search_is_the_papers_beam_4_and_alpha_0_6() -> None:
    """Defaults by behaviour, not by signature: other beams and α change some outputs of these random models."""
    models = [ToyModel.random(vocab=9, seed=seed) for seed in range(40)]
    src = source(3, 4)

    def outputs(**settings: float) -> list[list[int]]:
        return [beam_search(model, src, max_len=6, **settings)[0].tokens for model in models]  # type: ignore[arg-type]

    def nbest(**settings: float) -> list[list[list[int]]]:
        found = [beam_search_nbest(model, src, max_len=6, **settings)[0] for model in models]  # type: ignore[arg-type]
        return [[h.tokens for h in hyps] for hyps in found]

    papers = outputs(beam_size=4, length_penalty=0.6)
    assert outputs() == papers and outputs(beam_size=5) != papers and outputs(length_penalty=1.6) != papers
    assert nbest() == nbest(beam_size=4, length_penalty=0.6) != nbest(beam_size=5)


def test_a_sentence_with_no_possible_output_gets_an_empty_impossible_one() -> None:
    model = ToyModel(np.full((KEYS, 6, POSITIONS, 6), -np.inf))  # every next token impossible, </s> too
    assert beam_search_nbest(model, source(3), beam_size=3) == [[]]
    assert beam_search(model, source(3), beam_size=3) == [Output([], -np.inf, False, [])]


def test_a_beam_with_a_single_possible_candidate_goes_on() -> None:
    """One live candidate a step: it keeps the first beam, the others stay dead, and the search goes on."""
    vocab, a, b = 6, 3, 4
    table = np.zeros((KEYS, vocab, POSITIONS, vocab))
    table[..., EOS] = 1.0
    table[:, BOS, 0], table[:, a, 1] = np.eye(vocab)[a], np.eye(vocab)[b]  # only <s> a b </s>
    for beam in (2, 3):
        model = ToyModel.from_weights(table)
        (found,) = beam_search(model, source(3), beam)
        assert (found.tokens, found.log_prob, found.ended, found.token_log_probs) == ([a, b], 0.0, True, [0.0, 0.0])
        assert model.rows_per_step == [1, beam, beam]  # one row on the first step, then the beam whole
        assert [[h.tokens for h in hyps] for hyps in beam_search_nbest(model, source(3), beam)] == [[[a, b]]]


def test_a_sentence_stops_once_it_holds_beam_size_finished_hypotheses() -> None:
    """fairseq's rule, not the exact bound: with beam 1, </s> at the first step ends the search, though the live
    beam beside it would have finished with a better score under a large length penalty."""
    vocab, a = 6, 3
    table = np.full((KEYS, vocab, POSITIONS, vocab), 1e-3)
    table[:, :, :, EOS] = 1.0
    table[:, BOS, 0, [EOS, a, 4, 5]] = [0.5, 0.45, 0.03, 0.02]
    model = ToyModel.from_weights(table)
    key = ToyModel.key(source(3)[0])
    assert score(model, key, [a], True, 2.0) > score(model, key, [], True, 2.0)  # the better one, never reached
    assert [h.tokens for h in beam_search_nbest(model, source(3), 1, length_penalty=2.0)[0]] == [[]]
    assert model.rows_per_step == [1]


@pytest.mark.parametrize("normalization", ["gnmt", "power"])
def test_nbest_scores_divide_by_the_chosen_length_penalty(normalization: str) -> None:
    model = ToyModel.random(vocab=9, seed=4)
    for hyps in beam_search_nbest(model, source(3, 4), 4, 1.5, max_len=5, length_normalization=normalization):
        for h in hyps:
            length = len(h.tokens) + h.ended
            assert h.score == pytest.approx(h.log_prob / length_penalty_of(length, 1.5, normalization))
    gnmt, power = (beam_search_nbest(model, source(3, 4), 4, 1.5, 5, n)[0] for n in ("gnmt", "power"))
    assert [h.score for h in gnmt] != [h.score for h in power]


class Fixed(FullDistributionStep[None]):
    """The same log-probabilities for every row and step; some ids never generated."""

    bos_id, eos_id, pad_id = BOS, EOS, PAD
    never_generate: tuple[int, ...]

    def __init__(self, log_probs: Sequence[float], never_generate: tuple[int, ...]) -> None:
        self.log_probs, self.never_generate = np.array([log_probs], dtype=np.float32), never_generate

    def start(self, src_ids: np.ndarray) -> None:
        return None

    def select(self, state: None, rows: np.ndarray) -> None:
        return state

    def step(self, state: None, tgt_ids: np.ndarray) -> tuple[np.ndarray, None]:
        return np.repeat(self.log_probs, len(tgt_ids), axis=0), state


def test_allowed_top_leaves_out_the_banned_ids_and_keeps_the_others_best_first() -> None:
    model = Fixed([-3.0, -9.0, -1.0, -0.5, -2.0, -4.0], never_generate=(3,))  # the best, 3, is never generated
    last = np.full((2, 1), BOS)

    def top(k: int, end_allowed: bool = True) -> tuple[list[list[float]], list[list[int]]]:
        log_probs, ids, _ = allowed_top(model, None, last, k, end_allowed)
        return log_probs.tolist(), ids.tolist()

    assert top(2) == ([[-1.0, -2.0]] * 2, [[2, 4]] * 2)
    assert top(2, end_allowed=False) == ([[-2.0, -3.0]] * 2, [[4, 0]] * 2)  # nor </s>
    assert top(6)[1] == [[2, 4, 0, 5, 1]] * 2  # more than the allowed ones: all of them
    wide = Fixed(list(-0.1 * np.arange(40)), never_generate=(5, 17, 30))  # a wide k: the order stays stable
    ids = allowed_top(wide, None, last, 36)[1]
    assert ids.tolist() == [[i for i in range(40) if i not in (5, 17, 30)][:36]] * 2


def test_top_columns_takes_the_leftmost_of_ties_in_every_wide_row() -> None:
    """Every row tied at its cut (the partition path's tie-aware choice): the leftmost tied columns."""
    values = np.random.default_rng(0).integers(0, 2, size=(5, 300)).astype(float)
    for m in (3, 8):
        assert np.array_equal(top_columns(values, m), np.argsort(-values, axis=1, kind="stable")[:, :m])


class LaneThreads(ToyModel):
    """Records the thread that starts each search, and the most searches starting at once (each start lingers, so
    that the other lanes' starts overlap it)."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__(table)
        self.threads: list[str] = []
        self.starting, self.most_at_once, self.lock = 0, 0, threading.Lock()

    def start(self, src_ids: np.ndarray) -> ToyState:
        with self.lock:
            self.threads.append(threading.current_thread().name)
            self.starting += 1
            self.most_at_once = max(self.most_at_once, self.starting)
        time.sleep(0.01)
        with self.lock:
            self.starting -= 1
        return super().start(src_ids)


@pytest.mark.parametrize("lanes", [1, 2])
def test_translate_gives_each_text_its_search_in_order_and_a_blank_one_nothing(lanes: int) -> None:
    texts = ["a bb ccc", "", "dddd e", "  ", "f gg hhh iiii j", "kk", "l m"]
    model, codec = LaneThreads(ToyModel.random(vocab=9, seed=3).table), WordLengths()
    translator = Translator(model, codec, 100, max_sentences=2, **({"lanes": lanes} if lanes > 1 else {}))
    progress: list[int] = []
    translations = translator.translate(texts, on_batch=progress.append)
    single = [np.array([codec.encode_source(text)]) for text in texts if text.strip()]
    beam4 = iter(codec.decode(beam_search(model, one, 4, 0.6, one.shape[1] + 50)[0].tokens) for one in single)
    assert translations == [next(beam4) if text.strip() else "" for text in texts]  # §6.1's beam 4 and α
    greedy = [codec.decode(greedy_search(model, one, one.shape[1] + 50)[0].tokens) for one in single]
    assert [t for t in translations if t] != greedy  # beam 4 is not greedy here
    assert progress == [2, 2, 1]  # sentences per length batch, longest first
    searches = model.threads[: len(progress)]
    if lanes == 1:
        assert searches == [threading.current_thread().name] * 3
    else:  # the process's lanes, shared by every translator: two threads for the five batches of one sentence
        assert all(name.startswith("aiayn-lane") for name in searches)
        model.threads.clear()
        Translator(model, codec, 100, max_sentences=1, lanes=2).translate(texts)
        assert len(model.threads) == 5 and set(model.threads) <= {"aiayn-lane_0", "aiayn-lane_1"}
        assert model.most_at_once <= 2


@pytest.mark.parametrize("beam", [1, 3])
def test_translator_outputs_take_the_settings_lengths(beam: int) -> None:
    sources = [[3, 4, 5, EOS], [6, EOS], [4, 4, 4, 4, 5, EOS]]  # one batch of three lengths
    never_ends = Translator(NeverEnds(ToyModel.random(vocab=7, seed=1).table), WordLengths(), 100)
    outputs = never_ends.outputs(sources, SearchSettings(beam, max_extra_len=2))
    assert [len(o.tokens) for o in outputs] == [6, 4, 8]  # each its own source length + 2
    ends_at_once = Translator(EndsAtOnce(ToyModel.random(vocab=7, seed=1).table), WordLengths(), 100)
    # α = 0: no longer hypothesis, which a live candidate ranked above a </s> lets the beam go on to, can beat the
    # best one </s> ends at the first length it may.
    outputs = ends_at_once.outputs(sources, SearchSettings(beam, length_penalty=0.0, min_len=3))
    assert [len(o.tokens) for o in outputs] == [3, 3, 3] and all(o.ended for o in outputs)


class TopAsked(NeverEnds):
    """Never ends; records how many best tokens each step asks for: what leaves the engine (ONNX: its TopK's k)."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__(table)
        self.asked: list[int] = []

    def step_top(self, state: ToyState, tgt_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, ToyState]:
        self.asked.append(k)
        return super().step_top(state, tgt_ids, k)


def test_a_search_asks_the_engine_for_no_more_than_it_ranks() -> None:
    """Greedy asks for each row's best token, beam k for each beam's best 2k (their share of the best 2k)."""
    table = ToyModel.random(vocab=9, seed=0).table
    greedy, beam = TopAsked(table), TopAsked(table)
    greedy_search(greedy, source(3, 4), max_len=3)
    beam_search(beam, source(3, 4), beam_size=3, max_len=3)
    assert (greedy.asked, beam.asked) == ([1, 1, 1], [6, 6, 6])


def test_a_forked_process_searches_on_lanes_of_its_own() -> None:
    """The parent's lane threads are not in a forked child: it makes its own pool rather than wait on theirs."""
    translator = Translator(ToyModel.random(vocab=9, seed=3), WordLengths(), 100, max_sentences=1, lanes=2)
    expected = translator.translate(["a bb", "ccc d"])  # the parent's lanes now run
    child = os.fork()
    if child == 0:  # the child: exits whatever happens, never back into the test runner
        code = 1
        try:
            code = 0 if translator.translate(["a bb", "ccc d"]) == expected else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60  # not a speed limit: a child waiting on the parent's threads never ends
    while (ended := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if ended[0] == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked process's search never ended")
    assert os.waitstatus_to_exitcode(ended[1]) == 0
