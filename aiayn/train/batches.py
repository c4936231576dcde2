"""A corpus as the model trains on it: token ids, and padded (source, decoder input, decoder target) batches."""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.core.config import SpecialTokens
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.data.multi30k import ParallelCorpus


def encode_corpus(tokenizer: SubwordTokenizer, corpus: ParallelCorpus) -> tuple[list[list[int]], list[list[int]]]:
    """Source ids end with </s>; the target is returned without <s>/</s> (added per batch)."""
    return tokenizer.encode_source_batch(corpus.src), tokenizer.encode_batch(corpus.tgt)


def bare_lengths(src: list[list[int]], tgt: list[list[int]]) -> tuple[list[int], list[int]]:
    """Token counts without </s> or <s>: ``token_batches`` adds the one special token of each side itself."""
    return [len(s) - 1 for s in src], [len(t) for t in tgt]


def make_batch(
    rows: list[int], src: list[list[int]], tgt: list[list[int]], tokens: SpecialTokens, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """Padded source ids (batch, src_len), decoder input ``<s> y`` and target ``y </s>`` (batch, tgt_len)."""
    src_len = max(len(src[i]) for i in rows)
    tgt_len = max(len(tgt[i]) for i in rows) + 1
    src_ids = torch.full((len(rows), src_len), tokens.pad, dtype=torch.long)
    tgt_in = torch.full((len(rows), tgt_len), tokens.pad, dtype=torch.long)
    tgt_out = torch.full((len(rows), tgt_len), tokens.pad, dtype=torch.long)
    for b, i in enumerate(rows):
        src_ids[b, : len(src[i])] = torch.tensor(src[i])
        tgt_in[b, : len(tgt[i]) + 1] = torch.tensor([tokens.bos, *tgt[i]])
        tgt_out[b, : len(tgt[i]) + 1] = torch.tensor([*tgt[i], tokens.eos])
    return src_ids.to(device), tgt_in.to(device), tgt_out.to(device)
