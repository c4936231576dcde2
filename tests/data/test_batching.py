"""§5.1 token batches: complete, within the token limit, sorted by length, reproducible per (seed, epoch)."""

from __future__ import annotations

import numpy as np
import pytest

from aiayn.data.batching import plan_batches, token_batches


def lengths(count: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """Sentence lengths shaped like Multi30k's (about 5 to 40 subwords, target near source)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(5, 40, count)
    tgt = np.clip(src + rng.integers(-4, 5, count), 1, None)
    return src.tolist(), tgt.tolist()


def cost(batch: list[int], src: list[int], tgt: list[int]) -> int:
    """Padded tokens of a batch: count × the longest side, + 1 for <s>/</s>."""
    return len(batch) * max(max(src[i], tgt[i]) + 1 for i in batch)


def test_every_index_once_within_the_limit() -> None:
    src, tgt = lengths(5000)
    batches = token_batches(src, tgt, 1000, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(5000))
    assert all(cost(b, src, tgt) <= 1000 for b in batches)


def test_batches_are_full_and_have_little_padding() -> None:
    src, tgt = lengths(5000)
    batches = token_batches(src, tgt, 1000, seed=1, epoch=0)
    real = sum(max(s, t) + 1 for s, t in zip(src, tgt, strict=True))
    padded = sum(cost(b, src, tgt) for b in batches)
    assert padded < 1.1 * real  # sorted by length: little padding
    assert padded > 0.9 * 1000 * len(batches)  # and the batches are nearly full


def test_deterministic_per_seed_and_epoch_and_different_otherwise() -> None:
    src, tgt = lengths(2000)
    batches = token_batches(src, tgt, 800, seed=1, epoch=3)
    assert token_batches(src, tgt, 800, seed=1, epoch=3) == batches
    for seed, epoch in ((1, 4), (2, 3)):
        other = token_batches(src, tgt, 800, seed=seed, epoch=epoch)
        assert other != batches
        assert {frozenset(b) for b in other} != {frozenset(b) for b in batches}  # not just reordered


def test_a_pair_longer_than_the_limit_gets_its_own_batch() -> None:
    src, tgt = lengths(300)
    src[17], tgt[42] = 500, 700
    batches = token_batches(src, tgt, 200, seed=0, epoch=0)
    assert [17] in batches and [42] in batches
    assert sorted(i for b in batches for i in b) == list(range(300))
    assert all(cost(b, src, tgt) <= 200 for b in batches if len(b) > 1)


def test_edge_cases_and_errors() -> None:
    assert token_batches([], [], 100, seed=0, epoch=0) == []
    assert token_batches([0], [0], 1, seed=0, epoch=0) == [[0]]
    with pytest.raises(ValueError, match="3 source lengths but 2 target lengths; give one per pair"):
        token_batches([1, 2, 3], [1, 2], 100, seed=0, epoch=0)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        token_batches([1], [1], 0, seed=0, epoch=0)
    with pytest.raises(ValueError, match="must not be negative"):
        token_batches([1, -5], [1, -3], 100, seed=0, epoch=0)


def greedy_one_pair_at_a_time(
    src: list[int], tgt: list[int], max_tokens: int, seed: int, epoch: int
) -> list[list[int]]:
    """The batcher as it was written before its plan became arrays: one pair at a time, in Python."""
    costs = np.maximum(src, tgt) + 1
    rng = np.random.default_rng((seed, epoch))
    order = np.argsort(costs + rng.uniform(-1.0, 1.0, costs.size), kind="stable")
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order.tolist():
        if current and max(longest, costs[index]) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, int(costs[index]))
    batches.append(current)
    return [batches[i] for i in rng.permutation(len(batches))]


@pytest.mark.parametrize("max_tokens", [1, 60, 1000, 4096])
def test_the_array_plan_makes_the_same_batches_as_one_pair_at_a_time(max_tokens: int) -> None:
    src, tgt = lengths(3000, seed=max_tokens)
    src[5] = 900  # longer than most limits: a batch of its own
    assert token_batches(src, tgt, max_tokens, 2, 7) == greedy_one_pair_at_a_time(src, tgt, max_tokens, 2, 7)


def test_a_plan_of_a_million_pairs_is_three_arrays() -> None:
    src, tgt = lengths(1_000_000)
    plan = plan_batches(np.asarray(src, dtype=np.int32), np.asarray(tgt, dtype=np.int32), 4096, seed=1, epoch=0)
    assert plan.order.shape == (1_000_000,) and len(plan) == plan.bounds.size - 1
    assert sum(plan[i].size for i in range(len(plan))) == 1_000_000
