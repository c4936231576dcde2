"""Where sentence pairs come from: a pair of aligned text files, or one tab-separated file of pairs.

Every source streams normalized ``(source, target)`` pairs (``pairs``) and says where they came from
(``describe``: the files with their line counts and sha256). ``describe`` reads everything once and refuses a
bad corpus before any long work starts: different line counts, bytes that are not UTF-8, an empty file, a
line of a pairs file without its tab, each error naming the file and the line. Multi30k
(``multi30k.ParallelCorpus``) and Hugging Face datasets (``hf_datasets``) are sources too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any, Protocol

from aiayn.core.normalizer import normalize_text
from aiayn.data.text_files import read_lines, summarize_file

# A language code as file names carry it: en, de, pt_br, zh-Hans; not a file type that looks like one.
LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}([_-][A-Za-z]{2,4})?$")
FILE_TYPES = frozenset({"txt", "tsv", "csv", "tok", "bpe", "raw"})
COMPRESSED = ".gz"


class PairSource(Protocol):
    """Aligned sentence pairs: ``src_lang`` text that translates to ``tgt_lang`` text."""

    @property
    def src_lang(self) -> str: ...

    @property
    def tgt_lang(self) -> str: ...

    def pairs(self) -> Iterator[tuple[str, str]]:
        """Normalized (source, target) pairs, in corpus order; each call reads the corpus again."""
        ...

    def describe(self) -> dict[str, Any]:
        """Where the pairs come from: ``kind``, ``pairs`` (their number), and files or a hash to recognise them."""
        ...


def stem_suffix(path: Path) -> str:
    """``train.en.gz`` → ``en``: the last suffix before any ``.gz``."""
    name = path.name[: -len(COMPRESSED)] if path.name.endswith(COMPRESSED) else path.name
    return name.rsplit(".", 1)[-1] if "." in name else ""


def languages_of_files(src: Path, tgt: Path) -> tuple[str, str] | None:
    """``train.en`` / ``train.de`` (or ``.en.gz``) → ("en", "de"); None when the names carry no codes."""
    found = stem_suffix(src), stem_suffix(tgt)
    return found if all(is_language(code) for code in found) else None


def is_language(code: str) -> bool:
    return bool(LANGUAGE_CODE.match(code)) and code not in FILE_TYPES


def languages_of_tsv(path: Path) -> tuple[str, str] | None:
    """``train.en-de.tsv`` → ("en", "de"); None when the name carries no pair."""
    name = path.name[: -len(COMPRESSED)] if path.name.endswith(COMPRESSED) else path.name
    parts = name.split(".")
    pair = parts[-2].split("-") if len(parts) >= 3 else []
    return (pair[0], pair[1]) if len(pair) == 2 and all(is_language(code) for code in pair) else None


def choose_languages(
    src_lang: str | None, tgt_lang: str | None, from_names: tuple[str, str] | None, files: str, example: str
) -> tuple[str, str]:
    """The flags where given, else the codes in the file names; refused when neither tells, or both are one."""
    src = src_lang or (from_names[0] if from_names else None)
    tgt = tgt_lang or (from_names[1] if from_names else None)
    if src is None or tgt is None:
        raise ValueError(f"the languages of {files} are not in their names ({example}); pass --src and --tgt")
    if src == tgt:
        raise ValueError(f"source and target of {files} are both {src!r}; pass --src and --tgt")
    return src, tgt


@dataclass(frozen=True)
class TextFiles:
    """Two aligned files, plain or .gz: line i of ``src_path`` translates to line i of ``tgt_path``."""

    src_path: Path
    tgt_path: Path
    src_lang: str
    tgt_lang: str

    @classmethod
    def named(cls, src_path: str | Path, tgt_path: str | Path, src_lang: str | None, tgt_lang: str | None) -> TextFiles:
        """Languages from the flags, else from the names (train.en, train.de)."""
        src_path, tgt_path = Path(src_path), Path(tgt_path)
        from_names = languages_of_files(src_path, tgt_path)
        langs = choose_languages(src_lang, tgt_lang, from_names, f"{src_path}, {tgt_path}", "train.en, train.de")
        return cls(src_path, tgt_path, *langs)

    def describe(self) -> dict[str, Any]:
        src, tgt = summarize_file(self.src_path), summarize_file(self.tgt_path)
        if src.lines != tgt.lines:
            raise ValueError(
                f"{self.src_path} has {src.lines} lines but {self.tgt_path} has {tgt.lines}; "
                "the files must align line by line"
            )
        return {"kind": "text files", "pairs": src.lines, "files": [src.to_dict(), tgt.to_dict()]}

    def pairs(self) -> Iterator[tuple[str, str]]:
        lines = zip_longest(read_lines(self.src_path), read_lines(self.tgt_path))
        for number, (src, tgt) in enumerate(lines, start=1):
            if src is None or tgt is None:
                short = self.src_path if src is None else self.tgt_path
                raise ValueError(f"{short} ends at line {number - 1}, before its partner; the files must align")
            yield normalize_text(src), normalize_text(tgt)


@dataclass(frozen=True)
class TsvFile:
    """One file of ``SOURCE<TAB>TARGET`` lines, plain or .gz."""

    path: Path
    src_lang: str
    tgt_lang: str

    @classmethod
    def named(cls, path: str | Path, src_lang: str | None, tgt_lang: str | None) -> TsvFile:
        """Languages from the flags, else from the name (train.en-de.tsv)."""
        path = Path(path)
        return cls(path, *choose_languages(src_lang, tgt_lang, languages_of_tsv(path), str(path), "train.en-de.tsv"))

    def describe(self) -> dict[str, Any]:
        summary = summarize_file(self.path, tab_separated=True)
        return {"kind": "tsv", "pairs": summary.lines, "files": [summary.to_dict()]}

    def pairs(self) -> Iterator[tuple[str, str]]:
        for number, line in enumerate(read_lines(self.path), start=1):
            src, tab, tgt = line.partition("\t")
            if not tab or "\t" in tgt:
                raise ValueError(f"{self.path}: line {number} is not SOURCE<TAB>TARGET")
            yield normalize_text(src), normalize_text(tgt)
