"""§3: the encoder-decoder. ``encode()`` and ``decode()`` are the seam that training, search and export share."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from aiayn.core.config import ModelConfig
from aiayn.core.weight_spec import EMBEDDING
from aiayn.model.cache import KVCache
from aiayn.model.layers import DecoderLayer, EncoderLayer, TokenEmbedding, sinusoidal_positions
from aiayn.model.masks import causal_mask, padding_mask


class DecoderOutput(NamedTuple):
    logits: Tensor  # (batch, new_len, vocab)
    cache: KVCache  # with the new positions appended
    cross_attention: Tensor  # last layer's weights (batch, heads, new_len, src_len)


class Transformer(nn.Module):
    """Encoder and decoder stacks (§3.1) over one shared vocabulary with three-way tied weights (§3.4)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = TokenEmbedding(config)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        # Pre-LN leaves the residual stream un-normalised, so it needs a final norm per stack; post-LN does not.
        self.encoder_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        self.decoder_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.norm_first else None
        for name, param in self.named_parameters():
            if param.dim() == 2 and name != EMBEDDING:
                nn.init.xavier_uniform_(param)
            elif name.endswith("bias") and "norm" not in name:
                nn.init.zeros_(param)

    def embed(self, ids: Tensor, offset: int | Tensor = 0) -> Tensor:
        """§3.4–3.5: scaled token embeddings plus positions ``offset ..``, then dropout (§5.4)."""
        positions = torch.arange(ids.size(1), device=ids.device) + offset
        tokens = self.embedding(ids)
        table = sinusoidal_positions(positions, self.config.d_model, self.config.positions)
        return self.dropout(tokens + table.to(tokens.dtype))

    def source_mask(self, src_ids: Tensor) -> Tensor:
        return padding_mask(src_ids, self.config.special_tokens.pad)  # (batch, 1, 1, src_len)

    def encode(self, src_ids: Tensor) -> Tensor:
        """(batch, src_len) source ids, right-padded → memory (batch, src_len, d_model)."""
        src_allowed = self.source_mask(src_ids)
        x = self.embed(src_ids)
        for layer in self.encoder_layers:
            x = layer(x, src_allowed)
        return self.encoder_norm(x) if self.encoder_norm is not None else x

    def start_cache(self, memory: Tensor) -> KVCache:
        """An empty self-attention cache and each layer's cross-attention keys/values of ``memory``."""
        empty = memory.new_zeros(memory.size(0), self.config.n_heads, 0, self.config.d_head)
        cross = tuple(t for layer in self.decoder_layers for t in layer.cross_attn.project_kv(memory))
        return KVCache(self_kv=(empty,) * len(cross), cross_kv=cross)

    def decode(
        self, tgt_ids: Tensor, cache: KVCache, src_allowed: Tensor, offset: int | Tensor | None = None
    ) -> DecoderOutput:
        """Run the decoder on ``tgt_ids`` (batch, new_len), the positions after those in ``cache``.

        ``offset`` is the position of the first new token; it defaults to the
        cache length (the exporter passes it explicitly as a graph input).
        """
        states, new_cache, cross_weights = self.decode_states(tgt_ids, cache, src_allowed, offset)
        return DecoderOutput(self.embedding.logits(states), new_cache, cross_weights)

    def decode_states(
        self, tgt_ids: Tensor, cache: KVCache, src_allowed: Tensor, offset: int | Tensor | None = None
    ) -> tuple[Tensor, KVCache, Tensor]:
        """``decode`` up to the tied projection: the decoder's output states (batch, new_len, d_model)."""
        past_len = cache.past_len
        new_len = tgt_ids.size(1)
        x = self.embed(tgt_ids, past_len if offset is None else offset)
        causal_allowed = causal_mask(new_len, past_len + new_len, tgt_ids.device)
        self_kv: list[Tensor] = []
        cross_weights = tgt_ids.new_zeros(0)
        for i, layer in enumerate(self.decoder_layers):
            x, key, value, cross_weights = layer(x, *cache.layer(i), causal_allowed, src_allowed)
            self_kv += [key, value]
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x, KVCache(tuple(self_kv), cache.cross_kv), cross_weights

    def teacher_forced_states(self, src_ids: Tensor, tgt_in_ids: Tensor) -> Tensor:
        """Teacher forcing up to the tied projection: (batch, src_len), (batch, tgt_len) → (batch, tgt_len, d_model).

        Training projects only the states of real target tokens (``train.loss``): padding never reaches the
        vocabulary-sized matmul.
        """
        memory = self.encode(src_ids)
        states, _, _ = self.decode_states(tgt_in_ids, self.start_cache(memory), self.source_mask(src_ids))
        return states

    def forward(self, src_ids: Tensor, tgt_in_ids: Tensor) -> Tensor:
        """Teacher forcing: (batch, src_len), (batch, tgt_len) → logits (batch, tgt_len, vocab)."""
        return self.embedding.logits(self.teacher_forced_states(src_ids, tgt_in_ids))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
