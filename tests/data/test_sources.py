"""Any parallel corpus: text files and TSV (plain or .gz), HF datasets; bad files refused naming file and line."""

from __future__ import annotations

import gzip
import hashlib
import re
import sys
from pathlib import Path

import pytest

from aiayn.data.multi30k import ParallelCorpus
from aiayn.data.sources import TextFiles, TsvFile, languages_of_files, languages_of_tsv
from aiayn.data.text_files import BLOCK_BYTES, summarize_file

EN = ["A red kite  flies.", "Two cats sleep.", "ﬁne dogs run."]  # spaces and a ligature to normalize
DE = ["Ein roter Drachen fliegt.", "Zwei Katzen schlafen.", "Feine Hunde rennen."]


def write(path: Path, lines: list[str], data: bytes | None = None) -> Path:
    raw = data if data is not None else "".join(f"{line}\n" for line in lines).encode()
    path.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    return path


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_text_files_stream_normalized_pairs_and_say_where_they_came_from(tmp_path: Path, suffix: str) -> None:
    src, tgt = write(tmp_path / f"train.en{suffix}", EN), write(tmp_path / f"train.de{suffix}", DE)
    source = TextFiles.named(src, tgt, None, None)
    assert (source.src_lang, source.tgt_lang) == ("en", "de")  # from the names
    assert list(source.pairs()) == [("A red kite flies.", DE[0]), ("Two cats sleep.", DE[1]), ("fine dogs run.", DE[2])]
    described = source.describe()
    assert described["kind"] == "text files" and described["pairs"] == 3
    assert described["files"][0] == {
        "path": str(src),
        "lines": 3,
        "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),  # what sha256sum prints
    }
    assert TextFiles.named(src, tgt, "xx", "yy").src_lang == "xx"  # flags win over names


def test_languages_come_from_names_or_flags() -> None:
    assert languages_of_files(Path("corpus/train.en.gz"), Path("corpus/train.pt_br")) == ("en", "pt_br")
    assert languages_of_files(Path("source.txt"), Path("target.txt")) is None
    assert languages_of_tsv(Path("train.en-de.tsv.gz")) == ("en", "de")
    assert languages_of_tsv(Path("pairs.tsv")) is None
    with pytest.raises(ValueError, match=r"source\.txt, target\.txt are not in their names .* pass --src and --tgt"):
        TextFiles.named("source.txt", "target.txt", None, None)
    with pytest.raises(ValueError, match=r"pairs\.tsv are not in their names \(train\.en-de\.tsv\)"):
        TsvFile.named("pairs.tsv", None, None)
    with pytest.raises(ValueError, match="both 'en'"):
        TextFiles.named("a.en", "b.en", None, None)


def test_different_line_counts_name_both_files(tmp_path: Path) -> None:
    source = TextFiles.named(write(tmp_path / "t.en", EN), write(tmp_path / "t.de.gz", DE[:2]), None, None)
    with pytest.raises(ValueError, match=r"t\.en has 3 lines but .*t\.de\.gz has 2; the files must align"):
        source.describe()
    with pytest.raises(ValueError, match=r"t\.de\.gz ends at line 2, before its partner"):
        list(source.pairs())


def test_bytes_that_are_not_utf8_are_refused_with_their_line(tmp_path: Path) -> None:
    latin1 = "Zwei Katzen\nschlafen.\nÜber den Hügel.\n".encode("latin-1")
    path = write(tmp_path / "t.de", [], latin1)
    message = r"t\.de: line 3 is not UTF-8 text \(invalid continuation byte at its byte 1\); convert it to UTF-8"
    with pytest.raises(ValueError, match=message):
        summarize_file(path)
    with pytest.raises(ValueError, match=message):
        list(TextFiles.named(write(tmp_path / "t.en", EN), path, None, None).pairs())


def test_a_bad_byte_after_the_first_block_and_a_character_across_blocks(tmp_path: Path) -> None:
    # "ü" is two bytes; put one straddling the block boundary (fine), then a bad byte in a later line.
    first = "a" * (BLOCK_BYTES - 1) + "ü\n"
    path = write(tmp_path / "big.en", [], first.encode() + b"ok\n" * 5 + b"bad \xff\n")
    with pytest.raises(ValueError, match=r"big\.en: line 7 is not UTF-8 text .* at its byte 5\)"):
        summarize_file(path)
    assert summarize_file(write(tmp_path / "ok.en", [], first.encode() + b"last line without newline")).lines == 2


def test_empty_and_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"empty\.en is empty"):
        summarize_file(write(tmp_path / "empty.en", []))
    with pytest.raises(ValueError, match=r"empty\.de\.gz is empty"):
        summarize_file(write(tmp_path / "empty.de.gz", []))
    with pytest.raises(FileNotFoundError, match=r"nowhere\.en does not exist"):
        summarize_file(tmp_path / "nowhere.en")
    (tmp_path / "broken.en.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"broken\.en\.gz is not gzipped UTF-8 text"):
        summarize_file(tmp_path / "broken.en.gz")


@pytest.mark.parametrize("suffix", [".tsv", ".tsv.gz"])
def test_tsv_pairs_and_a_line_without_its_tab(tmp_path: Path, suffix: str) -> None:
    good = write(tmp_path / f"train.en-de{suffix}", [f"{e}\t{d}" for e, d in zip(EN, DE, strict=True)])
    source = TsvFile.named(good, None, None)
    assert (source.src_lang, source.tgt_lang) == ("en", "de")
    assert source.describe()["pairs"] == 3 and list(source.pairs())[1] == ("Two cats sleep.", DE[1])
    bad = write(tmp_path / f"bad{suffix}", [f"{EN[0]}\t{DE[0]}", "no tab here", f"{EN[1]}\t{DE[1]}"])
    with pytest.raises(ValueError, match=r"bad\.tsv(\.gz)?: line 2 has no tab; each line .* SOURCE<TAB>TARGET"):
        TsvFile.named(bad, "en", "de").describe()
    two = write(tmp_path / f"two{suffix}", [f"{EN[0]}\t{DE[0]}", f"{EN[1]}\t{DE[1]}\textra"])
    with pytest.raises(ValueError, match=r"line 2 has more than one tab"):
        TsvFile.named(two, "en", "de").describe()
    with pytest.raises(ValueError, match=r"line 2 is not SOURCE<TAB>TARGET"):
        list(TsvFile.named(bad, "en", "de").pairs())


def test_an_in_memory_corpus_is_a_source_with_a_hash() -> None:
    corpus = ParallelCorpus(EN, DE, "en", "de", "train")
    described = corpus.describe()
    assert described["kind"] == "in memory" and described["pairs"] == 3 and len(described["sha256"]) == 64
    assert ParallelCorpus(EN, DE[::-1], "en", "de", "train").describe()["sha256"] != described["sha256"]
    assert list(corpus.pairs())[0] == (EN[0], DE[0])


def test_a_hugging_face_dataset_saved_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the optional extra aiayn[datasets] is not installed")
    from aiayn.data.hf_datasets import HFDataset

    rows = [{"translation": {"en": e, "de": d}} for e, d in zip(EN, DE, strict=True)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "set"))
    source = HFDataset(str(tmp_path / "set"), "train", "de", "en")
    assert list(source.pairs())[2] == (DE[2], "fine dogs run.")
    described = source.describe()
    assert described["pairs"] == 3 and described["kind"] == "hf datasets" and described["fingerprint"]
    with pytest.raises(ValueError, match="has no split 'validation'; it has train"):
        HFDataset(str(tmp_path / "set"), "validation", "de", "en").describe()
    with pytest.raises(ValueError, match="'translation' has no fr"):
        HFDataset(str(tmp_path / "set"), "train", "fr", "en").describe()


class ScriptDataset:
    """A stand-in for the ``datasets`` package (no network, no install): every Hub name it knows is built by a
    loading script, which it runs, creating ``marker``, unless told ``trust_remote_code=False``; then it refuses as
    ``datasets`` does (``message``: 4.x's words, or 2.16-3.x's)."""

    def __init__(self, marker: Path, version: str = "4.0.0", message: str = "") -> None:
        self.marker, self.__version__, self.calls = marker, version, []
        self.message = message or "Dataset scripts are no longer supported, but found opus_books.py"

    def load_dataset(self, name: str, config: str | None = None, **options: object) -> object:
        self.calls.append((name, options))
        if options.get("trust_remote_code") is not False:
            self.marker.touch()  # what a script could do
            return object()
        raise (RuntimeError if self.__version__.startswith("4") else ValueError)(self.message)


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("4.0.0", "Dataset scripts are no longer supported, but found opus_books.py"),
        ("2.16.0", "Loading opus_books requires you to execute the dataset script in that repo on your local machine."),
        (
            "3.6.0",
            "The repository for opus_books contains custom code which must be executed to correctly load the "
            "dataset.\nPlease pass the argument `trust_remote_code=True` to allow custom code to be run.",
        ),
    ],
)
def test_a_dataset_built_by_a_loading_script_is_refused_in_one_line_and_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, message: str
) -> None:
    from aiayn.data.hf_datasets import NO_SCRIPTS, HFDataset

    fake = ScriptDataset(tmp_path / "ran", version, message)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(ValueError) as refused:
        HFDataset("opus_books", "train", "en", "fr", config="en-fr").describe()
    assert str(refused.value) == f"opus_books is built by a loading script; {NO_SCRIPTS}"
    assert fake.calls == [("opus_books", {"split": "train", "trust_remote_code": False})]
    assert not fake.marker.exists()


def test_a_script_path_or_a_datasets_that_may_run_scripts_unasked_is_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiayn.data.hf_datasets import NO_SCRIPTS, HFDataset

    fake = ScriptDataset(tmp_path / "ran")
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(ValueError, match=rf"^evil\.py is a loading script; {re.escape(NO_SCRIPTS)}$"):
        HFDataset("evil.py", "train", "en", "fr").describe()
    fake.__version__ = "2.15.0"  # takes no trust_remote_code: a script would run unasked
    with pytest.raises(
        ValueError, match=r"^datasets 2\.15\.0 may run a dataset's loading script unasked: pip install "
    ):
        HFDataset("opus_books", "train", "en", "fr").describe()
    assert fake.calls == [] and not fake.marker.exists()
