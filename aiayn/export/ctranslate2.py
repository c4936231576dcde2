"""The same weights as a CTranslate2 model, described through ``ctranslate2.specs.TransformerSpec``.

CTranslate2 adds its own sinusoidal table unless one is given, and its
default is not the paper's interleaved sin/cos and starts at position 1, so
our table, in the config's layout, is assigned explicitly (kept fp32; every
learned weight is stored as the fp16 it already is in model.safetensors).
Like ours, CTranslate2 scales embeddings by √d_model before adding positions
(§3.4) unless the config says not to, and the output projection is the
embedding matrix (saved once: CTranslate2 aliases equal arrays), with the
config's logits bias if it has one. The feed-forward's activation, the
LayerNorm epsilon and the decoder's start token (``bos``, which may be
``<pad>``) are the config's. The vocabulary is ours, id for id. A source is
our subword tokens followed by ``</s>``, as in training: the caller appends
it (``add_source_eos`` stays off, so existing callers that do are not
doubled), and puts the config's source prefix before them (a multi-target
checkpoint's ``>>por<<``, as CTranslate2's users of OPUS-MT models do by
hand; ``ctranslate2_sources``). The ids the config never generates are not
part of the model: each call passes them (``suppressed``), as our search
leaves them out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aiayn.core.config import ModelConfig
from aiayn.core.folder import CTRANSLATE2_DIR, ModelFolder
from aiayn.core.outputs import Command, claim, written_whole
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.model.attention import MultiHeadAttention
from aiayn.model.layers import FeedForward, sinusoidal_positions
from aiayn.model.transformer import Transformer
from aiayn.model.weights import STORAGE_DTYPE
from aiayn.search.greedy import EXTRA_LEN
from aiayn.search.translator import SearchSettings

# config.ACTIVATIONS by their names in ctranslate2.specs.common_spec.Activation (GELU is the erf one, as F.gelu).
CTRANSLATE2 = Command("aiayn export --to ctranslate2", "move it away, or pass --overwrite to replace the folder whole")
ACTIVATIONS = {"relu": "RELU", "swish": "SWISH", "gelu": "GELU"}


def array(tensor: torch.Tensor) -> np.ndarray:
    """A learned weight as stored in model.safetensors (fp16, so this is exact)."""
    return tensor.detach().to(STORAGE_DTYPE).cpu().numpy()


def set_linear(spec: object, linears: list[nn.Linear]) -> None:
    """One CTranslate2 linear from one or several of ours (fused along the output dimension)."""
    spec.weight = np.concatenate([array(linear.weight) for linear in linears])
    spec.bias = np.concatenate([array(linear.bias) for linear in linears])


def set_layer_norm(spec: object, norm: nn.LayerNorm) -> None:
    spec.gamma = array(norm.weight)
    spec.beta = array(norm.bias)


def set_attention(spec: object, attention: MultiHeadAttention, norm: nn.LayerNorm, self_attention: bool) -> None:
    if self_attention:
        set_linear(spec.linear[0], [attention.w_q, attention.w_k, attention.w_v])
    else:
        set_linear(spec.linear[0], [attention.w_q])
        set_linear(spec.linear[1], [attention.w_k, attention.w_v])
    set_linear(spec.linear[-1], [attention.w_o])
    set_layer_norm(spec.layer_norm, norm)


def set_ffn(spec: object, feed_forward: FeedForward, norm: nn.LayerNorm) -> None:
    set_linear(spec.linear_0, [feed_forward.w_1])
    set_linear(spec.linear_1, [feed_forward.w_2])
    set_layer_norm(spec.layer_norm, norm)


def set_inputs(spec: object, model: Transformer) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings  # encoder: a list
    embeddings.weight = array(model.embedding.weight)
    config = model.config
    spec.scale_embeddings = config.scale_embedding  # × √d_model, §3.4
    positions = torch.arange(config.max_len + 64)  # outputs may run 50 past the longest input
    spec.position_encodings.encodings = sinusoidal_positions(positions, config.d_model, config.positions).numpy()


def transformer_spec(model: Transformer, tokenizer: SubwordTokenizer) -> object:
    """Describe ``model`` as data for CTranslate2; the spec validates every slot when saved."""
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as ts

    config = model.config
    spec = ts.TransformerSpec.from_config(
        (config.n_encoder_layers, config.n_decoder_layers),
        config.n_heads,
        pre_norm=config.norm_first,
        activation=common_spec.Activation[ACTIVATIONS[config.activation]],
    )
    set_inputs(spec.encoder, model)
    set_inputs(spec.decoder, model)
    spec.decoder.projection.weight = array(model.embedding.weight)  # tied, §3.4
    bias = model.embedding.bias  # the logits bias, where the config has one
    spec.decoder.projection.bias = np.zeros(config.vocab_size, np.float16) if bias is None else array(bias)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder_layers, strict=True):
        set_attention(layer_spec.self_attention, layer.self_attn, layer.self_attn_residual.norm, True)
        set_ffn(layer_spec.ffn, layer.feed_forward, layer.feed_forward_residual.norm)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder_layers, strict=True):
        set_attention(layer_spec.self_attention, layer.self_attn, layer.self_attn_residual.norm, True)
        set_attention(layer_spec.attention, layer.cross_attn, layer.cross_attn_residual.norm, False)
        set_ffn(layer_spec.ffn, layer.feed_forward, layer.feed_forward_residual.norm)
    if config.norm_first:
        set_layer_norm(spec.encoder.layer_norm, model.encoder_norm)
        set_layer_norm(spec.decoder.layer_norm, model.decoder_norm)
    vocabulary = tokenizer.vocabulary()
    if len(vocabulary) != config.vocab_size:
        raise ValueError(f"the tokenizer has {len(vocabulary)} entries, the config {config.vocab_size}: not one model")
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    tokens = config.special_tokens
    spec.config.unk_token = vocabulary[tokens.unk]
    spec.config.bos_token = spec.config.decoder_start_token = vocabulary[tokens.bos]
    spec.config.eos_token = vocabulary[tokens.eos]
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    return spec


def export_ctranslate2(model: Transformer, tokenizer: SubwordTokenizer, folder: Path, overwrite: bool = False) -> Path:
    """Write the CTranslate2 model into ``folder/ctranslate2``, replaced whole (``core/outputs.py``): one holding
    anything but an earlier export's is refused, unless ``overwrite``."""
    target = Path(folder) / CTRANSLATE2_DIR
    claim(target, CTRANSLATE2, overwrite)
    spec = transformer_spec(model.eval(), tokenizer)
    spec.validate()
    spec.optimize(quantization=None)
    with written_whole(target, CTRANSLATE2, overwrite) as staging:
        spec.save(str(staging))
    return target


def suppressed(config: ModelConfig, tokenizer: SubwordTokenizer) -> list[list[str]] | None:
    """The ids ``config`` never generates as ``translate_batch``'s ``suppress_sequences`` (one token each)."""
    return [[tokenizer.id_to_token(i)] for i in config.never_generate] or None


def ctranslate2_sources(tokenizer: SubwordTokenizer, texts: list[str]) -> list[list[str]]:
    """CTranslate2 takes tokens, not ids: the source prefix (>>por<<, where the config has one), the subwords of
    each text and ``</s>``."""
    return [[tokenizer.id_to_token(i) for i in tokenizer.encode_source(text)] for text in texts]


def translate_batch_options(
    config: ModelConfig, tokenizer: SubwordTokenizer, settings: SearchSettings
) -> dict[str, Any]:
    """``translate_batch``'s keyword arguments for our search at ``settings``, but for ``max_decoding_length`` (one
    per call, where ours is each source's length + ``max_extra_len``): the beam and α (CTranslate2 divides by |Y|^α,
    ``power``; it has no form of GNMT's), our finishing and stopping rule being its own, ``min_decoding_length`` 0
    (its default, 1, bans </s> at the first step, where ours lets it end an output at once, as generate's does), the
    ids never generated."""
    return {
        "beam_size": settings.beam_size,
        "length_penalty": settings.length_penalty,
        "min_decoding_length": settings.min_len,
        "suppress_sequences": suppressed(config, tokenizer),
    }


def ctranslate2_greedy(
    folder: Path, tokenizer: SubwordTokenizer, texts: list[str], extra_len: int = EXTRA_LEN
) -> list[list[int]]:
    """Greedy output ids from CTranslate2 for ``texts``, with our limit of source length + ``extra_len``."""
    return ctranslate2_outputs(folder, tokenizer, texts, SearchSettings(beam_size=1, max_extra_len=extra_len))


def ctranslate2_outputs(
    folder: Path, tokenizer: SubwordTokenizer, texts: list[str], settings: SearchSettings
) -> list[list[int]]:
    """Output ids from CTranslate2 for ``texts`` at our search's ``settings`` (``translate_batch_options``).

    CTranslate2 takes one length limit per call, so sentences go in groups of equal source length.
    """
    import ctranslate2

    config = ModelFolder.open(folder).config

    # fp32 arithmetic, as ours (the stored fp16 weights would make CTranslate2 pick fp16 where it can).
    translator = ctranslate2.Translator(
        str(Path(folder) / CTRANSLATE2_DIR), device="cpu", compute_type="float32", inter_threads=1
    )
    vocab = tokenizer.tokenizer.get_vocab()
    sources = ctranslate2_sources(tokenizer, texts)
    options = translate_batch_options(config, tokenizer, settings)
    outputs: list[list[int]] = [[] for _ in texts]
    for length in sorted({len(source) for source in sources}):
        group = [i for i, source in enumerate(sources) if len(source) == length]
        limit = length + settings.max_extra_len
        results = translator.translate_batch([sources[i] for i in group], max_decoding_length=limit, **options)
        for i, result in zip(group, results, strict=True):
            outputs[i] = [vocab[token] for token in result.hypotheses[0]]
    return outputs
