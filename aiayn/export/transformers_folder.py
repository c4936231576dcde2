"""A model folder as a transformers folder (`aiayn export MODEL --to transformers --out DIR`).

The paper's Transformer is, in transformers, Marian where it is post-LN and Pegasus where it is pre-LN (sinusoidal
positions, scaled embeddings tied three ways, a bias on the logits; Pegasus adds a final LayerNorm after each stack),
so a folder of ours becomes one that ``AutoModelForSeq2SeqLM.from_pretrained``, ``AutoTokenizer``,
``pipeline("translation")`` (transformers 4; 5 removed the task), Optimum and CTranslate2's converter load with no
code of ours: the arrangement's ``config.json`` (``aiayn.convert.transformers_layout.arrangement_of``) and
``generation_config.json`` (the folder's beam and length penalty), ``model.safetensors`` under its names (the table
`aiayn import` reads by), ``tokenizer.json`` with a post-processor that adds ``</s>`` (and a multi-target folder's
``>>por<<``) as ``MarianTokenizer`` does, a ``tokenizer_config.json`` for ``AutoTokenizer`` and a model card.

Each architecture's own models start the decoder from a token of their own, and CTranslate2's converter counts on
it: Marian's from the last id, ``<pad>``, whose row is zeros (the converter drops that row and starts from a zero
vector), Pegasus's from ``<pad>``. A folder trained by aiayn starts from a learned ``<s>``, so the export starts it
where the architecture's models start (for Marian, a row of zeros it appends) and folds the difference, <s>'s scaled
embedding less the start's, into the decoder's position 0 (``start_of``, ``transformers_weights``,
``FOLDED_START``): the same function, which the converter then makes too.

Two differences remain between a native folder and transformers' models. Our sinusoids interleave sin and cos,
theirs come in halves: the weights are permuted along the model dimension, which is the same function exactly. Our
LayerNorm's ε is 1e-6, theirs 1e-5 and fixed: that one changes the numbers a little, and the export states by how
much (``measured_difference``). Writing the folder needs no PyTorch; measuring the ε's effect does, and is skipped,
said so, without it, and so does writing the graphs transformers.js runs (``transformers_js``, ``--transformers-js``),
refused without it, and for a pre-LN folder (transformers.js has no Pegasus).
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save
from tokenizers import Tokenizer, processors

from aiayn.convert.transformers_layout import (
    DECODER_POSITIONS,
    ENCODER_POSITIONS,
    FINAL_LOGITS_BIAS,
    FOLDED_START,
    FOLDED_START_BIAS,
    LAYER_NORM_EPS,
    ORIGINAL_LAYER_NORM_EPS,
    ORIGINAL_LENGTH_NORMALIZATION,
    ORIGINAL_POSITIONS,
    SHARED_EMBEDDING,
    arrangement_of,
    halves_order,
    halves_sinusoids,
    model_axis,
    transformers_names,
)
from aiayn.core.config import ModelConfig
from aiayn.core.folder import IMPORTED_SECTION, ModelFolder
from aiayn.core.normalizer import is_tidy, tidied
from aiayn.core.outputs import Command, claim, written_whole
from aiayn.core.public import yaml_quoted
from aiayn.core.tokenizer import SPECIAL_TOKEN_TEXT, TARGET_TOKENIZER_FILE, TOKENIZER_FILE
from aiayn.core.weight_spec import EMBEDDING

# transformers' names for our activations (config.ACTIVATIONS); "gelu" is the erf one in both.
ACTIVATION_FUNCTIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}
# The largest |Δ log-prob| the ε's difference may make before the export is refused: above it, something other
# than the ε differs.
EPSILON_TOLERANCE = 1e-2
HUB_NAME = "USER/aiayn-{src}-{tgt}"
# --transformers-js: the subfolder of the graphs transformers.js loads (``transformers_js``), and config.json's key
# for its defaults: the graphs are fp32, where its default on WASM is a q8 file.
ONNX_FOLDER = "onnx"
TRANSFORMERS = Command(
    "aiayn export --to transformers", "choose another --out, or pass --overwrite to replace the folder whole"
)
TRANSFORMERS_JS_CONFIG = {"transformers.js_config": {"dtype": "fp32"}}
TRANSFORMERS_JS_PRE_LN = (
    "--transformers-js: this folder is pre-LN, written as transformers' Pegasus, which transformers.js (4.3) does not "
    "run; export a post-LN folder (`aiayn train --set norm_first=false`) for transformers.js"
)
# What CTranslate2's converter reads from a Pegasus config.json (its PegasusLoader, a BartLoader): the layers are
# pre-LN, and there is no LayerNorm on the embeddings (BART's default, which PegasusConfig does not declare).
CTRANSLATE2_PRE_LN = {"normalize_before": True, "normalize_embedding": False}


@dataclass(frozen=True)
class Start:
    """Where the written model's decoder starts: ``id``, a row appended after the folder's vocabulary where
    ``appended``, and whether <s>, which ours start from, is ``folded`` into the decoder's position 0."""

    id: int
    appended: bool
    folded: bool


def starts_as_marian(config: ModelConfig, embedding: np.ndarray) -> bool:
    """Whether the decoder starts as Marian's own models do: from the last id, ``<pad>``, whose row is zeros (an
    imported OPUS-MT folder). ``embedding``: (vocab, d_model), ours."""
    tokens = config.special_tokens
    return tokens.bos == tokens.pad == config.vocab_size - 1 and not embedding[tokens.bos].any()


def start_of(config: ModelConfig, embedding: np.ndarray) -> Start:
    """Where the decoder starts, as the arrangement's own models start theirs and CTranslate2's converter
    assumes. Marian's: from the last id, ``<pad>``, whose row is zeros (the converter starts every Marian model from
    a zero vector), else from a row of zeros appended to start from. Pegasus's: from ``<pad>`` (the converter's
    ``decoder_start_token`` is the tokenizer's ``pad_token``)."""
    tokens = config.special_tokens
    if config.norm_first:
        return Start(tokens.pad, appended=False, folded=tokens.pad != tokens.bos)
    if starts_as_marian(config, embedding):
        return Start(tokens.bos, appended=False, folded=False)
    return Start(config.vocab_size, appended=True, folded=True)


def transformers_config(config: ModelConfig, start: Start) -> dict[str, Any]:
    """config.json: the arrangement's keys, with our sizes, activation, token ids and dropout; one id more than the
    folder's where the start is appended (a row no token of tokenizer.json names)."""
    tokens, arrangement = config.special_tokens, arrangement_of(config)
    rows = config.vocab_size + start.appended
    written = {
        "architectures": [arrangement.architecture],
        "model_type": arrangement.model_type,
        "vocab_size": rows,
        **({} if arrangement.norm_first else {"decoder_vocab_size": rows, "share_encoder_decoder_embeddings": True}),
        "tie_word_embeddings": True,
        "d_model": config.d_model,
        "encoder_layers": config.n_encoder_layers,
        "decoder_layers": config.n_decoder_layers,
        "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": ACTIVATION_FUNCTIONS[config.activation],
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout,
        "scale_embedding": config.scale_embedding,
        "max_position_embeddings": config.max_len,
        "pad_token_id": tokens.pad,
        "eos_token_id": tokens.eos,
        "bos_token_id": tokens.bos,
        "decoder_start_token_id": start.id,
        "forced_eos_token_id": None,  # Marian's and Pegasus's configs force an id at the length limit; ours do not
        "is_encoder_decoder": True,
        **(CTRANSLATE2_PRE_LN if arrangement.norm_first else {}),
        # The weights are stored as float16 (as in the folder), computed in float32 as every engine of ours does.
        "dtype": "float32",
    }
    if config.positions == "interleaved":
        written[ORIGINAL_POSITIONS] = "interleaved"
    if config.layer_norm_eps != LAYER_NORM_EPS:
        written[ORIGINAL_LAYER_NORM_EPS] = config.layer_norm_eps
    if start.folded:
        written[FOLDED_START] = tokens.bos
    return written


def generation_config(folder: ModelFolder, start: Start) -> dict[str, Any]:
    """generation_config.json: the folder's search defaults as ``generate`` takes them, and its normalisation where
    generate has none like it (GNMT's, ``ORIGINAL_LENGTH_NORMALIZATION``, for `aiayn import`); an appended start row
    is never generated, as Marian's models never generate their ``<pad>``."""
    config, search = folder.config, folder.search_defaults()
    tokens = config.special_tokens
    generation: dict[str, Any] = {
        "decoder_start_token_id": start.id,
        "bos_token_id": tokens.bos,
        "eos_token_id": tokens.eos,
        "pad_token_id": tokens.pad,
        "forced_eos_token_id": None,
        "max_length": config.max_len,
        "num_beams": int(search.get("beam_size", 4)),
        "length_penalty": float(search.get("length_penalty", 0.6)),
        # Ours stops a sentence once it holds num_beams finished hypotheses; generate's default goes on while a live
        # beam might still score better at its current length.
        "early_stopping": True,
    }
    normalization = search.get("length_normalization", "gnmt")
    if normalization != "power":  # generate's own
        generation[ORIGINAL_LENGTH_NORMALIZATION] = normalization
    banned = [*config.never_generate, *([start.id] if start.appended else [])]
    if banned:
        generation["bad_words_ids"] = [[i] for i in banned]
    return generation


def transformers_weights(config: ModelConfig, ours: dict[str, np.ndarray], start: Start) -> dict[str, np.ndarray]:
    """model.safetensors under transformers' names, permuted into the halves layout where ours interleave; float16
    as stored, so nothing is rounded. Both sinusoid tables (float32) where the arrangement stores them
    (``Arrangement.stores_positions``). Where the start is folded, the decoder's position table, float32, whose row 0
    holds what our decoder's first input adds to it, <s>'s scaled embedding, less the start row's; and where it is
    appended, a row of zeros after the embedding, whose logits bias keeps it from taking any probability
    (``FOLDED_START_BIAS``)."""
    order = halves_order(config.d_model) if config.positions == "interleaved" else None
    theirs: dict[str, np.ndarray] = {}
    for name, written in transformers_names(config).items():
        tensor, axis = ours[name], model_axis(name)
        if order is not None and axis is not None:
            tensor = np.take(tensor, order, axis=axis)
        theirs[written] = np.ascontiguousarray(tensor)
    if FINAL_LOGITS_BIAS in theirs:  # a buffer of both models, which starts as zeros where none is stored
        theirs[FINAL_LOGITS_BIAS] = theirs[FINAL_LOGITS_BIAS].reshape(1, -1)
    if arrangement_of(config).stores_positions:
        theirs[ENCODER_POSITIONS] = theirs[DECODER_POSITIONS] = halves_sinusoids(config.max_len, config.d_model)
    if start.folded:
        embedding, scale = theirs[SHARED_EMBEDDING], np.float32(embedding_scale(config))
        start_row = 0.0 if start.appended else embedding[start.id].astype(np.float32) * scale
        positions = halves_sinusoids(config.max_len, config.d_model)
        positions[0] += embedding[config.special_tokens.bos].astype(np.float32) * scale - start_row
        theirs[DECODER_POSITIONS] = positions
    if start.appended:
        embedding = theirs[SHARED_EMBEDDING]
        theirs[SHARED_EMBEDDING] = np.concatenate([embedding, np.zeros_like(embedding[:1])])
        bias = theirs.get(FINAL_LOGITS_BIAS, np.zeros((1, config.vocab_size), embedding.dtype))
        theirs[FINAL_LOGITS_BIAS] = np.concatenate([bias, np.full_like(bias[:, :1], FOLDED_START_BIAS)], axis=1)
    return theirs


def embedding_scale(config: ModelConfig) -> float:
    return math.sqrt(config.d_model) if config.scale_embedding else 1.0


def with_source_template(raw: Tokenizer, config: ModelConfig) -> Tokenizer:
    """A copy of the source side's tokenizer that adds what our steps add to every source (the source prefix
    before, ``</s>`` after), where transformers' users ask for special tokens; tidying its text itself."""
    tokenizer = Tokenizer.from_str(raw.to_str()) if is_tidy(raw) else tidied(raw, SPECIAL_TOKEN_TEXT.values())
    vocabulary = {i: tokenizer.id_to_token(i) for i in (*config.source_prefix, config.special_tokens.eos)}
    prefix = " ".join(f"{vocabulary[i]}:0" for i in config.source_prefix)
    eos = vocabulary[config.special_tokens.eos]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{prefix} $A:0 {eos}:0".strip(),
        pair=f"{prefix} $A:0 {eos}:0 $B:1 {eos}:1".strip(),
        special_tokens=[(token, i) for i, token in vocabulary.items()],
    )
    return tokenizer


def tokenizer_config(folder: ModelFolder) -> dict[str, Any]:
    """tokenizer_config.json: the fast tokenizer of tokenizer.json, its special tokens and the pair."""
    config, tokenizer = folder.config, folder.tokenizer
    tokens = config.special_tokens
    settings: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.max_len,
        "pad_token": tokenizer.id_to_token(tokens.pad),
        "eos_token": tokenizer.id_to_token(tokens.eos),
        "unk_token": tokenizer.id_to_token(tokens.unk),
        "clean_up_tokenization_spaces": False,
        "source_lang": config.src_lang,
        "target_lang": config.tgt_lang,
    }
    if tokens.bos != tokens.pad:
        settings["bos_token"] = tokenizer.id_to_token(tokens.bos)
    return settings


def best_bleu(folder: ModelFolder) -> str | None:
    bleu = folder.training_record().get("best_val_bleu")
    return None if bleu is None else f"{float(bleu):.2f}"


def hub_name(config: ModelConfig) -> str:
    return HUB_NAME.format(src=config.src_lang, tgt=config.tgt_lang)


def model_card(folder: ModelFolder, difference: str, start: Start, transformers_js: bool = False) -> str:
    """README.md: the Hub's front matter, what the model knows, how to load it and how it differs from ours."""
    config, name = folder.config, hub_name(folder.config)
    lines = [
        *card_summary(folder),
        *card_use(folder, name, start),
        *(card_source_prefix(folder) if config.source_prefix else []),
        *(card_transformers_js(name) if transformers_js else []),
        *(CARD_TARGET_TOKENIZER if (folder.path / TARGET_TOKENIZER_FILE).is_file() else []),
        *(card_folded_start(config, start) if start.folded else []),
        *card_from_aiayn(config, difference),
    ]
    return "---\n" + "\n".join(front_matter(folder)) + "\n---\n\n" + "\n".join(lines)


def front_matter(folder: ModelFolder) -> list[str]:
    """The Hub's metadata: library, task, languages, and an imported checkpoint's licence and Hub origin."""
    config, imported = folder.config, folder.section(IMPORTED_SECTION)
    return [
        "library_name: transformers",
        "pipeline_tag: translation",
        f"language:\n  - {yaml_quoted(config.src_lang)}\n  - {yaml_quoted(config.tgt_lang)}",
        f"tags:\n  - {arrangement_of(config).model_type}\n  - aiayn",
        *([f"license: {yaml_quoted(str(imported['license']))}"] if imported.get("license") else []),
        *([f"base_model: {yaml_quoted(str(imported['from']))}"] if imported.get("hub") else []),
    ]


def card_summary(folder: ModelFolder) -> list[str]:
    """The heading, what the model knows (and its BLEU while training, where it was trained) and its sizes."""
    config, bleu = folder.config, best_bleu(folder)
    return [
        f"# {config.src_lang} → {config.tgt_lang}",
        "",
        f"A Transformer (*Attention Is All You Need*) {html.escape(folder.provenance())}"
        + (f"; its best validation BLEU while training was {bleu} (greedy)." if bleu else "."),
        f"It is {arrangement_of(config).title}.",
        f"{config.n_encoder_layers}+{config.n_decoder_layers} layers, d_model {config.d_model}, "
        f"{config.n_heads} heads, d_ff {config.d_ff}, a vocabulary of {config.vocab_size} shared by both sides.",
        "",
    ]


def card_use(folder: ModelFolder, name: str, start: Start) -> list[str]:
    """Loading and translating with transformers, and what the folder's tokenizer and generation config hold."""
    return [
        "## Use",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "",
        f'name = "{name}"',
        "tokenizer, model = AutoTokenizer.from_pretrained(name), AutoModelForSeq2SeqLM.from_pretrained(name)",
        'batch = tokenizer(["A sentence."], return_tensors="pt", padding=True)',
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        "```",
        "",
        f'With transformers 4, `pipeline("translation", model="{name}")` translates as well (transformers 5 '
        "removed that task). The tokenizer is `tokenizer.json`, which needs no SentencePiece.",
        "",
        *card_beam(folder, start),
    ]


def card_beam(folder: ModelFolder, start: Start) -> list[str]:
    """The beam settings of generation_config.json, as generate and CTranslate2 take them, and whether they give
    aiayn's lines: they share its finishing and stopping rules (fairseq's), so only the normalisation can differ."""
    generation = generation_config(folder, start)
    beams, alpha = generation["num_beams"], generation["length_penalty"]
    ct2 = f"`translate_batch(tokens, beam_size={beams}, length_penalty={alpha}, min_decoding_length=0)`"
    if ORIGINAL_LENGTH_NORMALIZATION in generation:
        normalization = (
            "The model ranks finished hypotheses by GNMT's ((5 + |Y|) / 6)^α, which neither `generate` nor "
            "CTranslate2 can express: both divide by |Y|^α, so some of their beam lines differ from aiayn's."
        )
    else:
        normalization = (
            "The model ranks finished hypotheses by log-probability over |Y|^α, as `generate` and CTranslate2 do, "
            "so their beam search gives aiayn's lines."
        )
    return [
        f"`generation_config.json` holds the beam size ({beams}), the length penalty α ({alpha}) the model was tuned "
        "with and `early_stopping: true`: a sentence is done once it holds as many finished hypotheses as beams, and "
        "only an `</s>` ranked among the best `num_beams` candidates ends one (fairseq's rules, which `generate` and "
        f"CTranslate2 share). {normalization} With CTranslate2: `ct2-transformers-converter --model DIR "
        f"--output_dir ct2`, then {ct2} (its default minimum, 1, would keep `</s>` from ending an output at once).",
        "",
    ]


def card_source_prefix(folder: ModelFolder) -> list[str]:
    """A multi-target folder's one target, whose token tokenizer.json adds by itself."""
    config = folder.config
    prefix = " ".join(folder.tokenizer.id_to_token(i) for i in config.source_prefix)
    return [
        f"It translates into {config.tgt_lang} only: its vocabulary holds the tokens of several target "
        f"languages, and tokenizer.json puts `{prefix}` before every source by itself, where OPUS-MT's "
        f"tokenizer expects the text to start with it. Do not add it to the text as well.",
        "",
    ]


def card_transformers_js(name: str) -> list[str]:
    """Translating in JavaScript with the graphs of ``onnx/``."""
    return [
        "In JavaScript, transformers.js runs the ONNX graphs in `onnx/` (fp32; `config.json` says so):",
        "",
        "```js",
        'import { AutoModelForSeq2SeqLM, AutoTokenizer } from "@huggingface/transformers";',
        "",
        f'const tokenizer = await AutoTokenizer.from_pretrained("{name}");',
        f'const model = await AutoModelForSeq2SeqLM.from_pretrained("{name}");',
        'const inputs = await tokenizer(["A sentence."], { padding: true });',
        "const ids = await model.generate({ ...inputs, num_beams: 1, max_new_tokens: 64 });",
        "console.log(tokenizer.batch_decode(ids, { skip_special_tokens: true }));",
        "```",
        "",
        "The graphs compute the aiayn model itself (its LayerNorm ε included); the decoder graph projects the "
        "cross-attention's keys and values at every step rather than caching them.",
        "",
    ]


CARD_TARGET_TOKENIZER = [
    f"The target side has its own tokenizer, `{TARGET_TOKENIZER_FILE}` (load it with "
    "`PreTrainedTokenizerFast(tokenizer_file=...)` to encode labels for fine-tuning); translating needs "
    "only `tokenizer.json`.",
    "",
]


def card_folded_start(config: ModelConfig, start: Start) -> list[str]:
    """Where a folded start begins, and why only this folder's own weights keep it."""
    if start.appended:
        where = (
            f"from id {start.id}, a row of zeros after the tokenizer's {config.vocab_size} tokens (never generated), "
            "as Marian's own models start from theirs,"
        )
        kept = (
            " transformers' `save_pretrained` does not save Marian's position tables (it recomputes them on loading): "
            "a copy saved by it starts differently, so share this folder's own `model.safetensors`."
        )
    else:
        where, kept = f"from `<pad>` (id {start.id}), as Pegasus's own models do,", ""
    return [
        f"The decoder starts {where} and what `<s>`, which the aiayn model starts from, adds beyond it is folded into "
        "row 0 of the decoder's position table, stored in `model.safetensors`. So CTranslate2's "
        f"`ct2-transformers-converter` converts it as it is.{kept}",
        "",
    ]


def card_from_aiayn(config: ModelConfig, difference: str) -> list[str]:
    """How the folder was written, how to import it back, and how it differs from the aiayn folder."""
    target = f" --tgt {config.tgt_lang}" if config.source_prefix else ""
    return [
        "## From aiayn",
        "",
        f"Written by aiayn's `aiayn export MODEL --to transformers`; `aiayn import DIR --out FOLDER{target}` "
        f"gives the aiayn folder back. {difference}",
        "",
    ]


def epsilon_note(config: ModelConfig, measured: float | None) -> str:
    architecture = arrangement_of(config).architecture.removesuffix("MTModel").removesuffix("ForConditionalGeneration")
    if config.layer_norm_eps == LAYER_NORM_EPS:
        return f"It is the same function as the aiayn folder: {architecture}'s LayerNorm ε (1e-5) is the folder's."
    what = f"LayerNorm's ε is {architecture}'s 1e-5 where the aiayn folder's is {config.layer_norm_eps:g}"
    if measured is None:
        return f"{what} (the difference this makes was not measured: PyTorch or transformers is not installed)."
    return f"{what}: it changes the log-probabilities by at most {measured:.1e} on the export's check sentences."


def measured_difference(folder: ModelFolder, out: Path, start: Start) -> float | None:
    """The largest |Δ log-prob| between the folder's model and the written model (which starts from ``start``),
    teacher-forced (the check of `aiayn import`, ``check_against_checkpoint``); None where PyTorch or transformers
    is missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return None
    from aiayn.convert.marian import check_against_checkpoint
    from aiayn.model.weights import load_model

    return check_against_checkpoint(load_model(folder), out, folder.tokenizer, EPSILON_TOLERANCE, start.id)


def export_transformers(
    folder: ModelFolder, out: Path, transformers_js: bool = False, overwrite: bool = False
) -> list[str]:
    """Write the transformers folder of ``folder`` into ``out`` (new, empty or an earlier export's, unless
    ``overwrite``; replaced whole or not at all, ``core/outputs.py``), with
    the ONNX graphs transformers.js loads where ``transformers_js`` (PyTorch exports them); the report lines say
    what it holds, how it was checked, how to load and publish it."""
    refuse_to_export(folder, out, transformers_js, overwrite)
    with written_whole(out, TRANSFORMERS, overwrite, [folder.path]) as staging:
        difference, start = write_transformers_folder(folder, staging, transformers_js)
    return report_lines(folder, out, difference, start, transformers_js)


def refuse_to_export(folder: ModelFolder, out: Path, transformers_js: bool, overwrite: bool) -> None:
    """Every reason not to start, before anything is written: graphs that transformers.js cannot run or no PyTorch
    to export them, a folder without weights or tokenizer, an ``out`` that holds what an earlier export did not write
    (unless ``overwrite``)."""
    if transformers_js and folder.config.norm_first:
        raise ValueError(TRANSFORMERS_JS_PRE_LN)
    if transformers_js and importlib.util.find_spec("torch") is None:
        raise ValueError("--transformers-js exports the model's ONNX graphs with PyTorch, which is not installed")
    folder.require([folder.weights_file, folder.tokenizer_file], "export a trained or imported folder")
    claim(out, TRANSFORMERS, overwrite, [folder.path])


def start_name(start: Start) -> str:
    return "an appended row of zeros" if start.appended else f"<pad> (id {start.id})"


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_transformers_folder(folder: ModelFolder, staging: Path, transformers_js: bool) -> tuple[str, Start]:
    """Every file of the transformers folder into ``staging``; the card's line on how it differs from ours, and
    where the decoder starts."""
    config = folder.config
    folder.check_weights()
    ours = load_file(str(folder.weights_file))
    start = start_of(config, ours[EMBEDDING])
    write_json(
        staging / "config.json",
        transformers_config(config, start) | (TRANSFORMERS_JS_CONFIG if transformers_js else {}),
    )
    write_json(staging / "generation_config.json", generation_config(folder, start))
    weights = transformers_weights(config, ours, start)
    (staging / "model.safetensors").write_bytes(save(weights, metadata={"format": "pt"}))
    with_source_template(folder.tokenizer.tokenizer, config).save(str(staging / TOKENIZER_FILE))
    write_json(staging / "tokenizer_config.json", tokenizer_config(folder))
    if folder.target_tokenizer_file.is_file():
        shutil.copyfile(folder.target_tokenizer_file, staging / TARGET_TOKENIZER_FILE)
    # Measured on the written folder, so that the number is the one its users get.
    difference = epsilon_note(config, measured_difference(folder, staging, start))
    if transformers_js:
        from aiayn.export.transformers_js import write_transformers_js_graphs

        write_transformers_js_graphs(folder, staging / ONNX_FOLDER, start.appended)
    (staging / "README.md").write_text(model_card(folder, difference, start, transformers_js), encoding="utf-8")
    return difference, start


def report_lines(folder: ModelFolder, out: Path, difference: str, start: Start, transformers_js: bool) -> list[str]:
    """What ``out`` holds, how it was checked, how to load and publish it."""
    config, name, arrangement = folder.config, hub_name(folder.config), arrangement_of(folder.config)
    size = (out / "model.safetensors").stat().st_size
    return [
        f"wrote {out}: {arrangement.title} ({arrangement.architecture}), {config.src_lang}→{config.tgt_lang}, "
        f"model.safetensors {size / 1e6:.1f} MB ({folder.provenance()})",
        difference,
        f'load it: AutoModelForSeq2SeqLM.from_pretrained("{out}") and AutoTokenizer.from_pretrained("{out}")',
        *(
            [f"{out / ONNX_FOLDER}: the ONNX graphs transformers.js loads (fp32, the aiayn model's own function)"]
            if transformers_js
            else []
        ),
        *(
            [f"the decoder starts from {start_name(start)}, <s> folded into its position 0 (see {out}/README.md)"]
            if start.folded
            else []
        ),
        f"publish it: hf repos create {name}",
        f"            hf upload {name} {out} .",
    ]
