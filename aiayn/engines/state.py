"""The one decoder state every engine carries between steps, and its one ``select``.

The source side (padding mask, each layer's cross-attention keys/values) is
computed once per batch by the encoder; the target side (each layer's
self-attention keys/values) grows by one position a step. An engine keeps its
tensors in its own type (torch tensors, NumPy arrays, ONNX Runtime OrtValues)
and supplies only how rows are taken from them (``TakeRows``).

One engine keeps a state of its own: the serving engine (``onnx/serving/``) binds its buffers once per
batch and lets a beam's reorder adopt rows in place (``host_buffers.HostState``: a view of which bound row is which).
Taking the cache rows into new arrays as ``select`` does here, rebound each time, gave the same outputs ×1.5
slower at beam 4 (150 val sentences, batch 1 and 16), so it does not use this type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")
# values, rows → each value's rows ``rows`` (row i of a result is row rows[i] of its value), in one go.
TakeRows = Callable[[Sequence[T], np.ndarray], list[T]]


@dataclass(frozen=True)
class DecoderState(Generic[T]):
    src_mask: T  # the engine's form of the source padding mask, one row per state row
    cross: tuple[T, ...]  # per decoder layer key, value: (rows, heads, src_len, d_head)
    past: tuple[T, ...]  # per decoder layer key, value: (rows, heads, past_len, d_head); () before the first step
    past_len: int
    sources: np.ndarray  # (rows,) the encoded sentence behind each row's source side

    @classmethod
    def start(cls, src_mask: T, cross: Sequence[T], rows: int) -> DecoderState[T]:
        """Right after the encoder: nothing decoded yet, row i holds sentence i."""
        return cls(src_mask, tuple(cross), (), 0, np.arange(rows))

    @property
    def rows(self) -> int:
        return len(self.sources)

    def advance(self, present: Sequence[T], new_len: int) -> DecoderState[T]:
        """The state after a step that fed ``new_len`` tokens: ``present`` becomes the past."""
        return replace(self, past=tuple(present), past_len=self.past_len + new_len)

    def select(self, rows: np.ndarray, take: TakeRows[T]) -> DecoderState[T]:
        """Keep, repeat or reorder rows: row i of the result is row ``rows[i]``.

        When every row keeps its sentence (a beam reordered within its sentence),
        the source side is left as it is and only the cache is taken.
        """
        sources = self.sources[rows]
        keep_source = bool(self.past) and np.array_equal(sources, self.sources)
        source_side = [] if keep_source else [self.src_mask, *self.cross]
        taken = take([*source_side, *self.past], rows)
        past = tuple(taken[len(source_side) :])
        if keep_source:
            return replace(self, past=past, sources=sources)
        return replace(self, src_mask=taken[0], cross=tuple(taken[1 : len(source_side)]), past=past, sources=sources)
