"""The one mask builder. A mask is boolean, True where attention is allowed.

Padding masks hide padded *keys* (never queries: a padded query's output is
simply ignored downstream), and the causal mask lets target position i see
positions 0..i only (§3.2.3).
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(batch, len) token ids → (batch, 1, 1, len): keys that hold a real token."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(new_len: int, total_len: int, device: torch.device) -> Tensor:
    """(1, 1, new_len, total_len): the new queries are the last ``new_len`` of ``total_len`` positions,
    and query i (absolute total_len - new_len + i) sees keys 0 .. total_len - new_len + i."""
    query_pos = torch.arange(new_len, device=device)[:, None] + (total_len - new_len)
    key_pos = torch.arange(total_len, device=device)[None, :]
    return (key_pos <= query_pos)[None, None]
