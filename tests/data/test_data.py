"""Multi30k loading: the real splits, refused inputs, and downloading into the cache (from a local server)."""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from aiayn.core.normalizer import normalize_text
from aiayn.data import multi30k as data
from aiayn.data.multi30k import LANGUAGES, SPLITS, find_data_dir, load_parallel

# Invented sentences: the corpus itself never enters the repository.
INVENTED = {
    "en": ["A red kite  flies over\tthe hill.", "Two cats sleep on a mat."],
    "de": ["Ein roter Drachen fliegt über den Hügel.", "Zwei Katzen schlafen auf einer Matte."],
}
Mirror = tuple[str, http.server.ThreadingHTTPServer]  # base URL, server


def write_split(folder: Path, split: str, lines: dict[str, list[str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, text in lines.items():
        with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(text) + "\n")


@pytest.fixture()
def no_local_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Hide every local Multi30k folder, and cache downloads under tmp_path; returns the cache root."""
    monkeypatch.delenv("AIAYN_DATA", raising=False)
    monkeypatch.delenv("AIAYN_DATA_URL", raising=False)
    nowhere = tmp_path / "a" / "b"
    nowhere.mkdir(parents=True)
    monkeypatch.setattr(data, "REPO_ROOT", nowhere)
    monkeypatch.chdir(nowhere)
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    assert find_data_dir() is None
    return tmp_path / "cache"


@pytest.mark.parametrize(("split", "count"), [("train", 29000), ("val", 1014), ("test_2016_flickr", 1000)])
def test_real_splits_load_aligned_and_normalized(multi30k_dir: Path, split: str, count: int) -> None:
    corpus = load_parallel(split, "en", "de", multi30k_dir, download=False)
    assert (len(corpus), len(corpus.src), len(corpus.tgt)) == (count, count, count)
    assert (corpus.src_lang, corpus.tgt_lang, corpus.split) == ("en", "de", split)
    assert all(s and s == normalize_text(s) for s in corpus.src + corpus.tgt)


def test_every_language_of_the_real_corpus_loads(multi30k_dir: Path) -> None:
    for lang in LANGUAGES:
        if lang != "en":
            assert len(load_parallel("val", lang, "en", multi30k_dir, download=False)) == 1014


def test_lines_are_normalized(tmp_path: Path) -> None:
    write_split(tmp_path, "val", INVENTED)
    corpus = load_parallel("val", "en", "de", tmp_path, download=False)
    assert corpus.src == ["A red kite flies over the hill.", "Two cats sleep on a mat."]
    assert corpus.head(1).tgt == INVENTED["de"][:1]


def test_misaligned_files_name_both_files_and_counts(tmp_path: Path) -> None:
    write_split(tmp_path, "val", {"en": INVENTED["en"], "de": INVENTED["de"][:1]})
    with pytest.raises(ValueError, match=r"val\.en\.gz has 2 lines but .*val\.de\.gz has 1"):
        load_parallel("val", "en", "de", tmp_path, download=False)


def test_missing_file_names_the_path_and_the_fix(tmp_path: Path, no_local_corpus: Path) -> None:
    write_split(tmp_path, "val", {"en": INVENTED["en"]})
    # A folder the caller names is not topped up from the internet.
    with pytest.raises(FileNotFoundError, match=r"val\.de\.gz does not exist; pass --data DIR or set AIAYN"):
        load_parallel("val", "en", "de", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"val\.en\.gz: no local Multi30k folder .* is off; pass"):
        load_parallel("val", "en", "de", download=False)
    with pytest.raises(FileNotFoundError, match=r"does not exist; pass --data DIR"):
        find_data_dir(tmp_path / "missing")


def test_bad_names_list_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown language 'xx'; choose one of de, en, fr, cs"):
        load_parallel("val", "en", "xx", tmp_path)
    with pytest.raises(ValueError, match="unknown split 'dev'; choose one of " + ", ".join(SPLITS)):
        load_parallel("dev", "en", "de", tmp_path)
    with pytest.raises(ValueError, match="both 'en'; pick a target from de, fr, cs"):
        load_parallel("val", "en", "en", tmp_path)


def test_search_order_explicit_then_environment(
    tmp_path: Path, no_local_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setenv("AIAYN_DATA", str(second))
    assert find_data_dir(first) == first
    assert find_data_dir() == second
    shared = tmp_path / "a" / "shared" / "data" / "multi30k"  # ../shared next to the (patched) repository
    shared.mkdir(parents=True)
    monkeypatch.delenv("AIAYN_DATA")
    assert find_data_dir() == shared


def test_a_damaged_file_is_named(tmp_path: Path) -> None:
    write_split(tmp_path, "val", INVENTED)
    (tmp_path / "val.de.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"val\.de\.gz is not gzipped UTF-8 text"):
        load_parallel("val", "en", "de", tmp_path)


@pytest.fixture()
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    """A local HTTP server with the Multi30k raw layout (invented sentences) on a free port."""
    root = tmp_path / "mirror"
    write_split(root, "val", INVENTED)
    (root / "val.fr.gz").write_text("<html>not the file</html>")
    handler = partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep the request log out of the test output."""


def test_download_caches_then_works_offline(
    mirror: Mirror, no_local_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, server = mirror
    monkeypatch.setenv("AIAYN_DATA_URL", url)
    corpus = load_parallel("val", "en", "de")
    assert corpus.src == [normalize_text(s) for s in INVENTED["en"]]
    assert sorted(p.name for p in (no_local_corpus / "multi30k").iterdir()) == ["val.de.gz", "val.en.gz"]
    server.shutdown()
    server.server_close()
    again = load_parallel("val", "de", "en")  # from the cache: the server is gone
    assert (again.src, again.tgt) == (corpus.tgt, corpus.src)
    assert load_parallel("val", "en", "de", download=False) == corpus


def test_base_url_argument_overrides_the_environment(
    mirror: Mirror, no_local_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIAYN_DATA_URL", "http://127.0.0.1:9/nowhere")
    assert len(load_parallel("val", "en", "de", base_url=mirror[0] + "/")) == 2


def test_download_errors_say_how_to_work_offline(
    mirror: Mirror, no_local_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, server = mirror
    monkeypatch.setenv("AIAYN_DATA_URL", url)
    with pytest.raises(FileNotFoundError, match=r"could not download .*/train\.en\.gz \(HTTP Error 404"):
        load_parallel("train", "en", "de")
    with pytest.raises(ValueError, match=r"val\.fr\.gz did not send a gzip file"):
        load_parallel("val", "en", "fr")
    server.shutdown()
    server.server_close()
    with pytest.raises(FileNotFoundError, match=r"could not download .* pass --data DIR or set AIAYN_DATA"):
        load_parallel("val", "en", "cs")
    # Only the one good download is kept: no partial or rejected files.
    assert [p.name for p in (no_local_corpus / "multi30k").iterdir()] == ["val.en.gz"]
