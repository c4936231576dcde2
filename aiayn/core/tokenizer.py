"""Subword tokenizer (HF `tokenizers`): one vocabulary shared by source and target (§3.4).

`aiayn train` learns one BPE model for both sides (``tokenizer.json``). An imported checkpoint may cut the
two languages into pieces of that one vocabulary by different models (Marian's source.spm and target.spm):
its folder then holds the target side's as well (``target_tokenizer.json``), which encodes training targets.
A multi-target checkpoint's source starts with the token of its target language (``>>por<<``): the config's
``source_prefix``, which the folder hands to its tokenizer, so that every source encoded here starts with it.
Torch-free: the serving path loads it next to ONNX Runtime.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from aiayn.core.config import SpecialTokens
from aiayn.core.normalizer import is_tidy, normalize_text, tidy_normalizer
from aiayn.core.outputs import write_file

TOKENIZER_FILE = "tokenizer.json"  # the name HF `tokenizers` users expect; a model folder holds it
TARGET_TOKENIZER_FILE = "target_tokenizer.json"  # only where the target side has its own (imported checkpoints)
SPECIAL_TOKEN_TEXT = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}
METASPACE = "▁"
CHARACTERS_KEPT = 1 << 16  # characters whose verdict (known or not) is remembered: every request asks again


class SubwordTokenizer:
    """Text ↔ ids without <s>/</s>; ``decode(encode(x)) == normalize_text(x)`` for known characters.

    A file that carries the text contract (``normalizer.py``) tidies raw text itself, exactly as every runtime
    that reads it does; a folder written before it has the plain NFKC, and ``encode`` tidies for it
    (``normalize_text``). Tidying before a tidy file would differ from it: NFKC first turns ``¼`` into ``1⁄4``,
    whose ``⁄`` the file's first step then drops alone, where the file itself drops the whole ``¼``.
    """

    def __init__(
        self, tokenizer: Tokenizer, target: Tokenizer | None = None, source_prefix: Sequence[int] = ()
    ) -> None:
        self.tokenizer = tokenizer  # the source side's, and the target's where ``target`` is None
        self.target = target
        self.source_prefix = list(source_prefix)  # ids every source starts with (ModelConfig.source_prefix)
        self.tidies_itself = is_tidy(tokenizer)
        if target is not None and target.get_vocab_size() != tokenizer.get_vocab_size():
            raise ValueError("the source and target tokenizers must number one vocabulary, id for id")
        self.is_unknown = functools.lru_cache(CHARACTERS_KEPT)(self.encodes_unknown)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(self.tidy(text), add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self.tokenizer.encode_batch([self.tidy(t) for t in texts], add_special_tokens=False)
        return [e.ids for e in encodings]

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Target-side text as training targets (without </s>): by the target side's own model where it has one."""
        if self.target is None:
            return self.encode_batch(texts)
        return [e.ids for e in self.target.encode_batch(list(texts), add_special_tokens=False)]

    def tidy(self, text: str) -> str:
        """``text`` as the file's tokenizer should get it: as it is, or tidied for a plain-NFKC file."""
        return text if self.tidies_itself else normalize_text(text)

    def unknown_characters(self, text: str) -> set[str]:
        """Characters of ``text`` that the vocabulary lacks: alone they encode to ``<unk>``, or to nothing where
        the file's normalizer already leaves them out. White space is never unknown."""
        return {ch for ch in set(text) if self.is_unknown(ch)}

    def encodes_unknown(self, character: str) -> bool:
        """Whether ``character`` alone encodes to ``<unk>`` or to nothing (white space never does)."""
        if character.isspace():
            return False
        ids = self.encode(character)
        return not ids or self.tokenizer.token_to_id(SPECIAL_TOKEN_TEXT["unk"]) in ids

    def is_word(self, word: str) -> bool:
        """Whether the vocabulary holds ``word`` whole, as a word start (``▁word``)."""
        return self.tokenizer.token_to_id(METASPACE + word) is not None

    @property
    def eos_id(self) -> int:
        token_id = self.tokenizer.token_to_id(SPECIAL_TOKEN_TEXT["eos"])
        if token_id is None:
            raise ValueError("this tokenizer has no </s> token; re-create the model folder with `aiayn train`")
        return int(token_id)

    def encode_source(self, text: str) -> list[int]:
        """What the encoder reads, as in training: the source prefix (a multi-target checkpoint's ``>>por<<``),
        the subwords of ``text`` and ``</s>``; as ``MarianTokenizer`` encodes ``">>por<< " + text``."""
        return [*self.source_prefix, *self.encode(text), self.eos_id]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens are dropped, so a model's raw output can be passed as is."""
        return self.tokenizer.decode(self._checked(ids), skip_special_tokens=True)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return self.tokenizer.decode_batch([self._checked(ids) for ids in batch], skip_special_tokens=True)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of one id, e.g. ``▁dog`` (the metaspace marks a word start)."""
        return str(self.tokenizer.id_to_token(self._checked([token_id])[0]))

    def vocabulary(self) -> list[str]:
        """Every vocabulary entry, by id, read in one call (``get_vocab_size`` walks the added tokens each time: id by
        id, a vocabulary with many of them took half a minute)."""
        by_token = self.tokenizer.get_vocab(with_added_tokens=True)
        entries = [""] * self.vocab_size
        for token, token_id in by_token.items():
            entries[token_id] = token
        return entries

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """Readable subwords for display (the attention heatmap's labels): word starts shown as ``_dog``."""
        return [self.id_to_token(i).replace(METASPACE, "_") for i in ids]

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` (``path`` is the file, or a folder to hold it), and beside it
        ``target_tokenizer.json`` where the target side has its own; atomically, each."""
        path = resolve_file(path)
        for tokenizer, file in ((self.tokenizer, path), (self.target, path.with_name(TARGET_TOKENIZER_FILE))):
            if tokenizer is None:
                file.unlink(missing_ok=True)  # a folder re-created with one shared tokenizer
                continue
            write_file(file, tokenizer.to_str(pretty=True).encode("utf-8"))

    @classmethod
    def load(cls, path: str | Path, source_prefix: Sequence[int] = ()) -> SubwordTokenizer:
        """Read what :meth:`save` wrote (``path`` is ``tokenizer.json``, or the folder holding it); every source
        it encodes starts with ``source_prefix``, the model's (ModelConfig.source_prefix)."""
        path = resolve_file(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing; a model folder needs the tokenizer that `aiayn train` writes there"
            )
        target_file = path.with_name(TARGET_TOKENIZER_FILE)
        target = read_tokenizer(target_file) if target_file.is_file() else None
        return cls(read_tokenizer(path), target, source_prefix)

    def _checked(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as a list; HF silently skips unknown ids, which would hide a model/tokenizer mismatch."""
        ids = [int(i) for i in ids]
        size = self.vocab_size
        bad = [i for i in ids if not 0 <= i < size]
        if bad:
            raise ValueError(
                f"token ids {bad[:5]} are outside this tokenizer's vocabulary of {size}; "
                "the model and tokenizer.json come from different model folders"
            )
        return ids


def read_tokenizer(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on a corrupt file
        raise ValueError(
            f"{path} is not a valid tokenizer file ({err}); copy it again from the model's source "
            "or re-create the model folder with `aiayn train` or `aiayn import`"
        ) from err


def resolve_file(path: str | Path) -> Path:
    """A folder stands for the ``tokenizer.json`` inside it."""
    path = Path(path)
    return path / TOKENIZER_FILE if path.is_dir() else path


def train_tokenizer(
    sentences: Iterable[str],
    vocab_size: int,
    special_tokens: SpecialTokens,
) -> SubwordTokenizer:
    """BPE on the given (training) sentences, with the special tokens at the ids the config records.

    ``sentences`` are streamed: memory holds BPE's word counts, not the text. Deterministic: the same
    sentences and size give the same merges, so a resumed run can rebuild it.
    """
    by_id = sorted(
        (token_id, SPECIAL_TOKEN_TEXT[name]) for name, token_id in dataclasses.asdict(special_tokens).items()
    )
    if [token_id for token_id, _ in by_id] != list(range(len(by_id))):
        raise ValueError(
            f"special token ids must be 0..{len(by_id) - 1} in some order (the trainer puts them first), "
            f"got {special_tokens}"
        )
    if vocab_size <= len(by_id):
        raise ValueError(f"vocab_size {vocab_size} leaves no room beside the {len(by_id)} special tokens")
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKEN_TEXT["unk"]))
    tokenizer.normalizer = normalizers.NFKC()
    # Metaspace keeps the spaces in the tokens, so decoding gives the text back exactly; punctuation and
    # digits stand alone so that words are not learned once per following mark.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(),
            pre_tokenizers.Punctuation(),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[text for _, text in by_id], show_progress=False
    )
    texts = 0  # non-empty sentences seen

    def normalized() -> Iterator[str]:
        nonlocal texts
        for sentence in sentences:
            text = normalize_text(sentence)
            texts += bool(text)
            yield text

    tokenizer.train_from_iterator(normalized(), trainer=trainer)
    if not texts:
        raise ValueError("no text to train the tokenizer on; pass the training split's source and target")
    # Now that the vocabulary is known, the file takes over all of the text tidying (normalizer.py).
    tokenizer.normalizer = tidy_normalizer(tokenizer, SPECIAL_TOKEN_TEXT.values())
    for token_id, text in by_id:
        if tokenizer.token_to_id(text) != token_id:
            raise ValueError(
                f"the trained tokenizer put {text} at id {tokenizer.token_to_id(text)}, not {token_id}; "
                "check the installed `tokenizers` version"
            )
    return SubwordTokenizer(tokenizer)
