"""The serving graphs' ops per device, and their inputs and outputs: engine-private, not part of the ONNX contract
(``core/contract.py``).

``graphs.py`` builds the graphs to these declarations; ``host_buffers.py`` (CPU memory) and
``device_buffers.py`` (the device's memory) bind by them. A graph that differs from its declaration is aiayn's own error
(``sessions.check_built_graph``).
"""

from __future__ import annotations

from dataclasses import dataclass

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

# The encoder's one output, and the decoder step's position inputs.
CROSS_KV, SEQLENS_K, TOTAL_LEN, GROUP_SHAPE = "cross_kv", "seqlens_k", "total_len", "group_shape"

# The inputs a CUDA kernel reads from host memory (declared as CPU inputs in its kernel definition): Reshape's shape
# and TopK's k. ONNX Runtime copies every other input bound from the host to the device when it is bound
# (``IOBinding``), so a value the engine rewrites each step lives on the device and is written through ONNX Runtime;
# and a captured CUDA graph replays what these two held when it was captured, so they are fixed per graph.
HOST_READ = frozenset({GROUP_SHAPE, TOP_K_INPUT.name})

# The decoder's self-attention. GroupQueryAttention (CPU): per-row lengths over a cache bound as past and present
# (its CUDA kernel is fp16/bf16 only, and reads the total length from host memory). On CUDA the new key and value are
# scattered into the cache at each row's position (ScatterElements, in place) and MultiHeadAttention reads the whole
# cache under a mask of the filled positions, both made from ``seqlens_k`` on the device: no kernel reads a position
# from host memory, so one step is one CUDA graph, whatever the step (``device_buffers.py``).
GQA, SCATTERED = "GroupQueryAttention", "ScatterElements+MultiHeadAttention"


@dataclass(frozen=True)
class ServingOps:
    """What one device's serving graphs are made of, read by the builder and the engines (data, not branches)."""

    device: str  # where the graphs are meant to run: "cpu" or "cuda"
    self_attention: str  # GQA or SCATTERED
    dtype: str = "float32"  # activations, weights and the caches; positions' table, log-softmax and top-k stay fp32
    logits_multiple: int = 1  # the output projection's columns padded to a multiple of this (fp16 tensor cores: 8)
    # TopK over the best blocks of the vocabulary (``graphs.two_stage_top_k``): 8 small kernels that beat one
    # TopK over the whole vocabulary on a CPU; on a GPU one TopK kernel is cheaper than eight launches.
    two_stage_top_k: bool = True


# The serving graphs' ops: the CPU's (fp32 graphs, their weights quantized for w8, w4 and int8: ``block_quant.py``,
# ``row_int8.py``) and the GPU's, fp32 and fp16. The table of weights (``aiayn.engines.WEIGHTS``) says which each
# variant takes on each device.
CPU_OPS = ServingOps("cpu", GQA)
CUDA_OPS = ServingOps("cuda", SCATTERED, two_stage_top_k=False)
CUDA_FP16_OPS = ServingOps("cuda", SCATTERED, "float16", 8, two_stage_top_k=False)

# The serving graphs (``graphs.py``): built from model.safetensors when the engine
# loads, into a temporary directory gone once the sessions are built, so ``file`` names them in messages. Every
# token is one row; contrib-op masks and lengths are int32. The decoder's rows come in sentence blocks (a sentence's
# beams): ``sentences`` blocks of ``rows / sentences`` rows, each attending over its sentence's cross keys/values.
SERVING_ENCODER, SERVING_DECODER = "serving encoder", "serving decoder"


def serving_encoder_spec(config: ModelConfig, ops: ServingOps = CPU_OPS) -> GraphSpec:
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
                ops.dtype,
                (n_kv, "batch", config.n_heads, "src_len", config.d_head),
                "every decoder layer's cross-attention keys and values, in the order of `kv_slots`",
            ),
        ),
    )


# What each self-attention kernel needs to know of the positions, beside the rows' own (``seqlens_k``).
STEP_INPUTS = {
    GQA: (TensorSpec(TOTAL_LEN, "int32", (), "the longest row's position + 1"),),
    SCATTERED: (),
}


def serving_decoder_spec(config: ModelConfig, ops: ServingOps = CPU_OPS) -> GraphSpec:
    """One new token per row; the cache is bound as both ``cache_*`` and ``present_*`` (appended in place)."""
    meaning = "a buffer of `capacity` positions, bound again as the present one (appended in place)"
    return GraphSpec(
        SERVING_DECODER,
        inputs=(
            TensorSpec(TGT_IDS, "int64", ("rows",), "the newest token of each row"),
            TensorSpec(SEQLENS_K, "int32", ("rows",), "its position: the tokens cached before it, per row"),
            *STEP_INPUTS[ops.self_attention],
            TensorSpec(GROUP_SHAPE, "int64", (3,), "[sentences, rows per sentence, d_model]"),
            TensorSpec(SRC_MASK, "int32", ("sentences", "src_len"), "1 where the source is a real token"),
            *cross_kv_specs(config, "sentences", ops.dtype),
            *self_kv_specs(config, "cache", "capacity", meaning, "rows", ops.dtype),
            TOP_K_INPUT,
        ),
        outputs=(
            *top_k_outputs("rows"),
            *self_kv_specs(config, "present", "capacity", "the cache with the new token", "rows", ops.dtype),
        ),
    )
