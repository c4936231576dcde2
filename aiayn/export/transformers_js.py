"""The ONNX graphs transformers.js loads beside a transformers folder: ``onnx/encoder_model.onnx`` and
``onnx/decoder_model_merged.onnx`` (`aiayn export MODEL --to transformers --transformers-js`).

transformers.js runs a ``MarianMTModel`` from the layout Optimum writes: an encoder graph (``input_ids`` →
``last_hidden_state``) and one decoder graph for every step, fed the step's ``input_ids``, the encoder's output and
its mask, and the self-attention keys and values so far under Optimum's names (``past_key_values.N.decoder.key``,
returned as ``present.N.decoder.key``). It feeds a graph only the inputs the graph declares, and starts the cache
from the declared shapes (the ``batch_size`` axis is the batch, every other named axis 0: the first step has no
past). Optimum's merged decoder also caches the cross-attention's keys and values behind an ``If`` on
``use_cache_branch``; this one projects them from the encoder's output at each step instead, one graph with no
branch, which costs a little time and changes no number.

The graphs are the folder's own model (``aiayn.model``), exported as `aiayn export --to onnx` exports it
(``onnx_export``): the function `aiayn translate` computes, LayerNorm's ε and all, where ``model.safetensors`` is
Marian's (ε 1e-5). Their inputs and outputs are declared here, Optimum's names, as the contract declares ours.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

import aiayn
from aiayn.convert.transformers_layout import FOLDED_START_BIAS
from aiayn.core.config import ModelConfig
from aiayn.core.contract import EXPORTER_KEY, GraphSpec, TensorSpec, stamp
from aiayn.core.folder import ModelFolder
from aiayn.export.onnx_export import export_graph, finish_graph, require_folder_weights
from aiayn.model.cache import KVCache
from aiayn.model.transformer import Transformer
from aiayn.model.weights import load_model

ENCODER_MODEL = "encoder_model.onnx"
DECODER_MODEL = "decoder_model_merged.onnx"  # the one decoder file transformers.js loads for a seq2seq model
BATCH = "batch_size"  # the one axis transformers.js sizes when it starts the cache: the name must be this


def self_attention_cache(config: ModelConfig, prefix: str, length: str) -> tuple[TensorSpec, ...]:
    """``prefix.N.decoder.key``/``.value`` per decoder layer: (batch_size, heads, ``length``, d_head)."""
    shape = (BATCH, config.n_heads, length, config.d_head)
    return tuple(
        TensorSpec(
            f"{prefix}.{layer}.decoder.{kind}", "float32", shape, f"decoder layer {layer}'s self-attention {kind}s"
        )
        for layer in range(config.n_decoder_layers)
        for kind in ("key", "value")
    )


def encoder_model_spec(config: ModelConfig) -> GraphSpec:
    return GraphSpec(
        ENCODER_MODEL,
        inputs=(TensorSpec("input_ids", "int64", (BATCH, "encoder_sequence_length"), "source ids ending in </s>"),),
        outputs=(
            TensorSpec(
                "last_hidden_state", "float32", (BATCH, "encoder_sequence_length", config.d_model), "encoder output"
            ),
        ),
    )


def decoder_model_spec(config: ModelConfig, folded: bool) -> GraphSpec:
    return GraphSpec(
        DECODER_MODEL,
        inputs=(
            TensorSpec("input_ids", "int64", (BATCH, "decoder_sequence_length"), "target ids after the cached ones"),
            TensorSpec("encoder_attention_mask", "int64", (BATCH, "encoder_sequence_length"), "1 on real source ids"),
            TensorSpec(
                "encoder_hidden_states",
                "float32",
                (BATCH, "encoder_sequence_length", config.d_model),
                "the encoder's last_hidden_state",
            ),
            *self_attention_cache(config, "past_key_values", "past_decoder_sequence_length"),
        ),
        outputs=(
            TensorSpec(
                "logits", "float32", (BATCH, "decoder_sequence_length", config.vocab_size + folded), "next-token logits"
            ),
            *self_attention_cache(config, "present", "total_decoder_sequence_length"),
        ),
    )


class EncoderModel(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.model.encode(input_ids)  # (batch, src_len, d_model)


class DecoderModel(nn.Module):
    """One step: the cross-attention's keys and values projected from the encoder's output, the position of the
    first new token read off the past keys' length. Where the folder's start is folded (``FOLDED_START``), the
    written model's start id, one past our vocabulary, is our <s>, and its logit is the appended row's, its bias."""

    def __init__(self, model: Transformer, folded: bool) -> None:
        super().__init__()
        self.model = model
        self.folded = folded

    def forward(
        self, input_ids: Tensor, encoder_attention_mask: Tensor, encoder_hidden_states: Tensor, *past: Tensor
    ) -> tuple[Tensor, ...]:
        cross = self.model.start_cache(encoder_hidden_states).cross_kv
        offset = torch._shape_as_tensor(past[0])[2]  # a Shape in the graph, not the traced length
        allowed = encoder_attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, src_len)
        config = self.model.config
        if self.folded:
            input_ids = torch.where(input_ids == config.vocab_size, config.special_tokens.bos, input_ids)
        out = self.model.decode(input_ids, KVCache(past, cross), allowed, offset=offset)
        logits = out.logits  # (batch, new_len, vocab)
        if self.folded:
            start = logits.new_full((*logits.shape[:2], 1), FOLDED_START_BIAS)
            logits = torch.cat([logits, start], dim=-1)  # (batch, new_len, vocab + 1)
        return (logits, *out.cache.self_kv)


def example_inputs(config: ModelConfig) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Tracing inputs, every dynamic size ≥ 2 and distinct so that none is frozen."""
    batch, src_len, past_len, new_len = 3, 7, 4, 2
    input_ids = torch.randint(4, config.vocab_size, (batch, src_len))
    mask = torch.ones(batch, src_len, dtype=torch.int64)
    mask[0, -2:] = 0
    input_ids[0, -2:] = config.special_tokens.pad
    memory = torch.randn(batch, src_len, config.d_model)
    past = [torch.randn(batch, config.n_heads, past_len, config.d_head) for _ in range(2 * config.n_decoder_layers)]
    return (input_ids,), (torch.randint(4, config.vocab_size, (batch, new_len)), mask, memory, *past)


def write_transformers_js_graphs(folder: ModelFolder, target: Path, folded: bool) -> list[Path]:
    """``target`` (new) with the two graphs of the folder's model (weights stored as float16, as in the folder, and
    computed in float32), which start from the appended row's id where ``folded``; the files written."""
    model = load_model(folder).eval().to("cpu")
    require_folder_weights(model, folder)
    config = model.config
    metadata = {
        **stamp(config, folder.weights_sha256),
        EXPORTER_KEY: f"aiayn {aiayn.__version__}, torch {torch.__version__}",
    }
    target.mkdir()
    encoder_args, decoder_args = example_inputs(config)
    written = []
    with tempfile.TemporaryDirectory(prefix="aiayn-transformers-js-") as tmp, torch.no_grad():
        for module, args, spec in (
            (EncoderModel(model), encoder_args, encoder_model_spec(config)),
            (DecoderModel(model, folded), decoder_args, decoder_model_spec(config, folded)),
        ):
            draft = Path(tmp) / spec.file
            export_graph(module, args, spec, draft)
            finish_graph(draft, spec, metadata)
            written.append(Path(draft.replace(target / spec.file)))
    return written
