"""Token ids on disk: one flat array of ids and an index of offsets, read back memory-mapped.

The way fairseq binarizes a corpus and nanoGPT writes train.bin: sentence i is
``ids[offsets[i]:offsets[i + 1]]``, so reading a batch touches only its own sentences and the memory of
training does not grow with the corpus. Ids are stored bare (no <s> or </s>): ``TokenPairs.padded`` adds
them per batch, so one file serves as source and as target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import numpy as np

from aiayn.core.config import SpecialTokens

IDS_SUFFIX, OFFSETS_SUFFIX = ".bin", ".idx"
OFFSET_DTYPE = np.int64


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id: 2 bytes a token up to a 65 536-token vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def array_files(prefix: Path) -> tuple[Path, Path]:
    """``train.src`` → ``train.src.bin`` (the ids) and ``train.src.idx`` (the offsets)."""
    return Path(f"{prefix}{IDS_SUFFIX}"), Path(f"{prefix}{OFFSETS_SUFFIX}")


class TokenArrayWriter:
    """Appends sentences' ids to the two files, a batch of sentences at a time."""

    def __init__(self, prefix: Path, dtype: np.dtype) -> None:
        ids_path, offsets_path = array_files(prefix)
        self.dtype = dtype
        self.ids = ids_path.open("wb")
        self.offsets = offsets_path.open("wb")
        self.end = 0  # ids written so far
        np.zeros(1, OFFSET_DTYPE).tofile(self.offsets)

    def append(self, rows: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter(map(len, rows), OFFSET_DTYPE, count=len(rows))
        total = int(lengths.sum())
        np.fromiter(chain.from_iterable(rows), self.dtype, count=total).tofile(self.ids)
        (self.end + np.cumsum(lengths)).tofile(self.offsets)
        self.end += total

    def __enter__(self) -> TokenArrayWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.ids.close()
        self.offsets.close()


class TokenArray:
    """The sentences of one side of one split, memory-mapped."""

    def __init__(self, prefix: Path, dtype: np.dtype) -> None:
        ids_path, offsets_path = array_files(prefix)
        self.offsets = np.memmap(offsets_path, OFFSET_DTYPE, mode="r")
        # An empty file cannot be mapped; a split of empty sentences has no ids at all.
        self.ids = np.memmap(ids_path, dtype, mode="r") if ids_path.stat().st_size else np.zeros(0, dtype)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        """(sentences,) token counts, int32."""
        return np.diff(self.offsets).astype(np.int32)

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ids of ``rows`` back to back, with each sentence's length and each id's place in its sentence."""
        starts = self.offsets[rows]
        lengths = self.offsets[rows + 1] - starts  # (batch,)
        place = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return self.ids[np.repeat(starts, lengths) + place].astype(np.int64), lengths, place

    def __getitem__(self, row: int) -> list[int]:
        return self.ids[self.offsets[row] : self.offsets[row + 1]].tolist()


class PaddedBatch(NamedTuple):
    """A batch as the model reads it: int64 ids, right-padded."""

    src_ids: np.ndarray  # (batch, src_len): x </s>
    tgt_in: np.ndarray  # (batch, tgt_len): <s> y
    tgt_out: np.ndarray  # (batch, tgt_len): y </s>


@dataclass(frozen=True)
class TokenPairs:
    """Aligned source and target arrays: pair i is ``(src[i], tgt[i])``."""

    src: TokenArray
    tgt: TokenArray

    @classmethod
    def open(cls, prefix: Path, dtype: np.dtype) -> TokenPairs:
        """``prefix`` ``.src`` and ``.tgt``: e.g. folder/train → folder/train.src.bin, folder/train.tgt.bin."""
        return cls(TokenArray(Path(f"{prefix}.src"), dtype), TokenArray(Path(f"{prefix}.tgt"), dtype))

    def __len__(self) -> int:
        return len(self.src)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Token counts without <s>/</s>, as ``batching.token_batches`` takes them."""
        return self.src.lengths(), self.tgt.lengths()

    def source_ids(self, eos: int) -> list[list[int]]:
        """Every source sentence ending in </s>, as the search reads it (for small splits: validation)."""
        return [[*self.src[i], eos] for i in range(len(self))]

    def padded(self, rows: np.ndarray, tokens: SpecialTokens) -> PaddedBatch:
        """The pairs ``rows`` (batch,) as padded arrays with </s> after each source and <s>/</s> around targets."""
        rows = np.asarray(rows, dtype=np.int64)
        index = np.arange(len(rows))
        src, src_len, src_place = self.src.gather(rows)
        tgt, tgt_len, tgt_place = self.tgt.gather(rows)
        src_ids = np.full((len(rows), int(src_len.max()) + 1), tokens.pad, dtype=np.int64)
        src_ids[np.repeat(index, src_len), src_place] = src
        src_ids[index, src_len] = tokens.eos
        width = int(tgt_len.max()) + 1
        tgt_in = np.full((len(rows), width), tokens.pad, dtype=np.int64)
        tgt_out = np.full((len(rows), width), tokens.pad, dtype=np.int64)
        tgt_in[index, 0] = tokens.bos  # <pad> itself in Marian's folders: the padding is found in tgt_out alone
        tgt_in[np.repeat(index, tgt_len), tgt_place + 1] = tgt
        tgt_out[np.repeat(index, tgt_len), tgt_place] = tgt
        tgt_out[index, tgt_len] = tokens.eos
        return PaddedBatch(src_ids, tgt_in, tgt_out)
