"""§3.2 Attention: scaled dot-product attention (eq. 1) and multi-head attention (§3.2.2)."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn


def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, allowed: Tensor, dropout: nn.Module, scale: float
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(QKᵀ / √d_k) V, eq. 1.

    ``scale`` is 1/√d_k, a plain number so that exported graphs hold it as a constant.
    ``allowed`` is a boolean mask broadcastable to (batch, heads, q_len, k_len);
    a blocked key gets -inf, so a query with no allowed key shows up as NaN
    instead of being hidden by a large finite fill.
    """
    scores = query @ key.transpose(-2, -1) * scale  # (batch, heads, q_len, k_len)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return dropout(weights) @ value, weights  # (batch, heads, q_len, d_head)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Keys and values are projected by :meth:`project_kv` and passed in, so the
    decoder can cache them: its own past for self-attention, and the encoder
    memory's projection once per sentence for cross-attention.
    """

    def __init__(self, d_model: int, n_heads: int, attention_dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.scale = 1.0 / math.sqrt(self.d_head)
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(attention_dropout)

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)  # (batch, heads, len, d_head)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``x`` (batch, len, d_model), each (batch, heads, len, d_head)."""
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))

    def forward(self, x: Tensor, key: Tensor, value: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
        """Attend from ``x`` (batch, q_len, d_model) over projected ``key``/``value``.

        Returns the output (batch, q_len, d_model) and the attention weights
        (batch, heads, q_len, k_len).
        """
        query = self.split_heads(self.w_q(x))
        context, weights = scaled_dot_product_attention(query, key, value, allowed, self.dropout, self.scale)
        batch, _, q_len, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, q_len, self.n_heads * self.d_head)
        return self.w_o(context), weights
