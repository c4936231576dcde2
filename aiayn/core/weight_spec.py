"""The weights' spec, declared once: every tensor of model.safetensors by name and shape, for a config.

The names are the state-dict names of ``aiayn.model.transformer.Transformer``
(its module attributes; a test holds the two equal), the serving graph builder
(``aiayn/engines/onnx/serving/graphs.py``) reads the weights by them, and both
loaders check a file against this spec, every missing, unexpected or misshapen
tensor named at once (a strict mapping, as CTranslate2's specs validate every
slot before they save). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aiayn.core.config import ModelConfig

EMBEDDING = "embedding.weight"  # (vocab, d_model), tied: input embeddings and the pre-softmax projection (§3.4)
ENCODER_NORM, DECODER_NORM = "encoder_norm", "decoder_norm"  # pre-LN only: each stack's final LayerNorm
LOGITS_BIAS = "embedding.bias"  # (vocab,) on the tied projection's logits, only where the config has one (Marian)
# A layer's sub-layers (§3.1), each with its residual's LayerNorm (``norm``).
SELF_ATTN, CROSS_ATTN, FEED_FORWARD = "self_attn", "cross_attn", "feed_forward"
ENCODER_SUBLAYERS = (SELF_ATTN, FEED_FORWARD)
DECODER_SUBLAYERS = (SELF_ATTN, CROSS_ATTN, FEED_FORWARD)
# The Linears inside them: an attention's projections (§3.2.2), and the feed-forward's two (eq. 2).
W_Q, W_K, W_V, W_O = "w_q", "w_k", "w_v", "w_o"
W_1, W_2 = "w_1", "w_2"
WEIGHT, BIAS = "weight", "bias"  # of every Linear and LayerNorm


def encoder_layer(i: int) -> str:
    return f"encoder_layers.{i}"


def decoder_layer(i: int) -> str:
    return f"decoder_layers.{i}"


def sublayer(layer: str, name: str) -> str:
    """``decoder_layers.0``, ``cross_attn`` → ``decoder_layers.0.cross_attn`` (a module holding Linears)."""
    return f"{layer}.{name}"


def norm(sublayer_name: str) -> str:
    """The LayerNorm of a sub-layer's residual: ``decoder_layers.0.cross_attn`` → ``...cross_attn_residual.norm``."""
    return f"{sublayer_name}_residual.norm"


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape: torch Linears are stored (out, in), as ``nn.Linear`` holds them."""
    d, ff = config.d_model, config.d_ff
    shapes: dict[str, tuple[int, ...]] = {EMBEDDING: (config.vocab_size, d)}

    def linear(module: str, out: int, into: int) -> None:
        shapes[f"{module}.{WEIGHT}"], shapes[f"{module}.{BIAS}"] = (out, into), (out,)

    def layer_norm(module: str) -> None:
        shapes[f"{module}.{WEIGHT}"], shapes[f"{module}.{BIAS}"] = (d,), (d,)

    layers: list[tuple[str, tuple[str, ...]]] = [
        (encoder_layer(i), ENCODER_SUBLAYERS) for i in range(config.n_encoder_layers)
    ]
    layers += [(decoder_layer(i), DECODER_SUBLAYERS) for i in range(config.n_decoder_layers)]
    for layer, names in layers:
        for name in names:
            module = sublayer(layer, name)
            if name == FEED_FORWARD:
                linear(f"{module}.{W_1}", ff, d)
                linear(f"{module}.{W_2}", d, ff)
            else:
                for projection in (W_Q, W_K, W_V, W_O):
                    linear(f"{module}.{projection}", d, d)
            layer_norm(norm(module))
    if config.norm_first:
        layer_norm(ENCODER_NORM)
        layer_norm(DECODER_NORM)
    if config.logits_bias:
        shapes[LOGITS_BIAS] = (config.vocab_size,)
    return shapes


def check_weights(config: ModelConfig, shapes: Mapping[str, Sequence[int]], source: str) -> None:
    """Refuse weights (name → shape) that differ from the spec, naming every missing, unexpected or misshapen one."""
    wanted = weight_shapes(config)
    missing, unexpected = sorted(set(wanted) - set(shapes)), sorted(set(shapes) - set(wanted))
    misshapen = [
        f"{name} {tuple(shapes[name])} != {shape}"
        for name, shape in sorted(wanted.items())
        if name in shapes and tuple(shapes[name]) != shape
    ]
    if missing or unexpected or misshapen:
        raise ValueError(
            f"{source} does not match its config.json: missing {missing}, unexpected {unexpected}, "
            f"wrong shape {misshapen}; the weights and config.json must come from the same training run"
        )
