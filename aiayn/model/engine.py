"""The PyTorch engine: the model seen through the search's step interface (``aiayn.search.StepModel``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.model.cache import KVCache
from aiayn.model.transformer import Transformer
from aiayn.search.step import FullDistributionStep


@dataclass(frozen=True)
class TorchState:
    cache: KVCache
    src_allowed: Tensor  # (rows, 1, 1, src_len)


class TorchEngine(FullDistributionStep[TorchState]):
    """Encodes once, then decodes one step at a time with the KV cache; NumPy in and out."""

    name = "torch"

    def __init__(self, model: Transformer, device: str | torch.device = "cpu") -> None:
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        tokens = model.config.special_tokens
        self.bos_id, self.eos_id, self.pad_id = tokens.bos, tokens.eos, tokens.pad

    @torch.inference_mode()
    def start(self, src_ids: np.ndarray) -> TorchState:
        src = torch.from_numpy(np.ascontiguousarray(src_ids, dtype=np.int64)).to(self.device)
        memory = self.model.encode(src)  # (batch, src_len, d_model)
        return TorchState(self.model.start_cache(memory), self.model.source_mask(src))

    @torch.inference_mode()
    def step(self, state: TorchState, tgt_ids: np.ndarray) -> tuple[np.ndarray, TorchState]:
        tgt = torch.from_numpy(np.ascontiguousarray(tgt_ids, dtype=np.int64)).to(self.device)
        out = self.model.decode(tgt, state.cache, state.src_allowed)
        log_probs = F.log_softmax(out.logits[:, -1].float(), dim=-1)  # (rows, vocab)
        return log_probs.cpu().numpy(), TorchState(out.cache, state.src_allowed)

    @torch.inference_mode()
    def select(self, state: TorchState, rows: np.ndarray) -> TorchState:
        index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(self.device)
        return TorchState(state.cache.select(index), state.src_allowed.index_select(0, index))

    @torch.inference_mode()
    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Last decoder layer's cross-attention over a whole output: (batch, heads, out_len, src_len)."""
        state = self.start(src_ids)
        tgt = torch.from_numpy(np.ascontiguousarray(out_ids, dtype=np.int64)).to(self.device)
        return self.model.decode(tgt, state.cache, state.src_allowed).cross_attention.float().cpu().numpy()
