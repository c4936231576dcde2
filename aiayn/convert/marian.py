"""A Marian checkpoint (transformers' ``MarianMTModel``, the OPUS-MT models), or a Pegasus one that `aiayn export
--to transformers` wrote from a pre-LN folder, as an aiayn model folder.

Marian's model is the paper's post-LN Transformer with three-way tied embeddings; it differs from ours only in
choices the config declares (``aiayn.core.config``): the feed-forward's activation (SiLU, "swish", in OPUS-MT),
the sinusoids' layout (all sines, then all cosines), a bias on the logits (``final_logits_bias``), LayerNorm's
ε of 1e-5, and its special ids: ``</s>`` is id 0, ``<pad>`` the last id and also the decoder's start token, and
``bad_words_ids`` keep the search from choosing ``<pad>``. Its two SentencePiece models (``source.spm``,
``target.spm``) cut text into pieces of one shared vocabulary (``vocab.json``); they become two tokenizer.json
files (``aiayn.convert.sentencepiece``), so no SentencePiece is needed to serve. Beam search ranks hypotheses as
Hugging Face's ``generate`` does (log-probability over |Y|^length_penalty), with the checkpoint's beam size.

A multi-target checkpoint (``opus-mt-tc-big-en-pt``, ``opus-mt-en-ROMANCE``) translates into the language whose
token (``>>por<<``) starts the source; its vocabulary holds one such token per language. It is imported once per
target (``--tgt por``): the folder's config declares the token as its ``source_prefix``, which every step adds
before a sentence's subwords, exactly as ``MarianTokenizer`` encodes ``">>por<< " + sentence``, and the search
never generates any language token, so none reaches a translation.

A checkpoint that `aiayn export --to transformers` wrote has no .spm files: its ``tokenizer.json`` (and
``target_tokenizer.json``) are read as they are, its decoder may start from ``<s>`` rather than ``<pad>``, and
``config.json``'s ``aiayn_positions`` says that its weights were permuted from the interleaved layout
(``transformers_layout``), which the import undoes, and ``aiayn_layer_norm_eps`` the folder's ε: the folder comes
back as it was, bit for bit. Such a checkpoint may be Pegasus (``PegasusForConditionalGeneration``), the pre-LN
arrangement of the same model under the same names (``transformers_layout.Arrangement``), with a final LayerNorm
after each stack.

What a folder cannot hold is refused in one line: another ``model_type``, separate source and target
vocabularies, unequal encoder and decoder sizes, an activation we do not have, untied output weights. The weights
are stored as float16 like every folder's, and the imported model is checked against the checkpoint's own model
(``AutoModelForSeq2SeqLM``, with the same rounded weights and its LayerNorm ε) before the folder is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aiayn.convert.sentencepiece import read_spm, tokenizer_from_sentencepiece
from aiayn.convert.transformers_layout import (
    ARRANGEMENTS,
    FINAL_LOGITS_BIAS,
    FOLDED_START,
    LAYER_NORM_EPS,
    ORIGINAL_LAYER_NORM_EPS,
    ORIGINAL_LENGTH_NORMALIZATION,
    ORIGINAL_POSITIONS,
    SHARED_EMBEDDING,
    TIED_COPIES,
    Arrangement,
    halves_order,
    inverse,
    model_axis,
    transformers_names,
)
from aiayn.core.config import ModelConfig, SpecialTokens
from aiayn.core.folder import IMPORTED_SECTION, SEARCH_SECTION, ModelFolder
from aiayn.core.outputs import Command, claim, written_whole
from aiayn.core.tokenizer import (
    SPECIAL_TOKEN_TEXT,
    TARGET_TOKENIZER_FILE,
    TOKENIZER_FILE,
    SubwordTokenizer,
    read_tokenizer,
)
from aiayn.core.weight_spec import EMBEDDING, LOGITS_BIAS
from aiayn.model.transformer import Transformer
from aiayn.model.weights import STORAGE_DTYPE, load_state_strict, read_tensor_pickle, save_weights

CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "source.spm",
    "target.spm",
    "vocab.json",
    "tokenizer_config.json",
    TOKENIZER_FILE,  # where the checkpoint has no .spm files (one that `aiayn export --to transformers` wrote)
    TARGET_TOKENIZER_FILE,
    "README.md",  # the model card: its front matter states the licence
)
IMPORT = Command("aiayn import", "choose another --out, or pass --overwrite to replace the folder whole")
# transformers' names for Marian's activations → ours (config.ACTIVATIONS).
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# A Hub id of the OPUS-MT family names its pair: Helsinki-NLP/opus-mt-en-de.
OPUS_PAIR = re.compile(r"opus-mt-(?:tc-big-)?([a-z]{2,3})-([a-z]{2,3})$")
# A target-language token of a multi-target vocabulary, as MarianTokenizer finds them: >>por<<, >>pt_BR<<.
LANGUAGE_TOKEN = re.compile(r"^>>(.+)<<$")
# How closely the imported model must follow the checkpoint's (same rounded weights, fp32 arithmetic).
CHECK_TOLERANCE = 1e-4
# Teacher-forced: a source, and a target-side text fed to the decoder (any text checks the arithmetic).
CHECK_SOURCE = "The stock market fell sharply after the bank raised rates."
CHECK_TARGET = "Zwei Hunde spielen im Schnee."


class UnsupportedCheckpoint(ValueError):
    """A checkpoint that a model folder cannot represent: the message says what and why."""


# The Hub's cache keeps each download under the commit it resolved to: .../snapshots/<commit sha>.
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


def checkpoint_dir(source: str, revision: str | None = None) -> tuple[Path, str | None]:
    """(the checkpoint's folder, the Hub commit it was read at): a local folder as it is (no commit), or a Hub id
    at ``revision`` (a branch, tag or commit; the default branch where None) downloaded once into Hugging Face's
    cache (the user's endpoint and token, as ``huggingface_hub`` is configured), only the files an import reads."""
    path = Path(source).expanduser()
    if path.is_dir():
        if revision is not None:
            raise ValueError(f"--revision picks a commit of a Hub id; {source} is a folder, read as it is")
        return path, None
    if not HUB_ID.match(source):
        raise FileNotFoundError(
            f"{source} is neither a folder nor a Hugging Face Hub id like Helsinki-NLP/opus-mt-en-de"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(source, revision=revision, allow_patterns=list(CHECKPOINT_FILES)))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        at = f" at revision {revision}" if revision else ""
        raise FileNotFoundError(
            f"could not download {source}{at} from the Hugging Face Hub ({type(err).__name__}: {err}); check the id"
            f"{', the revision' if revision else ''} and the network, or download it elsewhere and pass its folder"
        ) from None
    return snapshot, snapshot.name if COMMIT_SHA.match(snapshot.name) else None


def card_license(path: Path) -> str | None:
    """The licence the checkpoint's model card states (``license:`` in README.md's front matter), else None."""
    card = path / "README.md"
    if not card.is_file():
        return None
    import yaml
    from huggingface_hub.repocard import metadata_load

    try:
        licence = (metadata_load(card) or {}).get("license")
    except yaml.YAMLError:  # a card whose front matter is not YAML states nothing we can read
        return None
    return str(licence) if licence else None


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise UnsupportedCheckpoint(f"{path} is not a JSON object")
    return data


@dataclass(frozen=True)
class Checkpoint:
    """A Marian checkpoint's files, read once."""

    path: Path
    config: dict[str, Any]
    generation: dict[str, Any]  # generation_config.json, else the generation keys of config.json
    tokenizer_config: dict[str, Any]
    vocab: dict[str, int]

    @classmethod
    def read(cls, path: Path) -> Checkpoint:
        """A checkpoint with Marian's SentencePiece files, or one whose tokenizer is a ``tokenizer.json`` (as
        `aiayn export --to transformers` writes), whose vocabulary is then that file's."""
        spm = not (path / TOKENIZER_FILE).is_file() or (path / "source.spm").is_file()
        needed = ("config.json", *(("source.spm", "target.spm", "vocab.json") if spm else ()))
        missing = [f for f in needed if not (path / f).is_file()]
        if not any((path / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
            missing.append("model.safetensors or pytorch_model.bin")
        if missing:
            raise FileNotFoundError(f"{path} is not a Marian checkpoint: it lacks {', '.join(missing)}")
        config = read_json(path / "config.json")
        generation = read_json(path / "generation_config.json") or config
        if spm:
            vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
        else:
            vocab = read_tokenizer(path / TOKENIZER_FILE).get_vocab(with_added_tokens=True)
        return cls(path, config, generation, read_json(path / "tokenizer_config.json"), vocab)

    @property
    def has_spm(self) -> bool:
        return (self.path / "source.spm").is_file()

    def tokenizer(self, source_prefix: tuple[int, ...]) -> SubwordTokenizer:
        """The two SentencePiece models as tokenizer.json files, or the checkpoint's own tokenizer.json (and
        target_tokenizer.json) without the post-processor that adds the prefix and </s> for transformers' users
        (our steps add them, ``SubwordTokenizer.encode_source``)."""
        if self.has_spm:
            source_side = tokenizer_from_sentencepiece(self.path / "source.spm", self.vocab)
            target_side = tokenizer_from_sentencepiece(self.path / "target.spm", self.vocab)
            same = source_side.to_str() == target_side.to_str()
            return SubwordTokenizer(source_side, None if same else target_side, source_prefix)
        sides = [read_tokenizer(self.path / TOKENIZER_FILE)]
        if (self.path / TARGET_TOKENIZER_FILE).is_file():
            sides.append(read_tokenizer(self.path / TARGET_TOKENIZER_FILE))
        for side in sides:
            side.post_processor = None
        return SubwordTokenizer(sides[0], sides[1] if len(sides) > 1 else None, source_prefix)

    def refuse_what_we_cannot_hold(self) -> None:
        c = self.config
        model_type = c.get("model_type")
        if model_type not in ARRANGEMENTS:
            raise UnsupportedCheckpoint(
                f"model_type {model_type!r} is not supported: `aiayn import` reads Marian (OPUS-MT) checkpoints "
                "and the Pegasus ones `aiayn export --to transformers` writes, "
                "the paper's encoder-decoder; other families differ in ways a model folder cannot express"
            )
        if not c.get("share_encoder_decoder_embeddings", True) or self.tokenizer_config.get("separate_vocabs"):
            raise UnsupportedCheckpoint(
                "separate source and target vocabularies are not supported: our model ties the source "
                "embeddings, target embeddings and output projection into one matrix (§3.4)"
            )
        if c.get("decoder_vocab_size") not in (None, c.get("vocab_size")):
            raise UnsupportedCheckpoint("a decoder vocabulary unlike the encoder's is not supported (tied embeddings)")
        for encoder_key, decoder_key in (
            ("encoder_attention_heads", "decoder_attention_heads"),
            ("encoder_ffn_dim", "decoder_ffn_dim"),
        ):
            if c.get(encoder_key) != c.get(decoder_key):
                raise UnsupportedCheckpoint(
                    f"{encoder_key} {c.get(encoder_key)} != {decoder_key} {c.get(decoder_key)}: one config holds "
                    "one size for both stacks"
                )
        if c.get("activation_function") not in ACTIVATIONS:
            raise UnsupportedCheckpoint(
                f"activation_function {c.get('activation_function')!r} is not supported "
                f"(we have {', '.join(sorted(ACTIVATIONS))})"
            )
        pre_ln_keys = c.get("normalize_before") or c.get("normalize_embedding") or c.get("add_final_layer_norm")
        if model_type == "marian" and pre_ln_keys:
            raise UnsupportedCheckpoint("pre-LN or embedding-norm Marian variants are not supported")
        bad = [ids for ids in self.generation.get("bad_words_ids") or [] if len(ids) != 1]
        if bad:
            raise UnsupportedCheckpoint(f"bad_words_ids of several tokens ({bad[:2]}) are not supported")

    def language_tokens(self) -> dict[str, str]:
        """Target language code → its token (``por`` → ``>>por<<``), one per language of a multi-target
        checkpoint; empty for a one-pair checkpoint."""
        return {match[1]: token for token in sorted(self.vocab) if (match := LANGUAGE_TOKEN.match(token))}

    def target_token(self, tgt_lang: str | None) -> str | None:
        """The token that chooses ``tgt_lang`` (--tgt) in a multi-target checkpoint; None in a one-pair one.
        Refuses a multi-target checkpoint without --tgt, or with a code it does not offer, listing its codes."""
        tokens = self.language_tokens()
        if not tokens:
            return None
        offered = ", ".join(tokens)
        if tgt_lang is None:
            raise UnsupportedCheckpoint(
                "this checkpoint translates into the language whose token starts the source "
                f"({len(tokens)} in its vocabulary, >>{next(iter(tokens))}<< ...): import it once per target with "
                f"--tgt, one of {offered}"
            )
        if tgt_lang not in tokens:
            raise UnsupportedCheckpoint(f"--tgt {tgt_lang} is not a target of this checkpoint; choose one of {offered}")
        # MarianTokenizer encodes ">>por<< " + text as >>por<< and the pieces of " " + text: the same pieces as
        # text's alone only where the spm drops leading white space, as OPUS-MT's all do.
        if self.has_spm and not read_spm(self.path / "source.spm").normalizer_spec.remove_extra_whitespaces:
            raise UnsupportedCheckpoint(
                "source.spm keeps leading white space, so the pieces after a >>xx<< token would differ from a "
                "sentence's own; not supported"
            )
        return tokens[tgt_lang]

    def languages(self, source: str, src_lang: str | None, tgt_lang: str | None) -> tuple[str, str]:
        """--src/--tgt where given, else the pair from the tokenizer config, else from an OPUS-MT name."""
        named = self.tokenizer_config.get("source_lang"), self.tokenizer_config.get("target_lang")
        if not all(named) and (match := OPUS_PAIR.search(source.rstrip("/"))):
            named = match.groups()
        src, tgt = src_lang or named[0], tgt_lang or named[1]
        if not (src and tgt):
            raise UnsupportedCheckpoint(
                "the checkpoint does not say its languages (tokenizer_config.json has no source_lang/target_lang); "
                "pass --src and --tgt"
            )
        return str(src), str(tgt)

    def model_config(self, src_lang: str, tgt_lang: str, logits_bias: bool, target_token: str | None) -> ModelConfig:
        """``target_token``: a multi-target checkpoint's token for ``tgt_lang`` (>>por<<), which every source
        starts with; no language token is ever generated (transformers' ``generate`` bans only <pad>)."""
        c, vocab = self.config, self.vocab
        pad, eos = int(c["pad_token_id"]), int(c["eos_token_id"])
        unk = vocab.get(SPECIAL_TOKEN_TEXT["unk"])
        if unk is None:
            raise UnsupportedCheckpoint("the vocabulary has no <unk> token")
        start = int(c.get(FOLDED_START, c.get("decoder_start_token_id", pad)))
        rows = self.rows
        bad_words = {int(ids[0]) for ids in self.generation.get("bad_words_ids") or []} - {rows}
        languages = {vocab[token] for token in self.language_tokens().values()}
        return ModelConfig(
            vocab_size=rows,
            d_model=int(c["d_model"]),
            n_heads=int(c["encoder_attention_heads"]),
            d_ff=int(c["encoder_ffn_dim"]),
            n_encoder_layers=int(c["encoder_layers"]),
            n_decoder_layers=int(c["decoder_layers"]),
            dropout=float(c.get("dropout", 0.1)),
            attention_dropout=float(c.get("attention_dropout", 0.0)),
            activation_dropout=float(c.get("activation_dropout", 0.0)),
            norm_first=self.arrangement.norm_first,
            # transformers' (fixed), or the aiayn folder's that `aiayn export` wrote it from
            layer_norm_eps=float(c.get(ORIGINAL_LAYER_NORM_EPS, LAYER_NORM_EPS)),
            max_len=int(c.get("max_position_embeddings", 512)),
            src_lang=src_lang,
            tgt_lang=tgt_lang,
            special_tokens=SpecialTokens(pad=pad, unk=int(unk), bos=start, eos=eos),
            activation=ACTIVATIONS[c["activation_function"]],
            # halves, Marian's; or the interleaved layout of a folder of ours that `aiayn export` permuted
            positions=str(c.get(ORIGINAL_POSITIONS, "halves")),
            scale_embedding=bool(c.get("scale_embedding", False)),
            logits_bias=logits_bias,
            never_generate=tuple(sorted(bad_words | languages)),
            source_prefix=() if target_token is None else (vocab[target_token],),
        )

    @property
    def rows(self) -> int:
        """The vocabulary's size as ours: without the row of zeros that `aiayn export` appended to start from
        where it folded the start into a Marian model (``FOLDED_START``, a start that no token names)."""
        c = self.config
        appended = FOLDED_START in c and int(c["decoder_start_token_id"]) >= len(self.vocab)
        return int(c["vocab_size"]) - appended

    @property
    def their_start(self) -> int | None:
        """The id the checkpoint's decoder starts from, where it is not the one our model starts from."""
        return int(self.config["decoder_start_token_id"]) if FOLDED_START in self.config else None

    def search_defaults(self) -> dict[str, Any]:
        """generate's search: its beam and length penalty, and its score, log-probability / |Y|^length_penalty;
        or, for a checkpoint that `aiayn export` wrote, the normalisation the folder searched with."""
        g = self.generation
        return {
            "beam_size": int(g.get("num_beams") or 1),
            "length_penalty": float(g.get("length_penalty", 1.0)),
            "length_normalization": str(g.get(ORIGINAL_LENGTH_NORMALIZATION, "power")),
        }

    @property
    def arrangement(self) -> Arrangement:
        return ARRANGEMENTS[str(self.config["model_type"])]

    def state_dict(self) -> dict[str, torch.Tensor]:
        if (self.path / "model.safetensors").is_file():
            from safetensors.torch import load_file

            return load_file(str(self.path / "model.safetensors"))
        state: dict[str, torch.Tensor] = read_tensor_pickle(self.path / "pytorch_model.bin")
        return state


def our_state(config: ModelConfig, theirs: dict[str, torch.Tensor], order: list[int] | None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under our names (``transformers_layout.transformers_names``); every tensor of theirs
    is used or known to be redundant (tied copies, the fixed sinusoid tables), else the import is refused.
    ``order``: the permutation that takes the checkpoint's halves layout back to the interleaved one, where it came
    from ours."""
    names = transformers_names(config)
    missing = [name for name in names.values() if name not in theirs]
    if missing:
        raise UnsupportedCheckpoint(f"the checkpoint lacks {', '.join(missing[:5])} ({len(missing)})")
    state = {ours: theirs[name] for ours, name in names.items()}
    if config.logits_bias:
        state[LOGITS_BIAS] = state[LOGITS_BIAS].reshape(-1)
    for tied in TIED_COPIES:
        if tied in theirs and not torch.equal(theirs[tied], state[EMBEDDING]):
            raise UnsupportedCheckpoint(f"{tied} differs from {SHARED_EMBEDDING}: untied embeddings (§3.4)")
    for name in (EMBEDDING, LOGITS_BIAS):  # a folded start's appended row (Checkpoint.rows), which ours lack
        if name in state and state[name].size(0) == config.vocab_size + 1:
            state[name] = state[name][: config.vocab_size]
    if order is not None:
        index = torch.tensor(order)
        for ours, tensor in state.items():
            if (axis := model_axis(ours)) is not None:
                state[ours] = tensor.index_select(axis, index)
    # All zeros where the config has no bias; fixed sinusoid tables, which the positions recompute (transformers
    # keeps them as buffers in some versions).
    used = {*names.values(), *TIED_COPIES, FINAL_LOGITS_BIAS}
    used |= {name for name in theirs if name.endswith("embed_positions.weight")}
    unknown = sorted(set(theirs) - used)
    if unknown:
        raise UnsupportedCheckpoint(f"tensors this import does not know: {', '.join(unknown[:5])} ({len(unknown)})")
    return state


def check_against_checkpoint(
    model: Transformer,
    path: Path,
    tokenizer: SubwordTokenizer,
    tolerance: float = CHECK_TOLERANCE,
    their_start: int | None = None,
) -> float:
    """The largest |Δ log-probability| between our model and the checkpoint's own (its weights
    rounded as ours are) over teacher-forced sentences; refuses the import (or export) above ``tolerance``.
    ``their_start``: the id the checkpoint's decoder starts from where it is not ours (a folded start, whose
    appended row the checkpoint never generates and our model does not have)."""
    from transformers import AutoModelForSeq2SeqLM

    reference = AutoModelForSeq2SeqLM.from_pretrained(str(path)).eval()
    with torch.no_grad():
        for name, tensor in [*reference.named_parameters(), *reference.named_buffers()]:
            if not name.endswith("embed_positions.weight"):  # computed as ours are, or a folded start's, float32
                tensor.copy_(tensor.to(STORAGE_DTYPE).float())
        src = torch.tensor([tokenizer.encode_source(CHECK_SOURCE)])  # (1, src_len)
        start = model.config.special_tokens.bos
        target = tokenizer.encode_target_batch([CHECK_TARGET])[0]
        tgt = torch.tensor([[start, *target]])  # (1, 1 + tgt_len)
        their_tgt = torch.tensor([[start if their_start is None else their_start, *target]])
        logits = reference(input_ids=src, decoder_input_ids=their_tgt).logits  # (1, 1 + tgt_len, vocab (+ 1))
        theirs = logits[..., : model.config.vocab_size].log_softmax(-1)
        ours = model(src, tgt).log_softmax(-1)
    diff = float((theirs - ours).abs().max())
    if not diff <= tolerance:
        raise ValueError(
            f"the aiayn model differs from the checkpoint's {type(reference).__name__} by {diff:.2e} in "
            f"log-probability (tolerance {tolerance:.0e}); the checkpoint has something this conversion does not "
            "express"
        )
    return diff


def import_marian(
    source: str,
    out: Path,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    revision: str | None = None,
    overwrite: bool = False,
) -> tuple[ModelFolder, list[str]]:
    """Write the model folder of the Marian checkpoint ``source`` (a folder, or a Hub id at ``revision``) into
    ``out``; returns the folder and lines that report what was read and checked. ``out`` is written whole or not at
    all; one holding anything but an earlier import's folder is refused, before the checkpoint is read, unless
    ``overwrite``. Its ``imported`` section records the Hub commit read, so that the same weights can be fetched
    again."""
    claim(Path(out), IMPORT, overwrite)
    path, commit = checkpoint_dir(source, revision)
    checkpoint = Checkpoint.read(path)
    checkpoint.refuse_what_we_cannot_hold()
    target_token = checkpoint.target_token(tgt_lang)
    src_lang, tgt_lang = checkpoint.languages(source, src_lang, tgt_lang)
    theirs = checkpoint.state_dict()
    bias = theirs.get("final_logits_bias")
    has_bias = bias is not None and bool(bias.reshape(-1)[: checkpoint.rows].any())  # a folded start's row aside
    config = checkpoint.model_config(src_lang, tgt_lang, has_bias, target_token)
    tokenizer = checkpoint.tokenizer(config.source_prefix)
    if tokenizer.vocab_size != config.vocab_size:
        raise UnsupportedCheckpoint(
            f"its vocabulary holds {tokenizer.vocab_size} tokens where config.json says {config.vocab_size}"
        )
    model = Transformer(config)
    order = inverse(halves_order(config.d_model)) if config.positions == "interleaved" else None
    load_state_strict(model, our_state(config, theirs, order), str(checkpoint.path))
    # Checked with transformers' ε, so that the check is of the weights: a folder of ours keeps its own.
    checked = Transformer(config.replace(layer_norm_eps=LAYER_NORM_EPS))
    checked.load_state_dict(model.state_dict())
    diff = check_against_checkpoint(checked.eval(), checkpoint.path, tokenizer, their_start=checkpoint.their_start)

    with written_whole(Path(out), IMPORT, overwrite, [checkpoint.path]) as staging:
        folder = ModelFolder.create(staging, config, tokenizer)
        save_weights(model, folder)
        folder.write_section(SEARCH_SECTION, checkpoint.search_defaults())
        hub, licence = not Path(source).expanduser().is_dir(), card_license(checkpoint.path)
        imported = {
            "from": source,
            "hub": hub,
            **({"revision": commit} if hub else {}),  # None where the cache did not say the commit
            "license": licence,
            "model_type": checkpoint.arrangement.model_type,
            "max_log_prob_diff": diff,
        }
        folder.write_section(IMPORTED_SECTION, imported)
    folder = ModelFolder.open(out)
    parameters = sum(p.numel() for p in model.parameters())
    targets = checkpoint.language_tokens()
    chosen = [f"every source starts with {target_token}, one of {len(targets)} targets"] if target_token else []
    at = f" at commit {commit}" if commit else ""
    return folder, [
        f"imported {source}{at}: {checkpoint.arrangement.title}, {parameters / 1e6:.1f} M parameters, "
        f"{config.src_lang}→{config.tgt_lang}, "
        f"{config.n_encoder_layers}+{config.n_decoder_layers} layers, d_model {config.d_model}, "
        f"vocabulary {config.vocab_size}, {config.activation}",
        *chosen,
        f"checked against its {checkpoint.arrangement.architecture}: max |Δ log-prob| {diff:.2e} (tolerance "
        f"{CHECK_TOLERANCE:.0e}, with its LayerNorm ε {LAYER_NORM_EPS:g}; the folder's is {config.layer_norm_eps:g})",
        f"wrote {out}: translate with `aiayn translate --model {out} TEXT`, serve with `aiayn serve --model {out}`",
    ]
