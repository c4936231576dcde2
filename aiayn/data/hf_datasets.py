"""A Hugging Face ``datasets`` translation set as a pair source: a ``save_to_disk`` folder or a hub name.

Optional: ``pip install "aiayn[datasets]"``. Rows hold a translation column of ``{language: text}``
(``{"translation": {"en": ..., "de": ...}}``, the layout of the hub's WMT and OPUS sets).

A dataset is data, never code: one built by a loading script (Python that ``datasets`` would download and run) is
refused, whatever the release of ``datasets`` (``trust_remote_code=False``, which releases before
``SECURITY_FLOORS["datasets"]`` do not take: they are refused too).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from aiayn.core.dependencies import SECURITY_FLOORS, release_number
from aiayn.core.normalizer import normalize_text

INSTALL = 'reading Hugging Face datasets needs the optional extra: pip install "aiayn[datasets]"'
NO_SCRIPTS = (
    "aiayn never runs a dataset's loading script (it could run any code): use a dataset of data files (Parquet, "
    "JSON, CSV), or a folder that `datasets`' save_to_disk wrote"
)
# How datasets refuses a script: "Loading X requires you to execute the dataset script ..." or "... contains custom
# code which must be executed ..." (2.16 to 3.x), "Dataset scripts are no longer supported" (4 on).
SCRIPT_REFUSED = ("dataset script", "custom code")
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
            loaded = self.load_without_scripts(datasets)
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

    def load_without_scripts(self, datasets: Any) -> Any:
        """``load_dataset`` told to run no code, or a one-line refusal where the dataset needs its script."""
        floor = SECURITY_FLOORS["datasets"]
        if release_number(datasets.__version__) < release_number(floor):
            raise ValueError(
                f"datasets {datasets.__version__} may run a dataset's loading script unasked: pip install "
                f"'datasets>={floor}'"
            )
        if self.name.endswith(".py"):
            raise ValueError(f"{self.name} is a loading script; {NO_SCRIPTS}")
        try:
            return datasets.load_dataset(self.name, self.config, split=self.split, trust_remote_code=False)
        except (RuntimeError, ValueError) as err:
            if any(said in str(err).lower() for said in SCRIPT_REFUSED):
                raise ValueError(f"{self.name} is built by a loading script; {NO_SCRIPTS}") from None
            raise

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
