"""Our weights ↔ transformers' (``MarianMTModel``, ``PegasusForConditionalGeneration``), declared once: ``aiayn
import`` reads a checkpoint by this table and ``aiayn export --to transformers`` writes one by it. Torch-free.

The paper's Transformer comes in two arrangements (``ModelConfig.norm_first``), and transformers has each under
another name (``Arrangement``): post-LN is Marian, pre-LN with a final LayerNorm after each stack is Pegasus. Both
hold the same tensors one for one under the same names (``transformers_names``): the layers' projections, Linears
and LayerNorms, the shared embedding, the logits bias as a (1, vocab) row; Pegasus adds the two final norms. Neither
has a LayerNorm on the embeddings; both scale them by √d_model and add the same sinusoid table.

Only the sinusoids' layout differs where a folder of ours keeps §3.5's interleaved sin/cos pairs: transformers'
are all the sines, then all the cosines (``halves``). That difference is a fixed permutation of the model dimension
(``halves_order``): the residual stream x of an interleaved model, permuted, is the residual stream of a halves
model whose every weight that reads or writes x is permuted the same way (``model_axis``). LayerNorm takes its mean
and variance over the whole dimension, so it commutes with the permutation, attention and the feed-forward read x
only through the permuted weights, and the logits x·Eᵀ are unchanged: the same function, exactly, in the other
layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aiayn.core import weight_spec as spec
from aiayn.core.config import ModelConfig


@dataclass(frozen=True)
class Arrangement:
    """One of transformers' architectures that is the paper's Transformer in one arrangement of its LayerNorms."""

    model_type: str  # config.json's
    architecture: str  # the class that config.json's ``architectures`` names
    norm_first: bool  # ModelConfig.norm_first: the arrangement it holds
    title: str  # how the model card names it
    # Whether the file holds both sinusoid tables: transformers reports a Pegasus checkpoint without them as missing
    # weights on every load (Marian declares them as ones it may miss).
    stores_positions: bool

    @property
    def final_norms(self) -> dict[str, str]:
        """Our pre-LN model's final LayerNorm after each stack → its module, where the arrangement has them."""
        if not self.norm_first:
            return {}
        return {spec.ENCODER_NORM: "model.encoder.layer_norm", spec.DECODER_NORM: "model.decoder.layer_norm"}


MARIAN = Arrangement(
    "marian", "MarianMTModel", False, "the paper's Transformer, post-LN: transformers' Marian", stores_positions=False
)
PEGASUS = Arrangement(
    "pegasus",
    "PegasusForConditionalGeneration",
    True,
    "the paper's Transformer, pre-LN: transformers' Pegasus",
    stores_positions=True,
)
ARRANGEMENTS = {arrangement.model_type: arrangement for arrangement in (MARIAN, PEGASUS)}


def arrangement_of(config: ModelConfig) -> Arrangement:
    """The architecture that holds a folder of ``config``: Pegasus for pre-LN, Marian for post-LN."""
    return PEGASUS if config.norm_first else MARIAN


SHARED_EMBEDDING = "model.shared.weight"
FINAL_LOGITS_BIAS = "final_logits_bias"  # (1, vocab) in transformers' file, (vocab,) in ours
# Copies of the shared embedding that some checkpoints store as well (transformers ties them on load).
TIED_COPIES = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
# Keys of config.json that `aiayn export --to transformers` adds where the folder it came from differs from the
# arrangement's defaults, so that `aiayn import` gives that folder back: transformers keeps keys it does not know,
# unread. The interleaved layout (which the export permutes), and LayerNorm's ε (transformers' is fixed at 1e-5).
ORIGINAL_POSITIONS = "aiayn_positions"
ORIGINAL_LAYER_NORM_EPS = "aiayn_layer_norm_eps"
# generation_config.json's: the folder's length normalisation where it is not generate's |Y|^α (``power``), which
# transformers does not read and `aiayn import` restores.
ORIGINAL_LENGTH_NORMALIZATION = "aiayn_length_normalization"
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default: Marian's and Pegasus's layers use it, their configs cannot change it
# Where a folder of ours starts its decoder from a learned <s>, the export starts it as the architecture's own models
# do (Marian's: from an appended last id whose row is zeros, the one CTranslate2's converter drops; Pegasus's: from
# <pad>), with the difference between <s>'s scaled embedding and the start's folded into row 0 of the decoder's
# position table, which the file then stores. This config.json key keeps <s>'s id for `aiayn import`, which drops an
# appended row again.
FOLDED_START = "aiayn_start_token_id"
# The appended row's logits bias: float16's lowest, so that its probability is 0 in float32 and every other token's
# log-probability is the folder's (generate's beam search normalizes before it bans a token).
FOLDED_START_BIAS = -65504.0
ENCODER_POSITIONS = "model.encoder.embed_positions.weight"
DECODER_POSITIONS = "model.decoder.embed_positions.weight"
PROJECTIONS = {spec.W_Q: "q_proj", spec.W_K: "k_proj", spec.W_V: "v_proj", spec.W_O: "out_proj"}


def layer_modules(layer: str, stack: str, i: int) -> dict[str, str]:
    """Our module names in one layer → transformers', for ``stack`` ``encoder``/``decoder``: each attention's four
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


def transformers_names(config: ModelConfig) -> dict[str, str]:
    """Every tensor of a folder of ``config`` (``weight_spec.weight_shapes``) → its name in the file of its
    arrangement (``arrangement_of``): the same names for both, and Pegasus's two final norms."""
    names = {spec.EMBEDDING: SHARED_EMBEDDING, **({spec.LOGITS_BIAS: FINAL_LOGITS_BIAS} if config.logits_bias else {})}
    modules = dict(arrangement_of(config).final_norms)
    layers = [(spec.encoder_layer(i), "encoder", i) for i in range(config.n_encoder_layers)]
    layers += [(spec.decoder_layer(i), "decoder", i) for i in range(config.n_decoder_layers)]
    for layer, stack, i in layers:
        modules |= layer_modules(layer, stack, i)
    for ours, theirs in modules.items():
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
    if module.endswith(spec.norm("")) or module in (spec.ENCODER_NORM, spec.DECODER_NORM):  # every LayerNorm
        return 0
    last = module.rpartition(".")[2]
    if last in (spec.W_O, spec.W_2):  # they write the residual stream
        return 0
    if last in (spec.W_Q, spec.W_K, spec.W_V, spec.W_1) and kind == spec.WEIGHT:  # they read it
        return 1
    return None


def halves_sinusoids(n_positions: int, d_model: int) -> np.ndarray:
    """(n_positions, d_model) float32: the table transformers' ``MarianSinusoidalPositionalEmbedding`` (and
    Pegasus's, a copy of it) computes, the sines of every position, then its cosines, in float64 first as it does."""
    angles = np.arange(n_positions)[:, None] / np.power(10000, 2 * (np.arange(d_model) // 2) / d_model)[None, :]
    return np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1).astype(np.float32)
