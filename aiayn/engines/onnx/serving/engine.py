"""The serving engine: what ``--engine onnx`` runs, on a CPU and on a GPU alike.

The serving graphs (``graphs.py``) are built from a folder's ``model.safetensors`` when the engine loads, for
one device's ops (``spec.py``; which ops a variant takes on a device: ``aiayn.engines.WEIGHTS``), and run under the
search's step interface with their selection head inside: only each row's k best ids and log-probabilities leave
ONNX Runtime. The two devices differ where they really do, as data and as one state back end:

- the ops: on a CPU GroupQueryAttention over per-row lengths, in fp32 or its w8, w4 (``block_quant.py``) and int8
  (``row_int8.py``) weights; on CUDA the new key/value scattered into the cache and MultiHeadAttention over it, every
  position on the device, fp32 or fp16;
- the state: on a CPU NumPy buffers bound in place (``host_buffers.py``); on a GPU buffers in the device's memory at
  addresses that stay put, each step a captured CUDA graph's replay (``device_buffers.py``).

The CUDA graphs also run on the CPU provider (a GPU's placement rehearsed: ``Placement.rehearsal``), with their own
state back end: that is how they are proven without a GPU, under CUDA's binding rules (``tests/conftest.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file

from aiayn.core.folder import ModelFolder
from aiayn.engines import ONNX, SERVING_VARIANTS
from aiayn.engines.onnx.serving import spec
from aiayn.engines.onnx.serving.attention_view import AttentionView
from aiayn.engines.onnx.serving.device_buffers import DeviceBuffers
from aiayn.engines.onnx.serving.graphs import build_serving_graphs, graphs_directory
from aiayn.engines.onnx.serving.host_buffers import HostBuffers
from aiayn.engines.onnx.serving.int8_kernel import weight_levels
from aiayn.engines.onnx.serving.kernel_rows import rows_for
from aiayn.engines.onnx.sessions import check_built_graph, open_on_device
from aiayn.engines.onnx.tiny_graphs import gather_model, widen_model
from aiayn.engines.placement import Placement

S = TypeVar("S")


class StateBuffers(Protocol[S]):
    """Where a device keeps the decoder state between steps (``HostBuffers``, ``DeviceBuffers``)."""

    encoder: ort.InferenceSession
    decoder: ort.InferenceSession

    def start(self, src_ids: np.ndarray) -> S: ...

    def run_step(self, state: S, tgt_ids: np.ndarray, k: int) -> tuple[tuple[np.ndarray, ...], S]: ...

    def select(self, state: S, rows: np.ndarray) -> S: ...


class ServingEngine(Generic[S]):
    """The serving graphs of one folder on one device and their state back end; an ``aiayn.engines.Engine``."""

    name = ONNX

    def __init__(self, folder: ModelFolder, ops: spec.ServingOps, buffers: StateBuffers[S], lanes: int = 1) -> None:
        self.folder, self.config, self.ops, self.buffers = folder, folder.config, ops, buffers
        self.provider = buffers.decoder.get_providers()[0]
        self.lanes = lanes
        tokens = self.config.special_tokens
        self.bos_id, self.eos_id, self.pad_id = tokens.bos, tokens.eos, tokens.pad
        self.never_generate = self.config.never_generate
        self.attention_view: AttentionView | None = None  # built from the weights for the heatmap only

    @classmethod
    def load(cls, folder: ModelFolder | str | Path, placement: Placement) -> ServingEngine[Any]:
        """Build the serving graphs of the placement's variant for its device's ops from a model folder's config.json
        and model.safetensors, and open them where it says: on a CPU, ``lanes`` searches at once over shared
        sessions (each batch binds its own buffers), each on ``threads`` intra-op threads; for a GPU, the state on
        the device and each step a captured graph."""
        folder = folder if isinstance(folder, ModelFolder) else ModelFolder.open(folder)
        ops_for, weights = placement.graphs_for, placement.weights
        if ops_for not in weights.serving:
            choices = ", ".join(SERVING_VARIANTS[ops_for])
            raise ValueError(f"--variant {placement.variant} has no serving graphs for {ops_for}; choose {choices}")
        ops, source = placement.serving_ops, str(folder.weights_file)
        folder.require([folder.weights_file], "train it with `aiayn train` or point --model elsewhere")
        folder.check_weights()
        tensors = load_file(str(folder.weights_file))  # fp16 on disk: each tensor takes its graph's dtype
        with graphs_directory() as directory:
            levels = weight_levels() if weights.int8 else 0
            paths = build_serving_graphs(folder.config, tensors, directory, source, weights.block, ops, levels)
            del tensors
            encoder = open_on_device(paths[0], paths[0], placement)
            decoder = open_on_device(paths[1], paths[1], placement, graphs=True, profiled=True)
        check_built_graph(encoder, spec.serving_encoder_spec(folder.config, ops))
        check_built_graph(decoder, spec.serving_decoder_spec(folder.config, ops))
        if not placement.for_gpu:
            buffers: StateBuffers[Any] = HostBuffers(folder.config, encoder, decoder, rows_for(weights.block))
        else:
            reorder = open_on_device(None, gather_model([(ops.dtype, 5)], axis=1), placement, graphs=True)
            widen = open_on_device(None, widen_model(ops.dtype, 5), placement)
            buffers = DeviceBuffers(folder.config, ops, placement.device, encoder, decoder, reorder, widen)
        return cls(folder, ops, buffers, placement.lanes)

    # -- the step interface ------------------------------------------------------------------------------

    def start(self, src_ids: np.ndarray) -> S:
        """Encode a batch; ``src_ids`` (batch, src_len), right-padded."""
        return self.buffers.start(src_ids)

    def run_step(self, state: S, tgt_ids: np.ndarray, k: int) -> tuple[tuple[np.ndarray, ...], S]:
        """Feed ``tgt_ids`` (rows, new_len); the head's (rows, k) values and ids after the last, and the new state."""
        return self.buffers.run_step(state, tgt_ids, k)

    def select(self, state: S, rows: np.ndarray) -> S:
        return self.buffers.select(state, rows)

    def step_top(self, state: S, tgt_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, S]:
        (values, ids), state = self.run_step(state, tgt_ids, min(k, self.config.vocab_size))
        return values, ids, state  # (rows, k) each, best first, ties to the lower id

    def step(self, state: S, tgt_ids: np.ndarray) -> tuple[np.ndarray, S]:
        """The whole log-softmax (rows, vocab); the searches only use ``step_top``."""
        (values, ids), state = self.run_step(state, tgt_ids, self.config.vocab_size)
        log_probs = np.empty_like(values)
        np.put_along_axis(log_probs, ids, values, axis=1)
        return log_probs, state

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """The attention view, from graphs built from the weights on the CPU (``attention_view.py``): (batch, heads,
        out_len, src_len)."""
        if self.attention_view is None:
            self.attention_view = AttentionView.build(self.folder)
        return self.attention_view.cross_attention(src_ids, out_ids)
