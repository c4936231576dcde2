"""Multi30k loading (local, misaligned, downloaded), the shared BPE tokenizer and token-sized batches."""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from aiayn.model.batching import token_batches
from aiayn.model.config import SpecialTokens
from aiayn.model.data import load_parallel
from aiayn.model.tokenizer import SubwordTokenizer, normalize_text, train_tokenizer

INVENTED = {
    "en": ["A red kite flies.", "Two cats  sleep on a mat."],
    "de": ["Ein roter Drachen fliegt.", "Zwei Katzen schlafen."],
}


def write_split(folder: Path, split: str, lines: dict[str, list[str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for lang, text in lines.items():
        with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(text) + "\n")


@pytest.mark.parametrize(("split", "count"), [("train", 29000), ("val", 1014), ("test_2016_flickr", 1000)])
def test_real_splits_load_aligned(multi30k_dir: Path, split: str, count: int) -> None:
    corpus = load_parallel(split, "en", "de", multi30k_dir)
    assert len(corpus) == count and len(corpus.tgt) == count
    assert corpus.src[0] == normalize_text(corpus.src[0])


def test_misaligned_files_name_both_files_and_counts(tmp_path: Path) -> None:
    write_split(tmp_path, "val", {"en": INVENTED["en"], "de": INVENTED["de"][:1]})
    with pytest.raises(ValueError, match=r"val\.en\.gz has 2 lines but .*val\.de\.gz has 1"):
        load_parallel("val", "en", "de", tmp_path, download=False)


def test_missing_file_and_bad_names_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--data"):
        load_parallel("val", "en", "de", tmp_path, download=False)
    with pytest.raises(ValueError, match="unknown language"):
        load_parallel("val", "en", "xx", tmp_path)
    with pytest.raises(ValueError, match="unknown split"):
        load_parallel("dev", "en", "de", tmp_path)


@pytest.fixture()
def http_mirror(tmp_path: Path) -> Iterator[tuple[str, http.server.ThreadingHTTPServer]]:
    """A local HTTP server with the Multi30k raw file layout (invented sentences)."""
    root = tmp_path / "mirror"
    write_split(root, "val", INVENTED)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server
    server.shutdown()


def test_download_caches_and_then_works_offline(
    http_mirror: tuple[str, http.server.ThreadingHTTPServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, server = http_mirror
    monkeypatch.setenv("AIAYN_DATA_URL", url)
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AIAYN_DATA", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    corpus = load_parallel("val", "en", "de")
    assert corpus.src == ["A red kite flies.", "Two cats sleep on a mat."]
    server.shutdown()
    assert load_parallel("val", "en", "de").tgt == corpus.tgt  # from the cache, the server is gone
    with pytest.raises(FileNotFoundError, match="could not download"):
        load_parallel("train", "en", "de")


def test_tokenizer_places_special_tokens_and_round_trips(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(INVENTED["en"] + INVENTED["de"], 200, SpecialTokens())
    assert [tokenizer.tokenizer.token_to_id(t) for t in ("<pad>", "<unk>", "<s>", "</s>")] == [0, 1, 2, 3]
    text = "Zwei rote Katzen fliegen."
    assert tokenizer.decode(tokenizer.encode(text)) == text
    tokenizer.save(tmp_path / "tokenizer.json")
    loaded = SubwordTokenizer.load(tmp_path / "tokenizer.json")
    assert loaded.encode(text) == tokenizer.encode(text)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizer"):
        SubwordTokenizer.load(tmp_path / "broken.json")


def test_tokenizer_round_trips_the_real_training_sentences(multi30k_dir: Path) -> None:
    corpus = load_parallel("train", "en", "de", multi30k_dir)
    tokenizer = train_tokenizer(corpus.src + corpus.tgt, 10000, SpecialTokens())
    assert tokenizer.vocab_size == 10000
    for sentences in (corpus.src, corpus.tgt):
        decoded = tokenizer.decode_batch(tokenizer.encode_batch(sentences))
        assert decoded == sentences


def test_token_batches_cover_every_pair_once_within_the_limit() -> None:
    src = [3, 9, 4, 40, 7, 7, 2, 500, 12, 5] * 20
    tgt = [4, 8, 5, 38, 6, 9, 3, 10, 11, 6] * 20
    batches = token_batches(src, tgt, 64, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(len(src)))
    for batch in batches:
        longest = max(max(src[i], tgt[i]) for i in batch)
        assert longest * len(batch) <= 64 or len(batch) == 1
    assert all(len(b) == 1 for b in batches if any(src[i] == 500 for i in b))  # alone, not dropped
    assert token_batches(src, tgt, 64, seed=1, epoch=0) == batches
    assert token_batches(src, tgt, 64, seed=1, epoch=1) != batches
