"""A batch of token ids (``data.token_arrays.PaddedBatch``, NumPy) as the tensors the model reads."""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.data.token_arrays import PaddedBatch


def to_tensors(batch: PaddedBatch, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Source ids (batch, src_len), decoder input ``<s> y`` and target ``y </s>`` (batch, tgt_len), int64."""
    src_ids, tgt_in, tgt_out = (torch.from_numpy(ids).to(device, non_blocking=True) for ids in batch)
    return src_ids, tgt_in, tgt_out
