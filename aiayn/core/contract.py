"""The ONNX contract, declared once: file names, and each graph's inputs and outputs with dtypes and axes.

The exporter, the parity check, the README table, the ``onnx`` section of
config.json and the ONNX Runtime engine all read this table (the way HF Optimum's
OnnxConfig declares ``{name: {axis: name}}``); code names a tensor or a metadata
key only through the constants and name groups here. The CPU serving graphs,
built from the weights when an engine loads and never stored, are no part of it:
they are declared beside their builder (``aiayn/engines/onnx/serving/spec.py``). Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiayn.core.config import ModelConfig

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
OPSET = 18  # of every graph: exported, served, or built at load time
IR_VERSION = 8  # of the graphs built at load time (the exporter sets its own)
CONTRACT_VERSION = 1  # raised when a name, dtype, axis or meaning below, or the decoding steps, change (docs/onnx.md)

# Tensor names that are not per layer.
SRC_IDS, MEMORY = "src_ids", "memory"
TGT_IDS, POSITION_OFFSET, SRC_MASK = "tgt_ids", "position_offset", "src_mask"
LOG_PROBS, CROSS_ATTENTION = "log_probs", "cross_attention"
TOP_K, TOP_LOG_PROBS, TOP_IDS = "top_k", "top_log_probs", "top_ids"

# Metadata stamped into every graph: the config and weights it came from, and its variant.
CONFIG_FINGERPRINT_KEY = "aiayn.config_fingerprint"
WEIGHTS_SHA256_KEY = "aiayn.weights_sha256"
EXPORTER_KEY = "aiayn.exporter"
VARIANT_KEY = "aiayn.variant"


# Every variant has the same inputs and outputs, dtypes included, so one engine drives them all.
VARIANTS = {
    "fp32": "the reference, checked against PyTorch; large weights stored as fp16 + Cast, exactly",
    "int8": "ONNX Runtime dynamic quantization: int8 MatMul and Gather weights (for CPUs)",
    "fp16": "fp16 arithmetic inside (for CUDA); positions and the final log-softmax stay fp32",
}


def variant_file(base: str, variant: str) -> str:
    """``encoder.onnx`` → ``encoder.int8.onnx`` for a variant (``fp32`` is the base file)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown ONNX variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    return base if variant == "fp32" else base.replace(".onnx", f".{variant}.onnx")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: int64, int32, float32, bool
    shape: tuple[str | int, ...]  # a str is a dynamic axis, an int is fixed by the config
    meaning: str

    def dynamic_axes(self) -> dict[int, str]:
        return {i: axis for i, axis in enumerate(self.shape) if isinstance(axis, str)}

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "meaning": self.meaning}


@dataclass(frozen=True)
class GraphSpec:
    file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }


def kv_slots(config: ModelConfig) -> list[tuple[int, str]]:
    """(layer, ``key``/``value``) of every per-layer tensor, in the contract's order: by layer, key first."""
    return [(layer, kind) for layer in range(config.n_decoder_layers) for kind in ("key", "value")]


def kv_names(config: ModelConfig, prefix: str) -> list[str]:
    """``cross_key.0, cross_value.0, cross_key.1, ...``: ``prefix`` is ``cross`` (from the encoder),
    ``past`` (decoder inputs) or ``present`` (decoder outputs); the serving decoder's cache inputs are ``cache``."""
    return [f"{prefix}_{kind}.{layer}" for layer, kind in kv_slots(config)]


def cross_kv_specs(config: ModelConfig, batch_axis: str = "batch", dtype: str = "float32") -> tuple[TensorSpec, ...]:
    shape = (batch_axis, config.n_heads, "src_len", config.d_head)
    return tuple(
        TensorSpec(name, dtype, shape, f"decoder layer {layer}'s cross-attention {kind}s")
        for name, (layer, kind) in zip(kv_names(config, "cross"), kv_slots(config), strict=True)
    )


def self_kv_specs(
    config: ModelConfig, prefix: str, length_axis: str, meaning: str, batch_axis: str = "batch", dtype: str = "float32"
) -> tuple[TensorSpec, ...]:
    shape = (batch_axis, config.n_heads, length_axis, config.d_head)
    return tuple(
        TensorSpec(name, dtype, shape, f"decoder layer {layer}'s self-attention {kind}s, {meaning}")
        for name, (layer, kind) in zip(kv_names(config, prefix), kv_slots(config), strict=True)
    )


def encoder_spec(config: ModelConfig) -> GraphSpec:
    pad = config.special_tokens.pad
    return GraphSpec(
        ENCODER_FILE,
        inputs=(
            TensorSpec(
                SRC_IDS, "int64", ("batch", "src_len"), f"source token ids ending in `</s>`, right-padded with {pad}"
            ),
        ),
        outputs=(
            TensorSpec(MEMORY, "float32", ("batch", "src_len", config.d_model), "encoder output"),
            *cross_kv_specs(config),
        ),
    )


def decoder_spec(config: ModelConfig) -> GraphSpec:
    return GraphSpec(
        DECODER_FILE,
        inputs=(
            TensorSpec(TGT_IDS, "int64", ("batch", "new_len"), "target ids after the cached ones (first step: `<s>`)"),
            TensorSpec(POSITION_OFFSET, "int64", (), "position of the first new token (= past_len)"),
            TensorSpec(
                SRC_MASK, "bool", ("batch", "src_len"), "true where `src_ids` is a real token (false on padding)"
            ),
            *cross_kv_specs(config),
            *self_kv_specs(config, "past", "past_len", "cached so far (past_len 0 on the first step)"),
        ),
        outputs=(
            TensorSpec(
                LOG_PROBS, "float32", ("batch", "new_len", config.vocab_size), "log-softmax over the vocabulary"
            ),
            *self_kv_specs(config, "present", "total_len", "past and new (total_len = past_len + new_len)"),
            TensorSpec(
                CROSS_ATTENTION,
                "float32",
                ("batch", config.n_heads, "new_len", "src_len"),
                "last decoder layer's cross-attention weights (the attention view)",
            ),
        ),
    )


# The ONNX Runtime engine's selection head (``aiayn/engines/onnx/top_k.py``): added in memory to the decoder it runs,
# never stored in decoder.onnx. The search asks for each row's k best next tokens and gets only those.
TOP_K_INPUT = TensorSpec(TOP_K, "int64", (1,), "how many of the best next tokens to return (k ≤ vocabulary)")


def top_k_outputs(*axes: str) -> tuple[TensorSpec, TensorSpec]:
    """The selection head's outputs, (``axes``, k): the k largest log-probabilities and their ids."""
    return (
        TensorSpec(TOP_LOG_PROBS, "float32", (*axes, "k"), "the k largest `log_probs`, best first"),
        TensorSpec(TOP_IDS, "int64", (*axes, "k"), "their token ids; equal values: the lower id first"),
    )


TOP_K_OUTPUTS = top_k_outputs("batch", "new_len")


def decoder_with_top_k_spec(config: ModelConfig) -> GraphSpec:
    """decoder.onnx as the portable ONNX Runtime engine runs it: with the selection head (``top_k.py``)."""
    spec = decoder_spec(config)
    return GraphSpec(spec.file, (*spec.inputs, TOP_K_INPUT), (*spec.outputs, *TOP_K_OUTPUTS))


def stamp(config: ModelConfig, weights_sha256: str) -> dict[str, str]:
    """The metadata that ties a graph to the config and weights it was exported from (plus ``VARIANT_KEY``)."""
    return {CONFIG_FINGERPRINT_KEY: config.fingerprint(), WEIGHTS_SHA256_KEY: weights_sha256}


def contract(config: ModelConfig) -> dict[str, object]:
    """The contract as written into config.json's ``onnx`` section."""
    return {
        "contract_version": CONTRACT_VERSION,
        "opset": OPSET,
        "encoder": encoder_spec(config).to_dict(),
        "decoder": decoder_spec(config).to_dict(),
    }


def markdown_table(config: ModelConfig) -> str:
    """The contract as README tables; per-layer tensors are shown once, with ``i`` the decoder layer."""
    lines = []
    for graph in (encoder_spec(config), decoder_spec(config)):
        lines += [f"**`{graph.file}`**", "", "| | name | dtype | shape | meaning |", "|---|---|---|---|---|"]
        for role, specs in (("in", graph.inputs), ("out", graph.outputs)):
            seen = set()
            for spec in specs:
                name = re.sub(r"\.\d+$", ".i", spec.name)
                if name in seen:
                    continue
                seen.add(name)
                meaning = re.sub(r"layer \d+'s", "layer i's", spec.meaning)
                shape = "[" + ", ".join(str(axis) for axis in spec.shape) + "]"
                lines.append(f"| {role} | `{name}` | {spec.dtype} | {shape} | {meaning} |")
        lines.append("")
    n, tokens = config.n_decoder_layers, config.special_tokens
    lines += [
        f"`.i` stands for each decoder layer i = 0..{n - 1}, in that order, key before value.",
        f"Special ids: `<pad>` {tokens.pad}, `<unk>` {tokens.unk}, `<s>` {tokens.bos}, `</s>` {tokens.eos}.",
        "A step feeds the `present_*` outputs back as the next `past_*` inputs; start with past_len 0.",
        "",
        "| variant | files | what it is |",
        "|---|---|---|",
        *(
            f"| {name} | `{variant_file(ENCODER_FILE, name)}`, `{variant_file(DECODER_FILE, name)}` | {meaning} |"
            for name, meaning in VARIANTS.items()
        ),
    ]
    return "\n".join(lines)
