"""Serving graphs for ONNX Runtime on a CPU or a GPU, built from the weights with ``onnx.helper`` (no torch).

The same model as ``aiayn.model.transformer`` (§3: pre-LN or post-LN stacks, §3.2.2
multi-head attention, §3.4 tied embeddings scaled by √d_model, §3.5 sinusoidal
positions; and the variants an imported checkpoint may need: the feed-forward's
activation, the positions' layout, unscaled embeddings, a bias on the logits),
written with ONNX Runtime's ``com.microsoft`` contrib operators so that one decoding
step is a few dozen kernels instead of a few hundred:

- every token is one row: activations are 2-D (rows, d_model), so ONNX Runtime
  fuses MatMul + Add into Gemm and Gemm + Relu into FusedGemm (``activate``: the other
  activations);
- decoder self-attention works on a preallocated key/value buffer (rows, heads, capacity, d_head): the
  engine binds the same buffer as ``cache_*`` and ``present_*``, so the new key/value is written in place
  (no concat). The kernels are the device's (``spec.py``): ``GroupQueryAttention`` on a CPU; on
  CUDA ``ScatterElements`` into the cache and ``MultiHeadAttention`` over it, every position on the device, so that
  a step can be captured as one CUDA graph;
- cross-attention is ``MultiHeadAttention`` over the encoder's per-layer keys/values
  in BNSH layout (sentences, heads, src_len, d_head), computed once by the encoder.
  The rows of one sentence (its beams) are that sentence's query *sequence*, so the
  source side is never repeated per beam;
- the encoder is one graph with the ``Attention`` op (QKV projection inside) and outputs
  every decoder layer's cross keys/values as one tensor (2 · layers, batch, heads, src_len, d_head).

Their ops and their inputs and outputs are declared beside them in ``spec.py`` (``ServingOps``,
``serving_encoder_spec``, ``serving_decoder_spec``), which the serving engine's state back ends
(``host_buffers.py``, ``device_buffers.py``) bind by.
The fp16 graphs (CUDA) hold every weight and activation in fp16 and take the log-softmax in fp32; their output
projection is padded to a multiple of 8 columns (tensor cores), the padding sliced off before the softmax.

The ids a config never generates are no business of the graphs: the search leaves them out
(``aiayn.search.step.allowed_top``), as it does for every engine.

The weight-only variants (``block_quant.VARIANTS``: w8, w4) store every projection as ``MatMulNBits`` blocks and
the embedding lookups as ``GatherBlockQuantized``, the tied output projection included; norms, biases and positions
stay fp32. The int8 variant stores them in int8, one scale per output column, and quantizes each product's input
per row inside the graph (``row_int8.py``, ``GraphBuilder.int8_matmul``); the embedding is int8 per row.

Contrib-op masks are int32, 1 = attend; blocked scores get -10000 before the
softmax instead of -inf (exp underflows to exactly 0 either way, as long as one key is
allowed: every source holds at least </s>).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from aiayn.core.config import ModelConfig
from aiayn.core.contract import (
    SRC_IDS,
    SRC_MASK,
    TGT_IDS,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    kv_names,
)
from aiayn.core.weight_spec import (
    BIAS,
    CROSS_ATTN,
    DECODER_NORM,
    EMBEDDING,
    ENCODER_NORM,
    FEED_FORWARD,
    LOGITS_BIAS,
    SELF_ATTN,
    W_K,
    W_O,
    W_Q,
    W_V,
    WEIGHT,
    check_weights,
    decoder_layer,
    encoder_layer,
    norm,
    sublayer,
)
from aiayn.engines.onnx.block_quant import BlockScheme
from aiayn.engines.onnx.external_data import EXTERNAL_DATA_FILE, ExternalData
from aiayn.engines.onnx.serving.graph_builder import (
    MS_DOMAIN,
    GraphBuilder,
    Sublayers,
    positions_length,
)
from aiayn.engines.onnx.serving.spec import (
    CPU_OPS,
    CROSS_KV,
    GQA,
    GROUP_SHAPE,
    SCATTERED,
    SEQLENS_K,
    SERVING_DECODER,
    SERVING_ENCODER,
    TOTAL_LEN,
    ServingOps,
    serving_decoder_spec,
    serving_encoder_spec,
)


def block_size(vocab: int) -> int:
    """A divisor of ``vocab`` near √vocab for ``two_stage_top_k``, or 0 if there is none worth it."""
    root = math.isqrt(vocab)
    for offset in range(root // 2):
        for size in (root - offset, root + offset):
            if size >= 16 and vocab % size == 0 and vocab // size >= 16:
                return size
    return 0


def two_stage_top_k(g: GraphBuilder, scores: str, k: str, block: int, vocab: int, outputs: list[str]) -> None:
    """TopK(scores, k) along the vocabulary, exactly, ties to the lower id, in two cheap stages.

    ONNX Runtime's TopK costs about 6 µs per row of 10,000 here, whatever k; ReduceMax about 1 µs.
    The k best scores lie in the k blocks of ``block`` ids with the best maxima (a block holding one of
    them has a maximum at least as high, and fewer than k blocks can beat it); TopK over those k·block
    candidates, taken in ascending id order, gives the same values and ids, ties included: tied blocks
    go to the lower block, tied candidates to the lower position, and both orders are id orders.
    """
    n_blocks = vocab // block
    blocks3 = g.op1("Reshape", [scores, g.const("blocks_shape", np.array([-1, n_blocks, block]))], "blocks")
    maxima = g.op1("ReduceMax", [blocks3, g.const("block_axis", np.array([-1]))], "block_max", keepdims=0)
    k_blocks = g.op1("Min", [k, g.const("n_blocks", np.array([n_blocks]))], "k_blocks")  # (1,)
    _, best = g.op("TopK", [maxima, k_blocks], "best_blocks", 2, axis=-1)  # (rows, k) best first
    ascending, _ = g.op("TopK", [best, k_blocks], "sorted_blocks", 2, axis=-1, largest=0)  # (rows, k) by id
    picked = g.op1("GatherND", [blocks3, g.op1("Unsqueeze", [ascending, "block_axis"], "idx")], "picked", batch_dims=1)
    candidates = g.op1("Reshape", [picked, g.const("rows_flat", np.array([0, -1]))], "candidates")  # (rows, k·block)
    values, position = g.op("TopK", [candidates, k], "top", 2, axis=-1)
    block_const = g.const("block", np.array(block, np.int64))
    of_block = g.op1("GatherElements", [ascending, g.op1("Div", [position, block_const], "slot")], "of_block", axis=1)
    ids = g.op1(
        "Add", [g.op1("Mul", [of_block, block_const], "base"), g.op1("Mod", [position, block_const], "off")], "ids"
    )
    g.nodes.append(helper.make_node("Identity", [values], [outputs[0]], name="top_values"))
    g.nodes.append(helper.make_node("Identity", [ids], [outputs[1]], name="top_ids"))


def build_encoder(
    config: ModelConfig,
    weights: Mapping[str, np.ndarray],
    external: ExternalData,
    scheme: BlockScheme | None = None,
    ops: ServingOps = CPU_OPS,
    int8_levels: int = 0,
) -> bytes:
    """src_ids (batch, src_len) int64 and src_mask (batch, src_len) int32 →
    cross_kv (2 · decoder layers, batch, heads, src_len, d_head): layer i's keys at 2i, values at 2i + 1."""
    g = GraphBuilder(weights, external, scheme, ops.dtype, int8_levels)
    d, heads, d_head, n_dec = config.d_model, config.n_heads, config.d_head, config.n_decoder_layers
    table = g.positions(config)
    shape = g.op1("Shape", [SRC_IDS], "shape")  # [batch, src_len]
    src_len = g.op1("Slice", [shape, g.const("one", np.array([1])), g.const("two", np.array([2]))], "src_len")
    positions = g.op1("Slice", [table, g.const("zero", np.array([0])), src_len], "pos")  # (src_len, d)
    tokens = g.op1("Reshape", [g.embed(config, SRC_IDS), g.const("rows_d", np.array([-1, d]))], "tok2d")
    positions = g.op1(
        "Tile",
        [
            positions,
            g.op1(
                "Concat", [g.op1("Slice", [shape, "zero", "one"], "b"), g.const("one_", np.array([1]))], "reps", axis=0
            ),
        ],
        "pos2d",
    )
    bsd = g.op1("Concat", [shape, g.const("d_only", np.array([d]))], "bsd3", axis=0)  # [batch, src_len, d]
    bs3d = g.op1("Concat", [shape, g.const("3d_only", np.array([3 * d]))], "bs3d", axis=0)  # [batch, src_len, 3d]

    def self_attention(h: str, prefix: str) -> str:
        """Over (batch, src_len, d) with the padding mask: fp32, the Attention op with the QKV projection inside;
        quantized, that projection as one product (``GraphBuilder.matmul``) and MultiHeadAttention over its three
        parts."""
        names = [f"{prefix}.{W_Q}", f"{prefix}.{W_K}", f"{prefix}.{W_V}"]
        if not g.quantized:
            w = np.concatenate([g.weight(f"{n}.{WEIGHT}") for n in names], axis=0).T  # (d, 3d)
            b = np.concatenate([g.weight(f"{n}.{BIAS}") for n in names])
            h3 = g.op1("Reshape", [h, bsd], "h3")
            attention = [h3, g.const(g.fresh("attn.w"), w), g.const(g.fresh("attn.b"), b), SRC_MASK]
            out = g.op1("Attention", attention, "attn", MS_DOMAIN, num_heads=heads)
        else:
            qkv = g.op1("Reshape", [g.linear(h, names, "qkv"), bs3d], "qkv3")  # (batch, src_len, 3d)
            q, k, v = g.op("Split", [qkv], "split", 3, axis=-1, num_outputs=3)
            out = g.op1("MultiHeadAttention", [q, k, v, "", SRC_MASK], "attn", MS_DOMAIN, num_heads=heads)
        return g.linear(g.op1("Reshape", [out, "rows_d"], "o2d"), [f"{prefix}.{W_O}"], "wo")

    feed_forward_of = partial(g.feed_forward, activation=config.activation)
    sublayers: Sublayers = []
    for i in range(config.n_encoder_layers):
        attention, feed_forward = (sublayer(encoder_layer(i), name) for name in (SELF_ATTN, FEED_FORWARD))
        sublayers.append((norm(attention), partial(self_attention, prefix=attention)))
        sublayers.append((norm(feed_forward), partial(feed_forward_of, prefix=feed_forward)))
    x = g.stack(g.op1("Add", [tokens, positions], "x"), sublayers, ENCODER_NORM, config)
    # All decoder layers' cross keys and values in one Gemm: (rows, 2 · layers · d).
    cross = [f"{sublayer(decoder_layer(i), CROSS_ATTN)}.{w}" for i in range(n_dec) for w in (W_K, W_V)]
    kv = g.linear(x, cross, "cross_kv")
    kv_shape = g.op1("Concat", [shape, g.const("kv_tail", np.array([2 * n_dec, heads, d_head]))], "kv_shape", axis=0)
    kv = g.op1("Reshape", [kv, kv_shape], "kv5")  # (batch, src_len, 2 · layers, heads, d_head)
    g.nodes.append(helper.make_node("Transpose", [kv], [CROSS_KV], name="cross_kv_bnsh", perm=[2, 0, 3, 1, 4]))
    return g.model(serving_encoder_spec(config, ops))


Attend = Callable[[str, list[str], list[str]], str]  # (packed (rows, 1, 3d) Q, K, V; cache; present) → (rows, 1, d)


def group_query_attention(g: GraphBuilder, config: ModelConfig) -> Attend:
    """GroupQueryAttention over packed Q, K, V at each row's ``seqlens_k``, appending to the cache in place."""

    def attend(qkv: str, cache: list[str], present: list[str]) -> str:
        heads = config.n_heads
        inputs = [qkv, "", "", *cache, SEQLENS_K, TOTAL_LEN]
        out = g.op1("GroupQueryAttention", inputs, "gqa", MS_DOMAIN, num_heads=heads, kv_num_heads=heads)
        g.nodes[-1].output.extend(present)  # the cache buffers, bound again: in place
        return out

    return attend


def scattered_attention(g: GraphBuilder, config: ModelConfig) -> Attend:
    """The new key and value written into the cache (rows, heads, capacity, d_head) at each row's ``seqlens_k`` by
    ScatterElements, in place (its output is bound to its input's buffer), then MultiHeadAttention of the new query
    over the whole cache with its unfilled positions masked.

    Every position comes from ``seqlens_k`` on the device, and the one shape a kernel reads from host memory comes
    straight from a ``Shape`` node: no node falls back to the CPU, nothing is copied between host and device, so the
    step is one CUDA graph for ONNX Runtime to capture (``device_buffers.py``). A cache's unfilled positions hold zeros
    or an earlier batch's values, never NaN or infinity: masked, they weigh exactly 0."""
    heads, d_head = config.n_heads, config.d_head
    # Once per step, for every layer: each row's position shaped as one new key (Expand broadcasts), and the mask of
    # the filled positions (rows, capacity), 1 up to and including the new one.
    at = g.op1("Reshape", [SEQLENS_K, g.const("rows_1_1_1", np.array([-1, 1, 1, 1]))], "at")
    write_at = g.op1("Expand", [at, g.const("one_key", np.array([1, heads, 1, d_head]))], "write_at")
    capacity = g.op1("Shape", [kv_names(config, "cache")[0]], "capacity", start=2, end=3)  # [capacity]
    every_position = np.arange(positions_length(config), dtype=np.int32)[None, :]
    positions = g.op1(
        "Slice",
        [
            g.const("cache_positions", every_position),
            g.const("from_0", np.array([0])),
            capacity,
            g.const("axis_1", np.array([1])),
        ],
        "positions",
    )  # (1, capacity)
    last = g.op1("Reshape", [SEQLENS_K, g.const("rows_1", np.array([-1, 1]))], "last")  # (rows, 1)
    filled = g.op1("Less", [positions, g.op1("Add", [last, g.const("one_i32", np.array(1, np.int32))], "end")], "lt")
    filled_mask = g.op1("Cast", [filled], "filled_mask", to=onnx.TensorProto.INT32)
    one_position = g.const("one_position", np.array([-1, heads, 1, d_head]))

    def attend(qkv: str, cache: list[str], present: list[str]) -> str:
        q, k, v = g.op("Split", [qkv], "split", 3, axis=-1, num_outputs=3)  # (rows, 1, d) each
        for past, new, written in zip(cache, (k, v), present, strict=True):  # (rows, heads, 1, d_head): free
            new4 = g.op1("Reshape", [new, one_position], "new4")
            scatter = helper.make_node("ScatterElements", [past, write_at, new4], [written], g.fresh("scatter"), axis=2)
            g.nodes.append(scatter)
        mha = [q, present[0], present[1], "", filled_mask]
        return g.op1("MultiHeadAttention", mha, "mha", MS_DOMAIN, num_heads=heads)

    return attend


SELF_ATTENTION: dict[str, Callable[[GraphBuilder, ModelConfig], Attend]] = {
    GQA: group_query_attention,
    SCATTERED: scattered_attention,
}


def padded_columns(w: np.ndarray, multiple: int) -> np.ndarray:
    """``w`` (in, out) with zero columns up to a multiple of ``multiple``."""
    return np.pad(w, ((0, 0), (0, -w.shape[1] % multiple)))


def build_decoder(
    config: ModelConfig,
    weights: Mapping[str, np.ndarray],
    external: ExternalData,
    scheme: BlockScheme | None = None,
    ops: ServingOps = CPU_OPS,
    int8_levels: int = 0,
) -> bytes:
    """One new token per row after the cached ones → its ``k`` best next tokens (log-softmax, then TopK over the
    best blocks of the vocabulary, ``two_stage_top_k``, where the vocabulary divides into blocks).

    The cache buffers ``cache_*`` (rows, heads, capacity, d_head) come back as ``present_*`` of the same
    shape: bind one buffer to both and the self-attention kernel (``ops.self_attention``) appends in place. Rows
    are grouped by sentence (``group_shape``): rows r·k … r·k + k - 1 attend over sentence r's ``cross_*`` and
    ``src_mask``.
    """
    g = GraphBuilder(weights, external, scheme, ops.dtype, int8_levels)
    d, heads = config.d_model, config.n_heads
    tokens = g.embed(config, TGT_IDS)  # (rows, d)
    positions = g.op1("Gather", [g.positions(config), SEQLENS_K], "pos")  # (rows, d)
    rows_d = g.const("rows_d", np.array([-1, d]))
    rows_1_3d = g.const("rows_1_3d", np.array([-1, 1, 3 * d]))
    cross, cache, present = (kv_names(config, prefix) for prefix in ("cross", "cache", "present"))
    attend = SELF_ATTENTION[ops.self_attention](g, config)

    def self_attention(h: str, prefix: str, i: int) -> str:
        qkv = g.linear(h, [f"{prefix}.{W_Q}", f"{prefix}.{W_K}", f"{prefix}.{W_V}"], "qkv")  # (rows, 3d)
        qkv = g.op1("Reshape", [qkv, rows_1_3d], "qkv3")  # (rows, 1, 3d): packed Q, K, V
        out = attend(qkv, cache[2 * i : 2 * i + 2], present[2 * i : 2 * i + 2])
        return g.linear(g.op1("Reshape", [out, rows_d], "o2d"), [f"{prefix}.{W_O}"], "wo")

    def cross_attention(h: str, prefix: str, i: int) -> str:
        q = g.linear(h, [f"{prefix}.{W_Q}"], "q")  # (rows, d)
        q = g.op1("Reshape", [q, GROUP_SHAPE], "q3")  # (sentences, rows per sentence, d)
        out = g.op1(
            "MultiHeadAttention",
            [q, cross[2 * i], cross[2 * i + 1], "", SRC_MASK],
            "xattn",
            MS_DOMAIN,
            num_heads=heads,
        )
        return g.linear(g.op1("Reshape", [out, rows_d], "o2d"), [f"{prefix}.{W_O}"], "wo")

    feed_forward_of = partial(g.feed_forward, activation=config.activation)
    sublayers: Sublayers = []
    for i in range(config.n_decoder_layers):
        own, other, feed_forward = (sublayer(decoder_layer(i), n) for n in (SELF_ATTN, CROSS_ATTN, FEED_FORWARD))
        sublayers.append((norm(own), partial(self_attention, prefix=own, i=i)))
        sublayers.append((norm(other), partial(cross_attention, prefix=other, i=i)))
        sublayers.append((norm(feed_forward), partial(feed_forward_of, prefix=feed_forward)))
    x = g.stack(g.op1("Add", [tokens, positions], "x"), sublayers, DECODER_NORM, config)  # (rows, d)
    vocabulary_head(g, config, x, ops)
    return g.model(serving_decoder_spec(config, ops))


def vocabulary_head(g: GraphBuilder, config: ModelConfig, x: str, ops: ServingOps) -> None:
    """The decoder's last states ``x`` (rows, d) → each row's ``k`` best next tokens and their log-probabilities."""
    vocab = config.vocab_size
    # §3.4: the pre-softmax projection is the embedding matrix (unscaled), transposed (d, vocab).
    projection = padded_columns(g.weight(EMBEDDING).T, ops.logits_multiple)  # (d, padded vocab)
    logits = g.matmul(x, np.ascontiguousarray(projection), "logits")  # (rows, padded vocab)
    if projection.shape[1] != vocab:
        ends = [g.const(name, np.array([n])) for name, n in (("vocab_from", 0), ("vocab_to", vocab), ("cols", 1))]
        logits = g.op1("Slice", [logits, *ends], "logits")  # (rows, vocab)
    if config.logits_bias:  # Marian's final_logits_bias; ORT fuses the Add into the MatMul's Gemm
        logits = g.op1("Add", [logits, g.const("logits_bias", g.weight(LOGITS_BIAS))], "biased")
    if g.dtype != np.float32:  # the softmax's sum and the scores the search adds up stay fp32
        logits = g.op1("Cast", [logits], "logits32", to=onnx.TensorProto.FLOAT)
    log_probs = g.op1("LogSoftmax", [logits], "log_probs", axis=-1)
    if ops.two_stage_top_k and (block := block_size(vocab)):
        two_stage_top_k(g, log_probs, TOP_K, block, vocab, [TOP_LOG_PROBS, TOP_IDS])
    else:
        g.nodes.append(helper.make_node("TopK", [log_probs, TOP_K], [TOP_LOG_PROBS, TOP_IDS], name="top_k", axis=-1))


@contextmanager
def graphs_directory() -> Iterator[Path]:
    """A temporary directory for the serving graphs while their sessions are built (the sessions keep nothing of
    it); a write that fails says where, and how to make room."""
    try:
        with tempfile.TemporaryDirectory(prefix="aiayn-graphs-") as name:
            yield Path(name)
    except OSError as err:
        raise ValueError(
            f"cannot write the serving graphs to {tempfile.gettempdir()} ({err.strerror or err}): "
            "free some space there, or point TMPDIR at a directory with room"
        ) from None


def build_serving_graphs(
    config: ModelConfig,
    weights: Mapping[str, np.ndarray],
    directory: Path,
    source: str = "the weights",
    scheme: BlockScheme | None = None,
    ops: ServingOps = CPU_OPS,
    int8_levels: int = 0,
) -> tuple[Path, Path]:
    """The encoder and decoder graphs of ``ops`` for ``config`` and its weights (any float dtype; ``ops.dtype``
    inside, or fp32 block-quantized by ``scheme``, or int8 with ``int8_levels`` a side: ``row_int8.py``), written to
    ``directory`` with their weights in one external-data file beside them; the weights must follow the weights'
    spec (``source`` names them if they do not)."""
    check_weights(config, {name: tensor.shape for name, tensor in weights.items()}, source)
    external = ExternalData(directory / EXTERNAL_DATA_FILE)
    try:
        graphs = {SERVING_ENCODER: build_encoder(config, weights, external, scheme, ops, int8_levels)}
        graphs[SERVING_DECODER] = build_decoder(config, weights, external, scheme, ops, int8_levels)
    finally:
        external.close()
    paths = {name: directory / f"{name.replace(' ', '_')}.onnx" for name in graphs}
    for name, graph in graphs.items():
        paths[name].write_bytes(graph)
    return paths[SERVING_ENCODER], paths[SERVING_DECODER]
