"""tokenizer.json carries the whole text contract: the raw text through the file alone gives the CLI's ids."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, normalizers

from aiayn.core.config import SpecialTokens
from aiayn.core.normalizer import code_points, is_tidy, kept_characters, normalize_text, tidied
from aiayn.core.tokenizer import SPECIAL_TOKEN_TEXT, SubwordTokenizer, train_tokenizer

UNTIDY = [
    "A man\tin a red shirt.",
    "A man  in a red shirt.",
    "A man in a red shirt.\t",
    "   A man in a red shirt.",
    "A man\u00a0in a red shirt.",
    "A man\u2028in a red\u2029shirt.",
    "A man\x0bin a\x0cred shirt.",
    "\t \u3000A\u2003man \u202f in\x85a\u1680red\x1cshirt.\u205f\u00a0",
    "Ein Mann\t\tin einem  roten Hemd .  ",
    " \t\u2028 ",
    "ﬁve ① dogs ｆｕｌｌ ｗｉｄｔｈ",  # NFKC compatibility forms
    "cafe\u0301 re\u0301sume\u0301",  # decomposed: the service drops the lone accent before NFKC
    "a ¨ b",  # NFKC(¨) is a space and a combining mark
    "emoji 😀 here \t and ☃ there",
]


def plain(folder: Path) -> Tokenizer:
    """The folder's tokenizer as it was before the contract moved into the file: NFKC only."""
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.normalizer = normalizers.NFKC()
    return tokenizer


def cli_ids(old: Tokenizer, text: str) -> list[int]:
    """What the CLI feeds for one sentence with the old file: unknown characters out, then tidied."""
    unk = old.token_to_id(SPECIAL_TOKEN_TEXT["unk"])
    unknown = {
        ch
        for ch in set(text)
        if not ch.isspace()
        and (not (ids := old.encode(normalize_text(ch), add_special_tokens=False).ids) or unk in ids)
    }
    return old.encode(normalize_text("".join(ch for ch in text if ch not in unknown)), add_special_tokens=False).ids


def file_ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


@pytest.mark.parametrize("pair", ["en-de", "de-en"])
def test_the_bundled_file_alone_turns_raw_text_into_the_clis_ids(bundled: dict[str, Path], pair: str) -> None:
    folder = bundled[pair]
    tidy, old = Tokenizer.from_file(str(folder / "tokenizer.json")), plain(folder)
    assert is_tidy(tidy) and not is_tidy(old)
    assert file_ids(tidy, UNTIDY) == [cli_ids(old, text) for text in UNTIDY]
    assert tidy.encode("A man\tin a red shirt.").ids == tidy.encode("A man in a red shirt.").ids
    rng = random.Random(0)
    pieces = ["a", "b", "Hund", "é", "e\u0301", " ", "\t", "\u00a0", "\u2028", "\x0c", "😀", ".", "ﬁ", "\u3000"]
    fuzz = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(2000)]
    assert file_ids(tidy, fuzz) == [cli_ids(old, text) for text in fuzz]
    # Every code point, inside a word: the file alone does what the service does.
    texts = [f"a{c}b" for c in code_points()[::7]]
    assert file_ids(tidy, texts) == [cli_ids(old, text) for text in texts]


@pytest.mark.parametrize("pair", ["en-de", "de-en"])
def test_the_ids_of_every_corpus_line_are_unchanged(bundled: dict[str, Path], multi30k_dir: Path, pair: str) -> None:
    tidy, old = Tokenizer.from_file(str(bundled[pair] / "tokenizer.json")), plain(bundled[pair])
    for path in sorted(p for lang in pair.split("-") for p in multi30k_dir.glob(f"*.{lang}.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
        before = file_ids(old, [normalize_text(line) for line in lines])
        assert not any(old.token_to_id(SPECIAL_TOKEN_TEXT["unk"]) in ids for ids in before)  # all known text
        assert file_ids(tidy, lines) == before, path.name


def test_kept_characters_are_those_the_bpe_model_covers(bundled: dict[str, Path]) -> None:
    old = plain(bundled["en-de"])
    unk = old.token_to_id("<unk>")
    points = code_points()
    encoded = old.encode_batch([normalize_text(c) for c in points], add_special_tokens=False)
    by_encoding = {c for c, e in zip(points, encoded, strict=True) if c.isspace() or (e.ids and unk not in e.ids)}
    assert kept_characters(old, SPECIAL_TOKEN_TEXT.values()) == by_encoding


def test_a_trained_tokenizer_carries_the_contract_and_an_old_one_is_refused_nothing() -> None:
    trained = train_tokenizer(["Two dogs run.", "Zwei Hunde rennen."] * 4, 60, SpecialTokens())
    assert is_tidy(trained.tokenizer)
    raw = trained.tokenizer.encode("  Two\tdogs\u00a0run☃.", add_special_tokens=False).ids
    assert raw == trained.encode("Two dogs run.")
    with pytest.raises(ValueError, match="expected the plain normalizer"):
        tidied(trained.tokenizer, SPECIAL_TOKEN_TEXT.values())  # a second tidying would replace the first


def test_an_old_folder_is_tidied_in_place(bundled: dict[str, Path], tmp_path: Path) -> None:
    from aiayn.core.folder import ModelFolder

    (tmp_path / "config.json").write_bytes((bundled["en-de"] / "config.json").read_bytes())
    plain(bundled["en-de"]).save(str(tmp_path / "tokenizer.json"))
    folder = ModelFolder.open(tmp_path)
    assert folder.tidy_tokenizer() and not folder.tidy_tokenizer()
    assert (tmp_path / "tokenizer.json").read_bytes() == (bundled["en-de"] / "tokenizer.json").read_bytes()
    assert SubwordTokenizer.load(tmp_path).encode("A dog.") == folder.tokenizer.encode("A dog.")


def test_the_service_encodes_every_code_point_as_the_file_alone_does(bundled: dict[str, Path]) -> None:
    """What a browser's tokenizers.js gets from the file: ``¼`` (NFKC ``1⁄4``, its ``⁄`` outside the vocabulary)
    is left out whole, not read as ``14``."""
    folder = bundled["en-de"]
    service, tidy = SubwordTokenizer.load(folder), Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = [f"a{c}b" for c in code_points()[::3]] + ["¼ Ŀ ǅ"]
    assert service.encode_batch(texts) == file_ids(tidy, texts)
    assert service.unknown_characters("¼ Ŀ ǅ") == {"¼", "Ŀ", "ǅ"}
