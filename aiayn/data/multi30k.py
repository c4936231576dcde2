"""Multi30k (task 1, raw text): aligned sentence pairs of de, en, fr, cs, read locally or downloaded once.

Torch-free, so the serving page can show validation examples.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.core.normalizer import normalize_text
from aiayn.data.text_files import read_lines

LANGUAGES = ("de", "en", "fr", "cs")
SPLITS = ("train", "val", "test_2016_flickr")
VALIDATION_SPLIT = "val"  # also the name of the validation sample a model folder keeps of a user's own corpus
TEST_SPLIT = "test_2016_flickr"
DEFAULT_BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = Path("..") / "shared" / "data" / "multi30k"
DOWNLOAD_TIMEOUT_S = 60
GZIP_MAGIC = b"\x1f\x8b"
FIX = "pass --data DIR or set AIAYN_DATA to a folder holding the Multi30k files (train.en.gz, val.en.gz, ...)"


def is_multi30k_pair(src_lang: str, tgt_lang: str) -> bool:
    """Whether Multi30k has this pair: only then may a command reach for the corpus unasked."""
    return src_lang != tgt_lang and src_lang in LANGUAGES and tgt_lang in LANGUAGES


@dataclass(frozen=True)
class ParallelCorpus:
    """One split of one language pair; ``src[i]`` translates to ``tgt[i]``."""

    src: list[str]
    tgt: list[str]
    src_lang: str
    tgt_lang: str
    split: str
    files: tuple[str, ...] = ()  # where the lines were read from, if from files

    def __len__(self) -> int:
        return len(self.src)

    def head(self, n: int) -> ParallelCorpus:
        """The first ``n`` pairs, for quick runs."""
        return ParallelCorpus(self.src[:n], self.tgt[:n], self.src_lang, self.tgt_lang, self.split, self.files)

    def pairs(self) -> Iterator[tuple[str, str]]:
        """The pairs as a ``sources.PairSource`` streams them."""
        return zip(self.src, self.tgt, strict=True)

    def describe(self) -> dict[str, Any]:
        """A ``sources.PairSource`` description: the files, the number of pairs, and a hash of their text."""
        digest = hashlib.sha256()
        for src, tgt in self.pairs():
            digest.update(f"{src}\t{tgt}\n".encode())
        kind = "multi30k" if self.files else "in memory"
        return {
            "kind": kind,
            "split": self.split,
            "pairs": len(self),
            "files": list(self.files),
            "sha256": digest.hexdigest(),
        }


def find_data_dir(explicit: str | Path | None = None) -> Path | None:
    """The local Multi30k folder: ``explicit``, $AIAYN_DATA, then ../shared/data/multi30k; None if absent.

    ../shared is tried next to the repository and next to the current directory, where development
    checkouts and CI keep the corpus.
    """
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data folder {path} does not exist; {FIX}")
        return path
    env = os.environ.get("AIAYN_DATA")
    candidates = [Path(env).expanduser()] if env else []
    candidates += [REPO_ROOT / SHARED_DATA, Path.cwd() / SHARED_DATA]
    return next((p.resolve() for p in candidates if p.is_dir()), None)


def cache_dir() -> Path:
    """Where downloads are kept: $AIAYN_CACHE/multi30k, by default ~/.cache/aiayn/multi30k."""
    root = os.environ.get("AIAYN_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "aiayn") / "multi30k"


def download_file(name: str, base_url: str | None = None) -> Path:
    """``name`` from the Multi30k repository (or $AIAYN_DATA_URL), fetched into the cache once.

    Written to a temporary file and renamed, so an interrupted download never leaves a truncated file.
    """
    target = cache_dir() / name
    if target.is_file():
        return target
    url = f"{(base_url or os.environ.get('AIAYN_DATA_URL') or DEFAULT_BASE_URL).rstrip('/')}/{name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        try:
            with (
                os.fdopen(handle, "wb") as out,
                urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response,
            ):
                shutil.copyfileobj(response, out)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            raise FileNotFoundError(f"could not download {url} ({err}); to work offline, {FIX}") from err
        with tmp.open("rb") as f:
            if f.read(2) != GZIP_MAGIC:
                raise ValueError(f"{url} did not send a gzip file; check AIAYN_DATA_URL or {FIX}")
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def read_normalized(path: Path) -> list[str]:
    """Normalized lines of a gzipped UTF-8 file, with an error that names a damaged file."""
    try:
        return [normalize_text(line) for line in read_lines(path)]
    except (OSError, EOFError) as err:
        raise ValueError(
            f"{path} is not gzipped UTF-8 text ({err}); delete it and download it again or copy a good one"
        ) from err


def locate(
    split: str,
    lang: str,
    data_dir: Path | None,
    explicit: bool,
    download: bool,
    base_url: str | None,
) -> Path:
    """The file of one split and language: in the local folder, else from the cache or the internet.

    A folder the caller named is trusted to be complete: a gap there is an error, not a download.
    """
    name = f"{split}.{lang}.gz"
    if data_dir is not None and (data_dir / name).is_file():
        return data_dir / name
    if explicit and data_dir is not None:
        raise FileNotFoundError(f"{data_dir / name} does not exist; {FIX}")
    if download:
        return download_file(name, base_url)
    if (cache_dir() / name).is_file():
        return cache_dir() / name
    where = f"not in {data_dir}" if data_dir else "no local Multi30k folder was found"
    raise FileNotFoundError(f"{name}: {where} and downloading is off; {FIX}")


def load_parallel(
    split: str,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | Path | None = None,
    download: bool = True,
    base_url: str | None = None,
) -> ParallelCorpus:
    """Sentence pairs of one split, normalized; misaligned files are refused.

    ``data_dir`` (or the folder :func:`find_data_dir` finds) is read first; missing files are downloaded
    from ``base_url`` ($AIAYN_DATA_URL, else the Multi30k repository) unless ``download`` is False.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    for lang in (src_lang, tgt_lang):
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r}; choose one of {', '.join(LANGUAGES)}")
    if src_lang == tgt_lang:
        others = ", ".join(lang for lang in LANGUAGES if lang != src_lang)
        raise ValueError(f"source and target are both {src_lang!r}; pick a target from {others}")
    folder = find_data_dir(data_dir)
    src_path, tgt_path = (
        locate(split, lang, folder, data_dir is not None, download, base_url) for lang in (src_lang, tgt_lang)
    )
    src, tgt = read_normalized(src_path), read_normalized(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; "
            "the files must align line by line (re-download or re-copy them)"
        )
    return ParallelCorpus(src, tgt, src_lang, tgt_lang, split, (str(src_path), str(tgt_path)))
