"""What a search gives back for a sentence: its output ids and how probable the model found them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Output:
    """Output ids (without <s>, </s>) and the sum of their log-probabilities, </s>'s included when it ``ended``
    (an output cut at its length limit has none); ``token_log_probs``: each output id's own, as the search's step
    gave it when it chose the id (no second pass), one per id of ``tokens``."""

    tokens: list[int]
    log_prob: float
    ended: bool
    token_log_probs: list[float]
    # The beam's next best, where the search was asked for them (``SearchSettings.n_best``), best first.
    others: tuple[Output, ...] = field(default=(), kw_only=True)

    @property
    def scored_tokens(self) -> int:
        """How many tokens ``log_prob`` sums over: the output's, and </s> if it ended."""
        return len(self.tokens) + self.ended


def mean_log_prob(outputs: Iterable[Output]) -> float:
    """Log-probability per token over ``outputs`` (the pieces of one sentence): the model's confidence in them."""
    pieces = list(outputs)
    tokens = sum(o.scored_tokens for o in pieces)
    return sum(o.log_prob for o in pieces) / tokens if tokens else 0.0
