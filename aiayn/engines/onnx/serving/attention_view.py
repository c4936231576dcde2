"""The page's attention view: the last decoder layer's cross-attention weights over a whole output (§3.2.1,
softmax(QKᵀ/√d_k) written out), from two graphs built from the folder's weights the first time a view is asked for.

The serving graphs cannot give them: their attention kernels (``MultiHeadAttention``, ``GroupQueryAttention``)
return no weights. The contract's decoder can, but only where `aiayn export MODEL` has written it, and a folder
that was trained, imported or exported as a Space serves without it. So the view builds its own pair from
``model.safetensors``, as the serving engines build theirs (``graph_builder.GraphBuilder``: the same layers, norms
and stacks): the serving encoder, whose cross keys and values the decoder reads, and a decoder that takes the
whole output at once (teacher forcing, a causal mask instead of a cache) and outputs what the heatmap shows.
fp32, whatever the variant served; held only by a page that draws heatmaps.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from safetensors.numpy import load_file

from aiayn.core.config import ModelConfig
from aiayn.core.contract import CROSS_ATTENTION, SRC_IDS, SRC_MASK, TGT_IDS, GraphSpec, TensorSpec
from aiayn.core.folder import ModelFolder
from aiayn.core.weight_spec import (
    CROSS_ATTN,
    DECODER_NORM,
    FEED_FORWARD,
    SELF_ATTN,
    W_K,
    W_O,
    W_Q,
    W_V,
    decoder_layer,
    norm,
    sublayer,
)
from aiayn.engines.onnx.external_data import EXTERNAL_DATA_FILE, ExternalData
from aiayn.engines.onnx.serving.graph_builder import GraphBuilder, Sublayers
from aiayn.engines.onnx.serving.graphs import build_encoder, graphs_directory
from aiayn.engines.onnx.serving.spec import CROSS_KV, serving_encoder_spec
from aiayn.engines.onnx.sessions import CPU, check_built_graph, open_session

ATTENTION_DECODER = "attention decoder"
BLOCKED = -10000.0  # added to a masked score: exp underflows to exactly 0, as in the serving graphs


def attention_decoder_spec(config: ModelConfig) -> GraphSpec:
    n_kv = 2 * config.n_decoder_layers
    return GraphSpec(
        ATTENTION_DECODER,
        inputs=(
            TensorSpec(TGT_IDS, "int64", ("batch", "out_len"), "`<s>` and the output's ids (teacher forcing)"),
            TensorSpec(SRC_MASK, "int32", ("batch", "src_len"), "1 where the source is a real token, 0 on padding"),
            TensorSpec(
                CROSS_KV,
                "float32",
                (n_kv, "batch", config.n_heads, "src_len", config.d_head),
                "the serving encoder's cross keys and values",
            ),
        ),
        outputs=(
            TensorSpec(
                CROSS_ATTENTION,
                "float32",
                ("batch", config.n_heads, "out_len", "src_len"),
                "last decoder layer's cross-attention weights",
            ),
        ),
    )


def scaled_dot_product(g: GraphBuilder, q: str, k: str, v: str, bias: str, d_head: int) -> tuple[str, str]:
    """§3.2.1 over (batch, heads, len, d_head): (softmax(QKᵀ/√d_k + bias) V, the softmax's weights)."""
    scores = g.op1("MatMul", [q, g.op1("Transpose", [k], "kT", perm=[0, 1, 3, 2])], "scores")
    scale = g.const(g.fresh("scale"), np.array(1.0 / math.sqrt(d_head), np.float32))
    weights = g.op1("Softmax", [g.op1("Add", [g.op1("Mul", [scores, scale], "scaled"), bias], "masked")], "w", axis=-1)
    return g.op1("MatMul", [weights, v], "attended"), weights


def build_attention_decoder(config: ModelConfig, weights: dict[str, np.ndarray], external: ExternalData) -> bytes:
    """tgt_ids (batch, out_len), src_mask, cross_kv → cross_attention (batch, heads, out_len, src_len)."""
    g = GraphBuilder(weights, external)
    heads, d_head = config.n_heads, config.d_head
    split_shape = g.const("split_shape", np.array([0, 0, heads, d_head]))
    merged_shape = g.const("merged_shape", np.array([0, 0, config.d_model]))

    def split_heads(x: str) -> str:  # (batch, len, d) → (batch, heads, len, d_head)
        return g.op1("Transpose", [g.op1("Reshape", [x, split_shape], "bshd")], "bhsd", perm=[0, 2, 1, 3])

    def merge_heads(x: str) -> str:  # (batch, heads, len, d_head) → (batch, len, d)
        return g.op1("Reshape", [g.op1("Transpose", [x], "bshd", perm=[0, 2, 1, 3]), merged_shape], "bsd")

    one, two = g.const("one", np.array([1])), g.const("two", np.array([2]))
    out_len = g.op1("Slice", [g.op1("Shape", [TGT_IDS], "shape"), one, two], "out_len")
    positions = g.op1("Slice", [g.positions(config), g.const("zero", np.array([0])), out_len], "pos")  # (out_len, d)
    x = g.op1("Add", [g.embed(config, TGT_IDS), positions], "x")  # (batch, out_len, d)
    square = g.op1("Concat", [out_len, out_len], "square", axis=0)
    ones = g.op1("ConstantOfShape", [square], "ones", value=onnx.helper.make_tensor("", 1, [1], [1.0]))
    future = g.op1("Trilu", [ones, g.const("above", np.array(1))], "future", upper=1)  # (out_len, out_len)
    blocked = g.const("blocked", np.array(BLOCKED, np.float32))
    causal = g.op1("Mul", [future, blocked], "causal")
    padding = g.op1("Sub", [g.const("all", np.array(1.0, np.float32)), g.op1("Cast", [SRC_MASK], "m", to=1)], "pad")
    source = g.op1("Unsqueeze", [g.op1("Mul", [padding, blocked], "src"), g.const("axes", np.array([1, 2]))], "src4")
    axes = g.const("first_axis", np.array([0]))
    cross_weights: list[str] = []

    def self_attention(h: str, prefix: str) -> str:
        q, k, v = (split_heads(g.linear(h, [f"{prefix}.{w}"], w)) for w in (W_Q, W_K, W_V))
        attended, _ = scaled_dot_product(g, q, k, v, causal, d_head)
        return g.linear(merge_heads(attended), [f"{prefix}.{W_O}"], "wo")

    def cross_attention(h: str, prefix: str, i: int) -> str:
        q = split_heads(g.linear(h, [f"{prefix}.{W_Q}"], "q"))
        k, v = (  # (batch, heads, src_len, d_head) each
            g.op1("Squeeze", [g.op1("Gather", [CROSS_KV, g.const(g.fresh("slot"), np.array([j]))], "kv"), axes], "kv")
            for j in (2 * i, 2 * i + 1)
        )
        attended, weights = scaled_dot_product(g, q, k, v, source, d_head)
        cross_weights.append(weights)
        return g.linear(merge_heads(attended), [f"{prefix}.{W_O}"], "wo")

    sublayers: Sublayers = []
    for i in range(config.n_decoder_layers):
        own, other, feed_forward = (sublayer(decoder_layer(i), n) for n in (SELF_ATTN, CROSS_ATTN, FEED_FORWARD))
        sublayers.append((norm(own), partial(self_attention, prefix=own)))
        sublayers.append((norm(other), partial(cross_attention, prefix=other, i=i)))
        sublayers.append(
            (norm(feed_forward), partial(g.feed_forward, prefix=feed_forward, activation=config.activation))
        )
    g.stack(x, sublayers[:-1], DECODER_NORM, config)  # what follows the last cross-attention changes nothing shown
    g.nodes.append(onnx.helper.make_node("Identity", [cross_weights[-1]], [CROSS_ATTENTION], name="view"))
    return g.model(attention_decoder_spec(config))


class AttentionView:
    """The serving encoder and the attention decoder, built from a folder's weights; one thread each."""

    def __init__(self, config: ModelConfig, encoder: ort.InferenceSession, decoder: ort.InferenceSession) -> None:
        self.pad_id = config.special_tokens.pad
        self.encoder, self.decoder = encoder, decoder

    @classmethod
    def build(cls, folder: ModelFolder) -> AttentionView:
        config = folder.config
        weights = load_file(str(folder.weights_file))
        with graphs_directory() as directory:
            external = ExternalData(directory / EXTERNAL_DATA_FILE)
            try:
                graphs = {
                    "encoder": build_encoder(config, weights, external),
                    "decoder": build_attention_decoder(config, weights, external),
                }
            finally:
                external.close()
            paths = {name: directory / f"{name}.onnx" for name in graphs}
            for name, graph in graphs.items():
                Path(paths[name]).write_bytes(graph)
            encoder, decoder = (open_session(paths[name], [CPU], threads=1) for name in graphs)
        check_built_graph(encoder, serving_encoder_spec(config))
        check_built_graph(decoder, attention_decoder_spec(config))
        return cls(config, encoder, decoder)

    def cross_attention(self, src_ids: np.ndarray, out_ids: np.ndarray) -> np.ndarray:
        """(batch, heads, out_len, src_len) for ``src_ids`` (batch, src_len) and ``out_ids`` (batch, out_len)."""
        src_ids = np.ascontiguousarray(src_ids, dtype=np.int64)
        src_mask = (src_ids != self.pad_id).astype(np.int32)
        (cross,) = self.encoder.run([CROSS_KV], {SRC_IDS: src_ids, SRC_MASK: src_mask})
        feeds = {TGT_IDS: np.ascontiguousarray(out_ids, dtype=np.int64), SRC_MASK: src_mask, CROSS_KV: cross}
        (weights,) = self.decoder.run([CROSS_ATTENTION], feeds)
        return np.asarray(weights)
