"""Beam search with the GNMT length penalty (§6.1: beam 4, α = 0.6), batched over sentences."""

from __future__ import annotations

import numpy as np

from aiayn.search.greedy import default_max_len
from aiayn.search.step import StepModel


def length_penalty(length: int, alpha: float) -> float:
    """lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016); |Y| counts the generated tokens including </s>."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(
    model: StepModel,
    src_ids: np.ndarray,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: np.ndarray | int | None = None,
) -> list[list[int]]:
    """The best hypothesis (without <s>, </s>) per row of ``src_ids`` (batch, src_len).

    A sentence is done when it has ``beam_size`` finished hypotheses, or when it
    reaches its length limit (its live beams are then finished as they are).
    """
    batch = src_ids.shape[0]
    limits = np.broadcast_to(default_max_len(src_ids, model.pad_id) if max_len is None else max_len, (batch,))
    state = model.select(model.start(src_ids), np.repeat(np.arange(batch), beam_size))
    scores = np.full((batch, beam_size), -np.inf)
    scores[:, 0] = 0.0  # one live beam at first, so the beams do not start as copies
    tokens = np.zeros((batch, beam_size, 0), dtype=np.int64)  # (batch, beam, generated)
    last = np.full((batch * beam_size, 1), model.bos_id, dtype=np.int64)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = np.zeros(batch, dtype=bool)
    for step in range(int(limits.max())):
        log_probs, state = model.step(state, last)  # (batch * beam, vocab)
        vocab = log_probs.shape[1]
        candidates = (scores[:, :, None] + log_probs.reshape(batch, beam_size, vocab)).reshape(batch, -1)
        # Twice the beam, so that beam_size live ones remain after taking out those that end in </s>.
        top = np.argsort(-candidates, axis=1, kind="stable")[:, : 2 * beam_size]  # (batch, 2 * beam)
        new_scores = np.full((batch, beam_size), -np.inf)
        new_tokens = np.zeros((batch, beam_size, step + 1), dtype=np.int64)
        rows = np.zeros((batch, beam_size), dtype=np.int64)
        for b in range(batch):
            rows[b] = b * beam_size
            if done[b]:
                continue
            live = 0
            for flat in top[b]:
                score = candidates[b, flat]
                if score == -np.inf:
                    break
                beam, token = divmod(int(flat), vocab)
                prefix = tokens[b, beam].tolist()
                if token == model.eos_id:
                    finished[b].append((score / length_penalty(step + 1, alpha), prefix))
                    continue
                new_scores[b, live] = score
                new_tokens[b, live, :-1] = tokens[b, beam]
                new_tokens[b, live, -1] = token
                rows[b, live] = b * beam_size + beam
                live += 1
                if live == beam_size:
                    break
            at_limit = step + 1 >= limits[b]
            if len(finished[b]) >= beam_size or at_limit:
                if at_limit:
                    finished[b] += [
                        (new_scores[b, k] / length_penalty(step + 1, alpha), new_tokens[b, k].tolist())
                        for k in range(live)
                    ]
                done[b] = True
                new_scores[b] = -np.inf
        if done.all():
            break
        scores, tokens = new_scores, new_tokens
        state = model.select(state, rows.reshape(-1))
        last = np.where(np.isfinite(scores), tokens[:, :, -1], model.eos_id).reshape(-1, 1).astype(np.int64)
    return [max(hyps, key=lambda h: h[0])[1] if hyps else [] for hyps in finished]
