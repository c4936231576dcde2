"""`aiayn prepare`: a corpus turned once into what training reads, a folder of memory-mapped token ids.

Three passes over the training text, each streaming with bounded memory: ``describe`` checks the files
(line counts, UTF-8, emptiness) and hashes them; the shared tokenizer learns BPE from the pairs (every k-th
pair of a corpus larger than ``tokenizer_sample``); the pairs are encoded in batches (``tokenizers``' batch
encoding runs on every core) and appended to ``train.src``/``train.tgt`` (``token_arrays``). A pair with a
side over ``max_length`` tokens, or an empty side, is skipped and counted, never fatal (fairseq's
--skip-invalid-size-inputs-valid-test). The validation split gets the same treatment plus its reference
text for BLEU. The folder is written beside its place and renamed into it (``core/outputs.py``), so it is whole
or as it was; an --out that holds anything but an earlier `aiayn prepare`'s folder is refused.

    prepared/
      prepared.json         where the data came from, the settings, the counts
      tokenizer.json        the shared BPE tokenizer
      train.src.bin/.idx    token ids and offsets (and train.tgt.*, valid.src.*, valid.tgt.*)
      valid.ref.txt         the kept validation targets, for BLEU
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from itertools import islice
from pathlib import Path
from typing import Any

from aiayn.core.config import SpecialTokens
from aiayn.core.outputs import Command, claim, written_whole
from aiayn.core.tokenizer import TOKENIZER_FILE, SubwordTokenizer, train_tokenizer
from aiayn.data.sources import PairSource
from aiayn.data.token_arrays import TokenArrayWriter, TokenPairs, id_dtype

PREPARED_FILE = "prepared.json"
REFERENCES_FILE = "valid.ref.txt"
FORMAT = 1  # of the folder; a folder of another format is prepared again
PREPARE = Command("aiayn prepare", "choose another --out, or pass --overwrite to replace the folder whole")


@dataclass(frozen=True)
class PrepareSettings:
    vocab_size: int  # of a tokenizer trained here (a given tokenizer keeps its own)
    special_tokens: SpecialTokens = field(default_factory=SpecialTokens)
    max_length: int = 1024  # subword tokens a side, </s> included; longer pairs are skipped and counted
    tokenizer_sample: int = 1_000_000  # pairs BPE learns from at most: every k-th pair of a larger corpus
    batch_pairs: int = 20_000  # pairs encoded per call of the tokenizer's batch encoding

    def to_dict(self) -> dict[str, Any]:
        """What decides the folder's content (``batch_pairs`` does not)."""
        settings = asdict(self)
        del settings["batch_pairs"]
        return settings


def sample_sentences(train: PairSource, pairs: int, sample: int) -> Iterator[str]:
    """Source and target of every k-th pair, k chosen so that at most ``sample`` pairs are taken."""
    every = max(1, math.ceil(pairs / sample))
    for src, tgt in islice(train.pairs(), 0, None, every):
        yield src
        yield tgt


def chunks(pairs: Iterator[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    while chunk := list(islice(pairs, size)):
        yield chunk


def write_split(
    source: PairSource, prefix: Path, tokenizer: SubwordTokenizer, settings: PrepareSettings, keep_text: bool
) -> tuple[dict[str, int], list[str]]:
    """Encode and append every pair that fits; returns the counts and (``keep_text``) the kept targets' text."""
    counts = {"read": 0, "kept": 0, "skipped_too_long": 0, "skipped_empty": 0}
    references: list[str] = []
    dtype = id_dtype(tokenizer.vocab_size)
    with (
        TokenArrayWriter(Path(f"{prefix}.src"), dtype) as src_out,
        TokenArrayWriter(Path(f"{prefix}.tgt"), dtype) as tgt_out,
    ):
        for chunk in chunks(source.pairs(), settings.batch_pairs):
            sources = tokenizer.encode_batch([src_text for src_text, _ in chunk])
            targets = tokenizer.encode_target_batch([tgt_text for _, tgt_text in chunk])
            kept_src, kept_tgt = [], []
            for (_, tgt_text), src, tgt in zip(chunk, sources, targets, strict=True):
                if not src or not tgt:
                    counts["skipped_empty"] += 1
                    continue
                src = [*tokenizer.source_prefix, *src]  # a multi-target model's >>por<<, as every source has it
                if max(len(src), len(tgt)) + 1 > settings.max_length:  # + its </s>
                    counts["skipped_too_long"] += 1
                else:
                    kept_src.append(src)
                    kept_tgt.append(tgt)
                    if keep_text:
                        references.append(tgt_text)
            src_out.append(kept_src)
            tgt_out.append(kept_tgt)
            counts["read"] += len(chunk)
            counts["kept"] += len(kept_src)
    if counts["kept"] == 0:
        raise ValueError(
            f"none of the {counts['read']} {prefix.name} pairs fits: {counts['skipped_empty']} have an empty side, "
            f"{counts['skipped_too_long']} a side over {settings.max_length} tokens"
        )
    return counts, references


@dataclass(frozen=True)
class PreparedData:
    """A prepared folder, opened: its record, tokenizer, token arrays and validation references."""

    path: Path
    record: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path) -> PreparedData:
        path = Path(path)
        record_file = path / PREPARED_FILE
        if not record_file.is_file():
            raise FileNotFoundError(f"{path} holds no prepared data ({PREPARED_FILE}); write it with `aiayn prepare`")
        record = json.loads(record_file.read_text(encoding="utf-8"))
        if record.get("format") != FORMAT:
            raise ValueError(f"{path} was prepared in format {record.get('format')}, not {FORMAT}; prepare it again")
        return cls(path, record)

    @property
    def src_lang(self) -> str:
        return str(self.record["sources"]["src_lang"])

    @property
    def tgt_lang(self) -> str:
        return str(self.record["sources"]["tgt_lang"])

    @cached_property
    def tokenizer(self) -> SubwordTokenizer:
        return SubwordTokenizer.load(self.path / TOKENIZER_FILE)

    def split(self, name: str) -> TokenPairs:
        return TokenPairs.open(self.path / name, id_dtype(self.tokenizer.vocab_size))

    @cached_property
    def train(self) -> TokenPairs:
        return self.split("train")

    @cached_property
    def valid(self) -> TokenPairs:
        return self.split("valid")

    @cached_property
    def valid_references(self) -> list[str]:
        return (self.path / REFERENCES_FILE).read_text(encoding="utf-8").split("\n")[:-1]

    def matches(self, sources: dict[str, Any], settings: PrepareSettings, tokenizer: SubwordTokenizer | None) -> bool:
        """Prepared from these sources with these settings (and this tokenizer, when one is imposed)?"""
        same_tokenizer = tokenizer is None or self.record["tokenizer"]["sha256"] == tokenizer_sha256(tokenizer)
        return self.record["sources"] == sources and self.record["settings"] == settings.to_dict() and same_tokenizer


def tokenizer_sha256(tokenizer: SubwordTokenizer) -> str:
    """What the prepared ids depend on: the tokenizer files, and the source prefix where there is one."""
    text = tokenizer.tokenizer.to_str() + (tokenizer.target.to_str() if tokenizer.target is not None else "")
    if tokenizer.source_prefix:
        text += json.dumps(tokenizer.source_prefix)
    return hashlib.sha256(text.encode()).hexdigest()


def describe_sources(train: PairSource, valid: PairSource) -> dict[str, Any]:
    """Both splits described (which checks every file), with their languages, which must agree."""
    if (train.src_lang, train.tgt_lang) != (valid.src_lang, valid.tgt_lang):
        raise ValueError(
            f"the training pairs are {train.src_lang}->{train.tgt_lang} but the validation pairs "
            f"{valid.src_lang}->{valid.tgt_lang}"
        )
    described = {"train": train.describe(), "valid": valid.describe()}
    return {"src_lang": train.src_lang, "tgt_lang": train.tgt_lang, **described}


def prepare(
    out: str | Path,
    train: PairSource,
    valid: PairSource,
    settings: PrepareSettings,
    tokenizer: SubwordTokenizer | None = None,
    reuse: bool = False,
    overwrite: bool = False,
) -> PreparedData:
    """Write the prepared folder ``out``; a given ``tokenizer`` (a continued model's) is used, not trained.

    With ``reuse``, a folder already prepared from the same sources (their hashes) and settings is kept. An ``out``
    holding anything but an earlier `aiayn prepare`'s folder is refused before the files are read, unless
    ``overwrite`` (never a folder holding the corpus files).
    """
    out = Path(out)
    if not overwrite:
        claim(out, PREPARE)  # before the corpus is read; with --overwrite, once its files are known
    sources = describe_sources(train, valid)
    if reuse and (out / PREPARED_FILE).is_file():
        existing = PreparedData.open(out)
        if existing.matches(sources, settings, tokenizer):
            return existing
    return write_prepared(out, train, valid, sources, settings, tokenizer, overwrite)


def corpus_files(sources: dict[str, Any]) -> list[Path]:
    """The files ``describe_sources`` names, which no --overwrite may delete."""
    splits = (sources[split] for split in ("train", "valid"))
    return [Path(f["path"] if isinstance(f, dict) else f) for split in splits for f in split.get("files", [])]


def write_prepared(
    out: Path,
    train: PairSource,
    valid: PairSource,
    sources: dict[str, Any],
    settings: PrepareSettings,
    tokenizer: SubwordTokenizer | None,
    overwrite: bool,
) -> PreparedData:
    with written_whole(out, PREPARE, overwrite, corpus_files(sources)) as staging:
        record = write_folder(staging, train, valid, settings, tokenizer, sources)
        (staging / PREPARED_FILE).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return PreparedData.open(out)


def write_folder(
    folder: Path,
    train: PairSource,
    valid: PairSource,
    settings: PrepareSettings,
    tokenizer: SubwordTokenizer | None,
    sources: dict[str, Any],
) -> dict[str, Any]:
    """The tokenizer (trained unless given), both splits and the references; returns the folder's record."""
    trained_on: dict[str, Any] = {}
    if tokenizer is None:
        pairs = sources["train"]["pairs"]
        tokenizer = train_tokenizer(
            sample_sentences(train, pairs, settings.tokenizer_sample), settings.vocab_size, settings.special_tokens
        )
        trained_on = {"every_kth_pair": max(1, math.ceil(pairs / settings.tokenizer_sample))}
    tokenizer.save(folder / TOKENIZER_FILE)
    counts, _ = write_split(train, folder / "train", tokenizer, settings, keep_text=False)
    valid_counts, references = write_split(valid, folder / "valid", tokenizer, settings, keep_text=True)
    (folder / REFERENCES_FILE).write_text("".join(f"{line}\n" for line in references), encoding="utf-8")
    return {
        "format": FORMAT,
        "sources": sources,
        "settings": settings.to_dict(),
        "counts": {"train": counts, "valid": valid_counts},
        "tokenizer": {"sha256": tokenizer_sha256(tokenizer), "vocab_size": tokenizer.vocab_size, **trained_on},
    }
