"""The PyTorch engine: the model seen through the search's step interface (an ``aiayn.engines.Engine``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.core.folder import ModelFolder
from aiayn.engines import TORCH
from aiayn.engines.placement import CPU, GPU, Placement, gpu_wanted
from aiayn.engines.state import DecoderState
from aiayn.model.cache import KVCache
from aiayn.model.transformer import Transformer
from aiayn.search.step import FullDistributionStep

TorchState = DecoderState[Tensor]  # src_mask is the model's (rows, 1, 1, src_len) padding mask


def take_rows(values: Sequence[Tensor], rows: np.ndarray) -> list[Tensor]:
    index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(values[0].device)
    return [value.index_select(0, index) for value in values]


def gpu_problem() -> str:
    """Why PyTorch cannot run on a GPU here, or "" where it can."""
    return "" if torch.cuda.is_available() else "PyTorch cannot run on a GPU here (it sees no GPU)"


def resolve_device(device: str) -> str:
    """Where PyTorch runs for ``--device device`` (training's choice; an engine's is its placement's)."""
    return GPU if gpu_wanted(device, gpu_problem) else CPU


class TorchEngine(FullDistributionStep[TorchState]):
    """Encodes once, then decodes one step at a time with the KV cache; NumPy in and out."""

    name = TORCH

    def __init__(self, model: Transformer, device: str | torch.device = "cpu") -> None:
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.provider = f"PyTorch ({self.device.type.upper()})"
        self.lanes = 1  # PyTorch parallelises inside each op with its own threads
        tokens = model.config.special_tokens
        self.bos_id, self.eos_id, self.pad_id = tokens.bos, tokens.eos, tokens.pad
        self.never_generate = model.config.never_generate

    @classmethod
    def load(cls, folder: ModelFolder, placement: Placement, model: Transformer | None = None) -> TorchEngine:
        """The folder's model (or ``model``, one in memory) on the placement's device."""
        from aiayn.model.weights import load_model

        return cls(model if model is not None else load_model(folder), placement.device)

    def tensor(self, ids: np.ndarray) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(self.device)

    def cache(self, state: TorchState) -> KVCache:
        """The model's cache object for ``state`` (empty self-attention keys/values before the first step)."""
        past = state.past or (state.cross[0][:, :, :0],) * len(state.cross)  # (rows, heads, 0, d_head) at first
        return KVCache(past, state.cross)

    @torch.inference_mode()
    def start(self, src_ids: np.ndarray) -> TorchState:
        src = self.tensor(src_ids)
        cache = self.model.start_cache(self.model.encode(src))  # memory: (batch, src_len, d_model)
        return DecoderState.start(self.model.source_mask(src), cache.cross_kv, src.size(0))

    @torch.inference_mode()
    def step(self, state: TorchState, tgt_ids: np.ndarray) -> tuple[np.ndarray, TorchState]:
        out = self.model.decode(self.tensor(tgt_ids), self.cache(state), state.src_mask)
        log_probs = F.log_softmax(out.logits[:, -1].float(), dim=-1)  # (rows, vocab)
        return log_probs.cpu().numpy(), state.advance(out.cache.self_kv, tgt_ids.shape[1])

    @torch.inference_mode()
    def select(self, state: TorchState, rows: np.ndarray) -> TorchState:
        return state.select(rows, take_rows)

    @torch.inference_mode()
    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Last decoder layer's cross-attention over a whole output: (batch, heads, out_len, src_len)."""
        state = self.start(src_ids)
        out = self.model.decode(self.tensor(out_ids), self.cache(state), state.src_mask)
        return out.cross_attention.float().cpu().numpy()
