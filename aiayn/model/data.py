"""Multi30k (task 1, raw text): aligned sentence pairs of de, en, fr, cs, read locally or downloaded once.

Torch-free."""

from __future__ import annotations

import gzip
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from aiayn.model.tokenizer import normalize_text

LANGUAGES = ("de", "en", "fr", "cs")
SPLITS = ("train", "val", "test_2016_flickr")
DEFAULT_BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ParallelCorpus:
    src: list[str]
    tgt: list[str]
    src_lang: str
    tgt_lang: str
    split: str

    def __len__(self) -> int:
        return len(self.src)

    def head(self, n: int) -> ParallelCorpus:
        return ParallelCorpus(self.src[:n], self.tgt[:n], self.src_lang, self.tgt_lang, self.split)


def find_data_dir(explicit: str | Path | None = None) -> Path | None:
    """The local Multi30k folder: ``explicit``, then $AIAYN_DATA, then ../shared/data/multi30k; None if absent."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_dir():
            raise FileNotFoundError(f"data folder {path} does not exist; pass a folder holding train.en.gz etc.")
        return path
    candidates = [Path(p) for p in [os.environ.get("AIAYN_DATA")] if p]
    candidates += [REPO_ROOT.parent / "shared/data/multi30k", Path.cwd().parent / "shared/data/multi30k"]
    return next((p for p in candidates if p.is_dir()), None)


def cache_dir() -> Path:
    return Path(os.environ.get("AIAYN_CACHE", Path.home() / ".cache" / "aiayn")) / "multi30k"


def download(name: str, base_url: str | None = None) -> Path:
    """Fetch ``name`` from the public Multi30k repository into the cache (atomic), unless cached."""
    target = cache_dir() / name
    if target.is_file():
        return target
    url = f"{(base_url or os.environ.get('AIAYN_DATA_URL') or DEFAULT_BASE_URL).rstrip('/')}/{name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
            out.write(response.read())
    except (urllib.error.URLError, OSError) as err:
        tmp.unlink(missing_ok=True)
        raise FileNotFoundError(
            f"could not download {url} ({err}); pass --data DIR or set AIAYN_DATA to a local Multi30k folder"
        ) from err
    tmp.replace(target)
    return target


def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [normalize_text(line) for line in f.read().splitlines()]


def locate(name: str, data_dir: Path | None, download_missing: bool) -> Path:
    if data_dir is not None and (data_dir / name).is_file():
        return data_dir / name
    if download_missing:
        return download(name)
    where = data_dir or "no local data folder"
    raise FileNotFoundError(f"{name} not found ({where}); pass --data DIR or set AIAYN_DATA")


def load_parallel(
    split: str, src_lang: str, tgt_lang: str, data_dir: str | Path | None = None, download: bool = True
) -> ParallelCorpus:
    """Sentence pairs of one split, normalized; misaligned files are refused."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    for lang in (src_lang, tgt_lang):
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r}; choose from {', '.join(LANGUAGES)}")
    if src_lang == tgt_lang:
        raise ValueError("source and target languages must differ")
    folder = find_data_dir(data_dir)
    src_path = locate(f"{split}.{src_lang}.gz", folder, download)
    tgt_path = locate(f"{split}.{tgt_lang}.gz", folder, download)
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; the files must align")
    return ParallelCorpus(src, tgt, src_lang, tgt_lang, split)
