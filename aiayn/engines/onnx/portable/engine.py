"""The ONNX Runtime engine: a model folder's exported graphs seen through the search's step interface.

It checks the folder before it runs anything: every file there, the graphs
made from these very weights and this config (hashes in their metadata), and
the names, dtypes and fixed sizes the contract declares (``aiayn.core.contract``).
The decoder it runs is decoder.onnx plus the search's selection head
(``top_k.py``), so only each row's k best next tokens leave ONNX Runtime.
Where the state lives between steps is a component (``state_io.py``): NumPy arrays
on the CPU, OrtValues bound on the device on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aiayn.core.config import ModelConfig
from aiayn.core.contract import (
    CROSS_ATTENTION,
    DECODER_FILE,
    ENCODER_FILE,
    LOG_PROBS,
    POSITION_OFFSET,
    SRC_IDS,
    SRC_MASK,
    TGT_IDS,
    TOP_K_INPUT,
    TOP_K_OUTPUTS,
    decoder_with_top_k_spec,
    encoder_spec,
    kv_names,
)
from aiayn.core.folder import ModelFolder
from aiayn.engines import ONNX_PORTABLE
from aiayn.engines.onnx.portable.state_io import BoundIO, HostIO
from aiayn.engines.onnx.portable.top_k import with_top_k_head
from aiayn.engines.onnx.sessions import REEXPORT, check_graph, check_stamp, open_on_device
from aiayn.engines.placement import Placement
from aiayn.engines.state import DecoderState


class PortableOnnxEngine:
    """Encoder and decoder sessions of a model folder; an ``aiayn.engines.Engine``."""

    name = ONNX_PORTABLE

    def __init__(self, config: ModelConfig, io: HostIO | BoundIO, provider: str, lanes: int = 1) -> None:
        self.config, self.io, self.provider, self.lanes = config, io, provider, lanes
        tokens = config.special_tokens
        self.bos_id, self.eos_id, self.pad_id = tokens.bos, tokens.eos, tokens.pad
        self.never_generate = config.never_generate
        self.vocab_size = config.vocab_size
        self.cross_names = kv_names(config, "cross")
        self.past_names = kv_names(config, "past")
        self.present_names = kv_names(config, "present")
        self.top_names = [t.name for t in TOP_K_OUTPUTS]

    @classmethod
    def load(cls, folder: ModelFolder | str | Path, placement: Placement) -> PortableOnnxEngine:
        """Open and check a model folder's graphs of the placement's variant (the fp32, int8 or fp16 files), where it
        says, on its threads, for its lanes; a GPU's placement keeps the state on the device (its rehearsal on the
        CPU runs the same code path with host OrtValues, which is how it is tested without a GPU)."""
        folder = folder if isinstance(folder, ModelFolder) else ModelFolder(Path(folder))
        variant = placement.variant
        files = [folder.onnx_file(ENCODER_FILE, variant), folder.onnx_file(DECODER_FILE, variant)]
        fix = REEXPORT.format(folder=folder.path) + ("" if variant == "fp32" else f" --variant {variant}")
        folder.require([folder.config_file, folder.tokenizer_file, folder.weights_file, *files], fix)
        folder.check_weights()  # else a damaged file shows up as a hash mismatch that blames the graphs
        config = folder.config
        encoder = open_on_device(files[0], files[0], placement)
        try:
            headed = with_top_k_head(files[1].read_bytes())
        except ValueError as err:  # what ONNX Runtime would refuse too, found as the head is added
            raise ValueError(f"ONNX Runtime cannot load {files[1]}: {err}; {fix}") from None
        decoder = open_on_device(files[1], headed, placement)
        for session, spec, path in (
            (encoder, encoder_spec(config), files[0]),
            (decoder, decoder_with_top_k_spec(config), files[1]),
        ):
            check_graph(session, spec, path)
            check_stamp(session, config, folder.weights_sha256, path)
        io = BoundIO(encoder, decoder, placement) if placement.for_gpu else HostIO(encoder, decoder)
        return cls(config, io, encoder.get_providers()[0], placement.lanes)

    def start(self, src_ids: np.ndarray) -> DecoderState[Any]:
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        src_mask, cross = self.io.encode({SRC_IDS: src_ids}, self.cross_names, src_ids != self.pad_id)
        return DecoderState.start(src_mask, cross, src_ids.shape[0])

    def run_decoder(
        self, state: DecoderState[Any], tgt_ids: np.ndarray, host_outputs: list[str], k: int = 1
    ) -> tuple[list[np.ndarray], list[Any]]:
        """The decoder's ``host_outputs`` as NumPy arrays, and the present keys/values, after feeding ``tgt_ids``;
        ``k`` is the selection head's ``top_k``."""
        feeds: dict[str, np.ndarray] = {
            TGT_IDS: np.ascontiguousarray(tgt_ids, dtype=np.int64),
            POSITION_OFFSET: np.array(state.past_len, dtype=np.int64),
            TOP_K_INPUT.name: np.array([k], dtype=np.int64),
        }
        inputs = {SRC_MASK: state.src_mask, **dict(zip(self.cross_names, state.cross, strict=True))}
        if state.past:
            inputs.update(zip(self.past_names, state.past, strict=True))
        else:  # nothing cached yet: (rows, heads, 0, d_head)
            empty = np.zeros((state.rows, self.config.n_heads, 0, self.config.d_head), dtype=np.float32)
            feeds.update(dict.fromkeys(self.past_names, empty))
        return self.io.decode(feeds, inputs, host_outputs, self.present_names)

    def step(self, state: DecoderState[Any], tgt_ids: np.ndarray) -> tuple[np.ndarray, DecoderState[Any]]:
        (log_probs,), present = self.run_decoder(state, tgt_ids, [LOG_PROBS])
        return log_probs[:, -1], state.advance(present, tgt_ids.shape[1])  # (rows, vocab)

    def step_top(
        self, state: DecoderState[Any], tgt_ids: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray, DecoderState[Any]]:
        (values, ids), present = self.run_decoder(state, tgt_ids, self.top_names, min(k, self.vocab_size))
        return values[:, -1], ids[:, -1], state.advance(present, tgt_ids.shape[1])  # (rows, k) each

    def select(self, state: DecoderState[Any], rows: np.ndarray) -> DecoderState[Any]:
        return state.select(rows, self.io.take)

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """Last decoder layer's cross-attention over a whole output: (batch, heads, out_len, src_len)."""
        (weights,), _ = self.run_decoder(self.start(src_ids), out_ids, [CROSS_ATTENTION])
        return weights
