"""A Hugging Face ``datasets`` translation set as a pair source: a ``save_to_disk`` folder or a hub name.

Optional: ``pip install "aiayn[datasets]"``. Rows hold a translation column of ``{language: text}``
(``{"translation": {"en": ..., "de": ...}}``, the layout of the hub's WMT and OPUS sets).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from aiayn.core.normalizer import normalize_text

INSTALL = 'reading Hugging Face datasets needs the optional extra: pip install "aiayn[datasets]"'
ROWS_PER_READ = 1000


@dataclass(frozen=True)
class HFDataset:
    name: str  # a folder written by ``save_to_disk``, or a hub name such as wmt14
    split: str  # train, validation, ...
    src_lang: str
    tgt_lang: str
    column: str = "translation"
    config: str | None = None  # the hub's subset, such as de-en

    @cached_property
    def dataset(self) -> Any:
        """The split as a ``datasets.Dataset``, loaded once and checked to hold both languages."""
        try:
            import datasets
        except ImportError as err:
            raise ValueError(INSTALL) from err
        if Path(self.name).is_dir():
            loaded = datasets.load_from_disk(self.name)
            if isinstance(loaded, datasets.DatasetDict):
                if self.split not in loaded:
                    raise ValueError(f"{self.name} has no split {self.split!r}; it has {', '.join(loaded)}")
                loaded = loaded[self.split]
        else:
            loaded = datasets.load_dataset(self.name, self.config, split=self.split)
        where = f"{self.name} [{self.split}]"
        if self.column not in loaded.column_names:
            raise ValueError(f"{where} has no column {self.column!r}; it has {', '.join(loaded.column_names)}")
        languages = set(loaded.features[self.column])
        missing = [lang for lang in (self.src_lang, self.tgt_lang) if lang not in languages]
        if missing:
            raise ValueError(f"{where}: {self.column!r} has no {', '.join(missing)}; it has {', '.join(languages)}")
        if len(loaded) == 0:
            raise ValueError(f"{where} is empty")
        return loaded

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "hf datasets",
            "name": self.name,
            "config": self.config,
            "split": self.split,
            "column": self.column,
            "pairs": len(self.dataset),
            "fingerprint": self.dataset._fingerprint,  # datasets' own hash of the data and its transforms
        }

    def pairs(self) -> Iterator[tuple[str, str]]:
        row = 0
        for batch in self.dataset.select_columns([self.column]).iter(batch_size=ROWS_PER_READ):
            for translation in batch[self.column]:
                src, tgt = translation.get(self.src_lang), translation.get(self.tgt_lang)
                if src is None or tgt is None:
                    raise ValueError(f"{self.name} [{self.split}] row {row} has no {self.src_lang} or {self.tgt_lang}")
                row += 1
                yield normalize_text(src), normalize_text(tgt)
