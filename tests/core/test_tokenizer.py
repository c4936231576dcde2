"""The shared BPE tokenizer: special ids, exact round trips (on the real corpus too), saving and loading."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from aiayn.core.config import SpecialTokens
from aiayn.core.normalizer import normalize_text
from aiayn.core.tokenizer import TOKENIZER_FILE, SubwordTokenizer, train_tokenizer
from aiayn.data.multi30k import load_parallel

# Invented sentences: the corpus itself never enters the repository.
INVENTED = [
    "A red kite flies over the hill.",
    "Two cats sleep on a mat, near 12 old boots!",
    '"Look," says the girl in a blue coat.',
    "Ein roter Drachen fliegt über den Hügel.",
    "Zwei Katzen schlafen auf einer Matte (neben 3 Stiefeln).",
    "Une fille lit un livre à l'ombre d'un arbre.",
    "Dívka čte knihu ve stínu stromu.",
]


@pytest.fixture(scope="module")
def tiny() -> SubwordTokenizer:
    return train_tokenizer(INVENTED * 2, 300, SpecialTokens())


def test_special_tokens_sit_at_the_configured_ids(tiny: SubwordTokenizer) -> None:
    assert [tiny.tokenizer.token_to_id(t) for t in ("<pad>", "<unk>", "<s>", "</s>")] == [0, 1, 2, 3]
    shuffled = train_tokenizer(INVENTED, 300, SpecialTokens(pad=3, unk=2, bos=1, eos=0))
    assert [shuffled.id_to_token(i) for i in range(4)] == ["</s>", "<s>", "<unk>", "<pad>"]
    with pytest.raises(ValueError, match="special token ids must be 0..3"):
        train_tokenizer(INVENTED, 300, SpecialTokens(eos=7))


def test_encode_decode_round_trip(tiny: SubwordTokenizer) -> None:
    for text in INVENTED + ["Zwei rote Katzen fliegen.", ""]:
        ids = tiny.encode(text)
        assert not {0, 1, 2, 3} & set(ids)
        assert tiny.decode(ids) == text
    assert tiny.decode_batch(tiny.encode_batch(INVENTED)) == INVENTED
    messy = "  Two\u00a0cats\t sleep\n"
    assert tiny.decode(tiny.encode(messy)) == normalize_text(messy) == "Two cats sleep"
    assert tiny.decode([2, *tiny.encode("a cat"), 3, 0, 0]) == "a cat"  # special tokens are dropped


def test_tokens_are_readable_and_bad_ids_are_refused(tiny: SubwordTokenizer) -> None:
    tokens = tiny.tokens(tiny.encode("A red kite."))
    assert "".join(tokens).replace("_", " ").strip() == "A red kite."
    assert tokens[0].startswith("_") and tokens[-1] == "."
    assert tiny.tokens(tiny.encode("a ☃")) == ["_a"]  # an unseen character: the file's normalizer leaves it out
    assert tiny.unknown_characters("a ☃ b\t") == {"☃"}
    size = tiny.vocab_size
    with pytest.raises(ValueError, match=rf"ids \[{size}\] are outside .* vocabulary of {size}"):
        tiny.decode([4, size])
    with pytest.raises(ValueError, match="outside"):
        tiny.tokens([-1])


def test_the_vocabulary_is_every_entry_by_id_added_tokens_too(tiny: SubwordTokenizer) -> None:
    from tokenizers import AddedToken, Tokenizer

    raw = Tokenizer.from_str(tiny.tokenizer.to_str())
    raw.add_tokens([AddedToken(f"<extra-{i}>", normalized=False) for i in range(300)])
    grown = SubwordTokenizer(raw)
    vocabulary = grown.vocabulary()
    assert len(vocabulary) == grown.vocab_size == tiny.vocab_size + 300
    assert vocabulary == [grown.id_to_token(i) for i in range(grown.vocab_size)]
    assert vocabulary[-1] == "<extra-299>"


def test_training_is_deterministic() -> None:
    first = train_tokenizer(INVENTED * 3, 250, SpecialTokens())
    second = train_tokenizer(iter(INVENTED * 3), 250, SpecialTokens())
    assert first.tokenizer.to_str() == second.tokenizer.to_str()
    with pytest.raises(ValueError, match="no text"):
        train_tokenizer([" ", ""], 250, SpecialTokens())


def test_save_and_load_give_the_same_tokenizer(tiny: SubwordTokenizer, tmp_path: Path) -> None:
    tiny.save(tmp_path / TOKENIZER_FILE)
    for path in (tmp_path / TOKENIZER_FILE, tmp_path):  # the file, or the folder holding it
        loaded = SubwordTokenizer.load(path)
        assert loaded.tokenizer.to_str() == tiny.tokenizer.to_str()
        assert loaded.encode_batch(INVENTED) == tiny.encode_batch(INVENTED)
    assert [p.name for p in tmp_path.iterdir()] == [TOKENIZER_FILE]  # no temporary file left


def test_missing_or_corrupt_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json is missing.*aiayn train"):
        SubwordTokenizer.load(tmp_path)
    (tmp_path / TOKENIZER_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer\.json is not a valid tokenizer file"):
        SubwordTokenizer.load(tmp_path / TOKENIZER_FILE)
    (tmp_path / TOKENIZER_FILE).write_text('{"model": {"type": "nothing"}}')
    with pytest.raises(ValueError, match="not a valid tokenizer file"):
        SubwordTokenizer.load(tmp_path)


def test_round_trip_on_every_real_en_de_training_sentence(multi30k_dir: Path) -> None:
    corpus = load_parallel("train", "en", "de", multi30k_dir, download=False)
    tokenizer = train_tokenizer(corpus.src + corpus.tgt, 8000, SpecialTokens())
    assert tokenizer.vocab_size == 8000
    for sentences in (corpus.src, corpus.tgt):
        ids = tokenizer.encode_batch(sentences)
        assert not any(1 in row for row in ids)  # no <unk>: every character is in the vocabulary
        mismatches = [(s, d) for s, d in zip(sentences, tokenizer.decode_batch(ids), strict=True) if s != d]
        assert mismatches == []


def test_round_trip_on_a_real_fr_cs_sample(multi30k_dir: Path) -> None:
    corpus = load_parallel("train", "fr", "cs", multi30k_dir, download=False)
    rows = random.Random(0).sample(range(len(corpus)), 3000)
    sample = [corpus.src[i] for i in rows] + [corpus.tgt[i] for i in rows]
    tokenizer = train_tokenizer(sample, 8000, SpecialTokens())
    assert tokenizer.decode_batch(tokenizer.encode_batch(sample)) == sample
