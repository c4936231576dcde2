"""The decoder's key/value cache as an explicit object (the decoder takes one and returns a new one).

Self-attention keys/values grow by the new target positions at each step;
cross-attention keys/values are projected from the encoder memory once per
sentence, since the memory does not change while decoding. Engines keep these
tensors in the one decoder state (``aiayn.engines.state``), whose ``select``
reorders the rows for the search.
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
