"""The tutorials' decoding, for the bench: the encoder once, then the decoder over the whole prefix at every step."""

from __future__ import annotations

import numpy as np

from aiayn.engines.pytorch import TorchEngine, TorchState
from aiayn.model.transformer import Transformer
from aiayn.search.step import FullDistributionStep

NoCacheState = tuple[TorchState, np.ndarray]  # the state right after the encoder, and the ids fed so far


class NoCacheEngine(FullDistributionStep[NoCacheState]):
    """No KV cache: each step re-decodes every position fed so far (what the Annotated Transformer's
    ``greedy_decode`` does), so the bench can show what the cache saves."""

    def __init__(self, model: Transformer) -> None:
        self.inner = TorchEngine(model)
        self.bos_id, self.eos_id, self.pad_id = self.inner.bos_id, self.inner.eos_id, self.inner.pad_id
        self.never_generate = self.inner.never_generate

    def start(self, src_ids: np.ndarray) -> NoCacheState:
        return self.inner.start(src_ids), np.zeros((src_ids.shape[0], 0), dtype=np.int64)

    def step(self, state: NoCacheState, tgt_ids: np.ndarray) -> tuple[np.ndarray, NoCacheState]:
        first, prefix = state
        prefix = np.concatenate([prefix, tgt_ids], axis=1)  # (rows, fed so far)
        log_probs, _ = self.inner.step(first, prefix)  # from the empty cache each time: no reuse
        return log_probs, (first, prefix)

    def select(self, state: NoCacheState, rows: np.ndarray) -> NoCacheState:
        return self.inner.select(state[0], rows), state[1][rows]
