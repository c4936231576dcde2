"""The decoder's key/value cache as an explicit object (the decoder takes one and returns a new one).

Self-attention keys/values grow by the new target positions at each step;
cross-attention keys/values are projected from the encoder memory once per
sentence, since the memory does not change while decoding.

One layout from here to every engine: per decoder layer its key, then its value
(layer i's at 2i and 2i + 1), the ONNX contract's order (``aiayn.core.contract.kv_slots``).
The PyTorch engine's decoder state (``aiayn.engines.state``) holds these very tuples,
the exported graphs take and give them in this order, and the CPU serving engine
stacks them in it: no engine reorders them between steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class KVCache:
    self_kv: tuple[Tensor, ...]  # per decoder layer key, value: (batch, heads, past_len, d_head)
    cross_kv: tuple[Tensor, ...]  # per decoder layer key, value: (batch, heads, src_len, d_head)

    @property
    def past_len(self) -> int:
        return self.self_kv[0].size(2)

    def layer(self, i: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Decoder layer ``i``'s self-attention key and value, then its cross-attention key and value."""
        return (*self.self_kv[2 * i : 2 * i + 2], *self.cross_kv[2 * i : 2 * i + 2])
