"""Tiny Marian checkpoints made by the tests: SentencePiece models trained here, a shared vocab.json, and a random
``MarianMTModel`` whose weights are float16 values (as a model folder stores them), saved as transformers saves."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiayn.data.multi30k import find_data_dir

# Words for a corpus where Multi30k is absent: enough variety for SentencePiece to learn a few hundred pieces.
WORDS = {
    "en": "the a two dogs dog man woman child plays runs sits red blue green in on under snow park street water "
    "with small big young old people are is near while holding ball bike".split(),
    "de": "der die das zwei Hunde Hund Mann Frau Kind spielt läuft sitzt rot blau grün im auf unter Schnee Park "
    "Straße Wasser mit klein groß jung alt Leute sind ist nahe während hält Ball Fahrrad".split(),
}


def sentences(lang: str, count: int) -> list[str]:
    """Multi30k's train lines of ``lang`` where the corpus is at hand, else made-up sentences of WORDS."""
    data = find_data_dir(None)
    if data is not None and (data / f"train.{lang}.gz").is_file():
        with gzip.open(data / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for line, _ in zip(f, range(count), strict=False)]
    words = WORDS[lang]
    return [
        " ".join(words[(i * 7 + j * 13) % len(words)] for j in range(3 + i % 9)).capitalize() + "."
        for i in range(count)
    ]


def train_spm(
    lines: Sequence[str], prefix: Path, vocab_size: int, model_type: str = "unigram", byte_fallback: bool = False
) -> Path:
    """A SentencePiece model as OPUS-MT trains them (Unigram, full character coverage); its ``.model`` file."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        byte_fallback=byte_fallback,
        character_coverage=1.0,
        hard_vocab_limit=False,  # a few built-in or made-up sentences hold fewer pieces than asked for
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def marian_vocab(models: Iterable[Path], eos_first: bool = True, targets: Sequence[str] = ()) -> dict[str, int]:
    """vocab.json over the pieces of ``models``: OPUS-MT's layout, </s> 0, <unk> 1, the pieces, <pad> last; or
    (``eos_first=False``) the pieces first and </s>, <unk>, <pad> the last three ids. ``targets``: a multi-target
    vocabulary's language tokens (``por`` → ``>>por<<``), after </s> and <unk>."""
    import sentencepiece as spm

    pieces: dict[str, None] = {}
    for model in models:
        processor = spm.SentencePieceProcessor(model_file=str(model))
        for i in range(processor.get_piece_size()):
            if not (processor.is_control(i) or processor.is_unknown(i)):
                pieces.setdefault(processor.id_to_piece(i))
    languages = [f">>{code}<<" for code in targets]
    tokens = ["</s>", "<unk>", *languages, *pieces, "<pad>"] if eos_first else [*pieces, "</s>", "<unk>", "<pad>"]
    return {token: i for i, token in enumerate(tokens)}


@dataclass(frozen=True)
class SpmKit:
    """How this folder's tests make SentencePiece models and Marian vocabularies (``spm_kit``)."""

    train: Callable[..., Path]
    vocab: Callable[..., dict[str, int]]


@pytest.fixture(scope="session")
def spm_kit() -> SpmKit:
    return SpmKit(train_spm, marian_vocab)


@pytest.fixture(scope="session")
def spm_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """source.spm (English) and target.spm (German), Unigram models of a few hundred pieces."""
    folder = tmp_path_factory.mktemp("spm")
    return (
        train_spm(sentences("en", 3000), folder / "source", 400),
        train_spm(sentences("de", 3000), folder / "target", 400),
    )


MakeCheckpoint = Callable[..., Path]


@pytest.fixture(scope="session")
def parallel() -> tuple[list[str], list[str]]:
    """English and German sentences, line by line translations of each other where Multi30k is at hand."""
    return sentences("en", 3600)[3200:], sentences("de", 3600)[3200:]


@pytest.fixture(scope="session")
def held_out() -> list[str]:
    """200 English sentences the SentencePiece models were not trained on."""
    return sentences("en", 3200)[-200:]


@pytest.fixture(scope="session")
def marian_checkpoint(tmp_path_factory: pytest.TempPathFactory, spm_pair: tuple[Path, Path]) -> MakeCheckpoint:
    """``marian_checkpoint(activation="swish", eos_first=True, targets=(), zero_pad=False)``: a checkpoint folder as
    transformers writes one.

    ``eos_first``: OPUS-MT's layout, ``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last; otherwise the pieces
    come first and ``</s>``, ``<unk>``, ``<pad>`` are the last three ids (eos ≠ 0). ``targets``: the language
    codes of a multi-target checkpoint (``("pob", "por")``), whose tokens (``>>por<<``) follow ``<unk>``.
    ``zero_pad``: ``<pad>``'s embedding is zeros, as in the OPUS-MT checkpoints converted from Marian (whose
    decoder starts from a zero embedding), which CTranslate2's converter of Marian models assumes."""
    made: dict[tuple[str, bool, tuple[str, ...], bool], Path] = {}

    def make(
        activation: str = "swish", eos_first: bool = True, targets: Sequence[str] = (), zero_pad: bool = False
    ) -> Path:
        key = (activation, eos_first, tuple(targets), zero_pad)
        if key in made:
            return made[key]
        import torch
        from transformers import MarianConfig, MarianMTModel, MarianTokenizer

        source_spm, target_spm = spm_pair
        vocab = marian_vocab(spm_pair, eos_first, targets)
        name = f"marian-{activation}-{'eos0' if eos_first else 'eosN'}{''.join(f'-{code}' for code in targets)}"
        name += "-zero-pad" if zero_pad else ""
        folder = tmp_path_factory.mktemp(name)
        pad, eos = vocab["<pad>"], vocab["</s>"]
        config = MarianConfig(
            vocab_size=len(vocab),
            decoder_vocab_size=len(vocab),
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            activation_function=activation,
            scale_embedding=True,
            max_position_embeddings=512,
            pad_token_id=pad,
            eos_token_id=eos,
            decoder_start_token_id=pad,
            forced_eos_token_id=eos,
            init_std=0.3,  # wide enough that a random model's outputs vary from token to token
        )
        torch.manual_seed(len(folder.name))
        model = MarianMTModel(config).eval()
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.half().float())
            model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias).mul(0.5).half().float())
            if zero_pad:
                model.model.shared.weight[pad] = 0.0
        model.generation_config.bad_words_ids = [[pad]]
        model.generation_config.num_beams = 4
        model.generation_config.max_length = 512
        model.save_pretrained(folder)
        (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        (folder / "source.spm").write_bytes(source_spm.read_bytes())
        (folder / "target.spm").write_bytes(target_spm.read_bytes())
        tokenizer = MarianTokenizer(
            str(folder / "source.spm"),
            str(folder / "target.spm"),
            str(folder / "vocab.json"),
            source_lang="en",
            target_lang="de",
        )
        tokenizer.save_pretrained(folder)
        made[key] = folder
        return folder

    return make
