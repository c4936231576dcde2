"""The CPU serving graphs' inputs and outputs: engine-private, not part of the ONNX contract (``core/contract.py``).

``serving_graphs.py`` builds the graphs to these declarations and ``fused.py`` binds by them; a graph that differs
from its declaration is aiayn's own error (``sessions.check_built_graph``).
"""

from __future__ import annotations

from aiayn.core.config import ModelConfig
from aiayn.core.contract import (
    SRC_IDS,
    SRC_MASK,
    TGT_IDS,
    TOP_K_INPUT,
    GraphSpec,
    TensorSpec,
    cross_kv_specs,
    self_kv_specs,
    top_k_outputs,
)

# The encoder's one output, and the decoder step's per-row position inputs.
CROSS_KV, SEQLENS_K, TOTAL_LEN, GROUP_SHAPE = "cross_kv", "seqlens_k", "total_len", "group_shape"

# The CPU serving graphs (``serving_graphs.py``): built from model.safetensors when the engine
# loads, into a temporary directory gone once the sessions are built, so ``file`` names them in messages. Every
# token is one row; contrib-op masks and lengths are int32. The decoder's rows come in sentence blocks (a sentence's
# beams): ``sentences`` blocks of ``rows / sentences`` rows, each attending over its sentence's cross keys/values.
SERVING_ENCODER, SERVING_DECODER = "serving encoder", "serving decoder"


def serving_encoder_spec(config: ModelConfig) -> GraphSpec:
    pad, n_kv = config.special_tokens.pad, 2 * config.n_decoder_layers
    return GraphSpec(
        SERVING_ENCODER,
        inputs=(
            TensorSpec(SRC_IDS, "int64", ("batch", "src_len"), f"source token ids ending in `</s>`, padded with {pad}"),
            TensorSpec(SRC_MASK, "int32", ("batch", "src_len"), "1 where `src_ids` is a real token, 0 on padding"),
        ),
        outputs=(
            TensorSpec(
                CROSS_KV,
                "float32",
                (n_kv, "batch", config.n_heads, "src_len", config.d_head),
                "every decoder layer's cross-attention keys and values, in the order of `kv_slots`",
            ),
        ),
    )


def serving_decoder_spec(config: ModelConfig) -> GraphSpec:
    """One new token per row; the cache is bound as both ``cache_*`` and ``present_*`` (appended in place)."""
    meaning = "a buffer of `capacity` positions, bound again as the present one (appended in place)"
    return GraphSpec(
        SERVING_DECODER,
        inputs=(
            TensorSpec(TGT_IDS, "int64", ("rows",), "the newest token of each row"),
            TensorSpec(SEQLENS_K, "int32", ("rows",), "its position: the tokens cached before it, per row"),
            TensorSpec(TOTAL_LEN, "int32", (), "the longest row's position + 1"),
            TensorSpec(GROUP_SHAPE, "int64", (3,), "[sentences, rows per sentence, d_model]"),
            TensorSpec(SRC_MASK, "int32", ("sentences", "src_len"), "1 where the source is a real token"),
            *cross_kv_specs(config, "sentences"),
            *self_kv_specs(config, "cache", "capacity", meaning, "rows"),
            TOP_K_INPUT,
        ),
        outputs=(
            *top_k_outputs("rows"),
            *self_kv_specs(config, "present", "capacity", "the cache with the new token", "rows"),
        ),
    )
