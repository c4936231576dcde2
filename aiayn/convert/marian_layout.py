"""Our weights ↔ Marian's (transformers' ``MarianMTModel``), declared once: ``aiayn import`` reads a checkpoint by
this table and ``aiayn export --to transformers`` writes one by it. Torch-free.

Marian's model is the paper's post-LN Transformer; its tensors are ours one for one under other names
(``marian_names``), with the logits bias stored as a (1, vocab) row. Only the sinusoids' layout differs where a
folder of ours keeps §3.5's interleaved sin/cos pairs: Marian's are all the sines, then all the cosines
(``halves``). That difference is a fixed permutation of the model dimension (``halves_order``): the residual
stream x of an interleaved model, permuted, is the residual stream of a halves model whose every weight that
reads or writes x is permuted the same way (``model_axis``). LayerNorm takes its mean and variance over the whole
dimension, so it commutes with the permutation, attention and the feed-forward read x only through the permuted
weights, and the logits x·Eᵀ are unchanged: the same function, exactly, in the other layout.
"""

from __future__ import annotations

import numpy as np

from aiayn.core import weight_spec as spec
from aiayn.core.config import ModelConfig

SHARED_EMBEDDING = "model.shared.weight"
MARIAN_LOGITS_BIAS = "final_logits_bias"  # (1, vocab) in Marian's file, (vocab,) in ours
# Copies of the shared embedding that some checkpoints store as well (transformers ties them on load).
TIED_COPIES = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
# A key of config.json that `aiayn export --to transformers` adds where the folder it came from had the interleaved
# layout, so that `aiayn import` gives that folder back: transformers keeps keys it does not know, unread.
ORIGINAL_POSITIONS = "aiayn_positions"
# Where a folder of ours starts its decoder from a learned <s>, the export starts it as Marian's own models do: from
# an appended last id whose row is zeros (the one CTranslate2's converter drops), with <s>'s scaled embedding folded
# into row 0 of the decoder's position table, which the file then stores. This config.json key keeps <s>'s id for
# `aiayn import`, which drops the appended row again.
FOLDED_START = "aiayn_start_token_id"
# The appended row's logits bias: float16's lowest, so that its probability is 0 in float32 and every other token's
# log-probability is the folder's (generate's beam search normalizes before it bans a token).
FOLDED_START_BIAS = -65504.0
DECODER_POSITIONS = "model.decoder.embed_positions.weight"
PROJECTIONS = {spec.W_Q: "q_proj", spec.W_K: "k_proj", spec.W_V: "v_proj", spec.W_O: "out_proj"}


def layer_modules(layer: str, stack: str, i: int) -> dict[str, str]:
    """Our module names in one layer → Marian's, for ``stack`` ``encoder``/``decoder``: each attention's four
    projections, the feed-forward's two Linears and each sub-layer's LayerNorm."""
    theirs = f"model.{stack}.layers.{i}"
    attentions = {spec.SELF_ATTN: f"{theirs}.self_attn"}
    if stack == "decoder":
        attentions[spec.CROSS_ATTN] = f"{theirs}.encoder_attn"
    modules = {
        f"{spec.sublayer(layer, ours)}.{w}": f"{name}.{projection}"
        for ours, name in attentions.items()
        for w, projection in PROJECTIONS.items()
    }
    modules[f"{spec.sublayer(layer, spec.FEED_FORWARD)}.{spec.W_1}"] = f"{theirs}.fc1"
    modules[f"{spec.sublayer(layer, spec.FEED_FORWARD)}.{spec.W_2}"] = f"{theirs}.fc2"
    for ours, name in attentions.items():
        modules[spec.norm(spec.sublayer(layer, ours))] = f"{name}_layer_norm"
    modules[spec.norm(spec.sublayer(layer, spec.FEED_FORWARD))] = f"{theirs}.final_layer_norm"
    return modules


def marian_names(config: ModelConfig) -> dict[str, str]:
    """Every tensor of a post-LN folder of ``config`` (``weight_spec.weight_shapes``) → its name in Marian's file."""
    if config.norm_first:
        raise ValueError("a pre-LN model has no Marian names: Marian's layers normalise after each residual")
    names = {spec.EMBEDDING: SHARED_EMBEDDING, **({spec.LOGITS_BIAS: MARIAN_LOGITS_BIAS} if config.logits_bias else {})}
    layers = [(spec.encoder_layer(i), "encoder", i) for i in range(config.n_encoder_layers)]
    layers += [(spec.decoder_layer(i), "decoder", i) for i in range(config.n_decoder_layers)]
    for layer, stack, i in layers:
        for ours, theirs in layer_modules(layer, stack, i).items():
            for kind in (spec.WEIGHT, spec.BIAS):
                names[f"{ours}.{kind}"] = f"{theirs}.{kind}"
    return names


def halves_order(d_model: int) -> list[int]:
    """The permutation from the interleaved layout to the halves: dimension k of a halves model is dimension
    ``order[k]`` of the interleaved one (the sines at 0, 2, 4, … first, then the cosines at 1, 3, 5, …)."""
    return [*range(0, d_model, 2), *range(1, d_model, 2)]


def inverse(order: list[int]) -> list[int]:
    back = [0] * len(order)
    for k, i in enumerate(order):
        back[i] = k
    return back


def model_axis(name: str) -> int | None:
    """The axis of one of our tensors that runs along the model dimension (the residual stream), which a change
    of layout permutes; None for one that has no such axis (the query/key/value biases, the hidden layer's bias,
    the logits bias). Linears are stored (out, in)."""
    module, _, kind = name.rpartition(".")
    if name == spec.EMBEDDING:
        return 1  # (vocab, d_model)
    if module.endswith(spec.norm("")):  # every LayerNorm: ..._residual.norm
        return 0
    last = module.rpartition(".")[2]
    if last in (spec.W_O, spec.W_2):  # they write the residual stream
        return 0
    if last in (spec.W_Q, spec.W_K, spec.W_V, spec.W_1) and kind == spec.WEIGHT:  # they read it
        return 1
    return None


def marian_sinusoids(n_positions: int, d_model: int) -> np.ndarray:
    """(n_positions, d_model) float32: the table transformers' ``MarianSinusoidalPositionalEmbedding`` computes,
    the sines of every position, then its cosines, in float64 first as it does."""
    angles = np.arange(n_positions)[:, None] / np.power(10000, 2 * (np.arange(d_model) // 2) / d_model)[None, :]
    return np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1).astype(np.float32)
