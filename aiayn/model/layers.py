"""The building blocks of §3.1–§3.5: embeddings, positions, feed-forward, residual + LayerNorm, layers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.core.config import ModelConfig
from aiayn.model.attention import MultiHeadAttention


class TokenEmbedding(nn.Module):
    """§3.4: learned embeddings multiplied by √d_model; the same matrix is the pre-softmax projection.

    An imported checkpoint may leave the scale out (``scale_embedding``) or add a bias to the logits
    (``logits_bias``, Marian's ``final_logits_bias``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d_model = config.d_model
        self.weight = nn.Parameter(torch.empty(config.vocab_size, d_model))
        # std d^-1/2 so that the scaled embedding has unit variance and the tied projection stays small.
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)
        self.scale = math.sqrt(d_model) if config.scale_embedding else 1.0
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.logits_bias else None

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight) * self.scale  # (batch, len, d_model)

    def logits(self, hidden: Tensor) -> Tensor:
        logits = hidden @ self.weight.t()  # (batch, len, vocab)
        return logits if self.bias is None else logits + self.bias


def sinusoidal_positions(positions: Tensor, d_model: int, layout: str = "interleaved") -> Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), interleaved; or, Marian's layout
    (``halves``), the same d/2 sines first and the d/2 cosines after them.

    Computed from the positions themselves, so any length and any offset work.
    ``positions`` (len,) → (len, d_model).
    """
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device) * (-math.log(10000.0) / d_model)
    )
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (len, d_model / 2)
    if layout == "halves":
        return torch.cat((angles.sin(), angles.cos()), dim=-1)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)


ACTIVATION_FUNCTIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}  # config.ACTIVATIONS, as torch functions


class FeedForward(nn.Module):
    """Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2 (or another activation in place of max(0, ·), ``activation``)."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float, activation: str = "relu") -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(activation_dropout)
        self.activation = ACTIVATION_FUNCTIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class Residual(nn.Module):
    """§3.1 and §5.4: LayerNorm(x + Dropout(Sublayer(x))) — or, pre-LN, x + Dropout(Sublayer(LayerNorm(x))).

    Split in two so that a sub-layer with extra outputs (attention weights,
    new keys/values) can run in between: ``after(x, sublayer(before(x)))``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.norm_first = config.norm_first

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.norm_first else x

    def after(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer_out)
        return self.norm(x + self.dropout(sublayer_out))


class EncoderLayer(nn.Module):
    """§3.1: multi-head self-attention, then the position-wise feed-forward network."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.self_attn_residual = Residual(config)
        self.feed_forward = FeedForward(config.d_model, config.d_ff, config.activation_dropout, config.activation)
        self.feed_forward_residual = Residual(config)

    def forward(self, x: Tensor, src_allowed: Tensor) -> Tensor:
        h = self.self_attn_residual.before(x)
        attended, _ = self.self_attn(h, *self.self_attn.project_kv(h), src_allowed)
        x = self.self_attn_residual.after(x, attended)
        return self.feed_forward_residual.after(x, self.feed_forward(self.feed_forward_residual.before(x)))


class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, attention over the encoder output (its own weights), feed-forward."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.self_attn_residual = Residual(config)
        self.cross_attn = MultiHeadAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.cross_attn_residual = Residual(config)
        self.feed_forward = FeedForward(config.d_model, config.d_ff, config.activation_dropout, config.activation)
        self.feed_forward_residual = Residual(config)

    def forward(
        self,
        x: Tensor,
        past_key: Tensor,
        past_value: Tensor,
        cross_key: Tensor,
        cross_value: Tensor,
        causal_allowed: Tensor,
        src_allowed: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``x`` (batch, new_len, d_model) after ``past_len`` cached positions.

        Returns the output, the keys and values of all past_len + new_len
        positions, and the cross-attention weights (batch, heads, new_len, src_len).
        """
        h = self.self_attn_residual.before(x)
        new_key, new_value = self.self_attn.project_kv(h)
        key = torch.cat((past_key, new_key), dim=2)  # (batch, heads, past_len + new_len, d_head)
        value = torch.cat((past_value, new_value), dim=2)
        attended, _ = self.self_attn(h, key, value, causal_allowed)
        x = self.self_attn_residual.after(x, attended)

        h = self.cross_attn_residual.before(x)
        attended, cross_weights = self.cross_attn(h, cross_key, cross_value, src_allowed)
        x = self.cross_attn_residual.after(x, attended)

        x = self.feed_forward_residual.after(x, self.feed_forward(self.feed_forward_residual.before(x)))
        return x, key, value, cross_weights
