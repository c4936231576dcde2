"""The decoder's key/value cache as an explicit object (the decoder takes one and returns a new one).

Self-attention keys/values grow by the new target positions at each step;
cross-attention keys/values are projected from the encoder memory once per
sentence, since the memory does not change while decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class KVCache:
    self_keys: tuple[Tensor, ...]  # per decoder layer (batch, heads, past_len, d_head)
    self_values: tuple[Tensor, ...]
    cross_keys: tuple[Tensor, ...]  # per decoder layer (batch, heads, src_len, d_head)
    cross_values: tuple[Tensor, ...]

    @property
    def past_len(self) -> int:
        return self.self_keys[0].size(2)

    def select(self, rows: Tensor) -> KVCache:
        """Keep, repeat or reorder batch rows (beam search): row i of the result is ``rows[i]``."""

        def pick(tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
            return tuple(t.index_select(0, rows) for t in tensors)

        return KVCache(pick(self.self_keys), pick(self.self_values), pick(self.cross_keys), pick(self.cross_values))
