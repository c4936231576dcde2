"""Subword tokenizer (HF `tokenizers` BPE): one vocabulary shared by source and target (§3.4). Torch-free."""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from aiayn.model.config import SpecialTokens

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_TOKEN_TEXT = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}


def normalize_text(text: str) -> str:
    """NFKC, trimmed, runs of whitespace as one space: the form the tokenizer round-trips exactly."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


class SubwordTokenizer:
    """Text ↔ ids; ``decode(encode(x)) == x`` for normalized text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(normalize_text(text), add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch([normalize_text(t) for t in texts], add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return self.tokenizer.decode_batch([list(ids) for ids in batch], skip_special_tokens=True)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Readable subword strings for display (the attention heatmap's labels)."""
        return [(self.tokenizer.id_to_token(i) or "<?>").replace("▁", "_") for i in ids]

    def save(self, path: Path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        self.tokenizer.save(str(tmp))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> SubwordTokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; a model folder needs the tokenizer written by `aiayn train`")
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # tokenizers raises a bare Exception on a corrupt file
            raise ValueError(
                f"{path} is not a valid tokenizer file ({err}); copy it again from the model's source"
            ) from err


def train_tokenizer(sentences: Iterable[str], vocab_size: int, special_tokens: SpecialTokens) -> SubwordTokenizer:
    """BPE on the given (training) sentences, with the special tokens at the ids the config records."""
    by_id = sorted(
        (token_id, SPECIAL_TOKEN_TEXT[name]) for name, token_id in dataclasses.asdict(special_tokens).items()
    )
    if [token_id for token_id, _ in by_id] != list(range(len(by_id))):
        raise ValueError(f"special token ids must be 0..{len(by_id) - 1}, got {special_tokens}")
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKEN_TEXT["unk"]))
    tokenizer.normalizer = normalizers.NFKC()
    # Metaspace keeps the spaces in the tokens, so decoding gives the text back exactly; punctuation and
    # digits stand alone so that words are not learned once per following mark.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[text for _, text in by_id], show_progress=False
    )
    tokenizer.train_from_iterator((normalize_text(s) for s in sentences), trainer=trainer)
    return SubwordTokenizer(tokenizer)
