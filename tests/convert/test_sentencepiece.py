"""tokenizer_from_sentencepiece against transformers' MarianTokenizer: the same ids, the same decoded text.

The tests train their own small SentencePiece models as OPUS-MT does (Unigram, full character coverage, <unk> 0,
<s> 1, </s> 2) and builds vocab.json as OPUS-MT's: </s> 0, <unk> 1, the pieces of both models, <pad> last.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sentencepiece", reason="sentencepiece (the full install) is not installed")
pytest.importorskip("transformers", reason="transformers (the full install) is not installed")

import sentencepiece as spm  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import MarianTokenizer  # noqa: E402

from aiayn.convert.sentencepiece import tokenizer_from_sentencepiece  # noqa: E402
from aiayn.data.multi30k import LANGUAGES, VALIDATION_SPLIT, find_data_dir  # noqa: E402
from aiayn.data.text_files import read_lines  # noqa: E402

# MarianTokenizer warns once per instance that sacremoses is missing; neither side normalises punctuation then
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

ENGLISH = [
    "A baker in a white apron carries three loaves across the square.",
    "Two tired, happy hikers rest beside a mossy stone wall!",
    "Do several sailors in yellow coats pull the heavy rope?",
    "A small boy builds a sand castle; he is 5 years old.",
    "Three people sit in a café and drink coffee at 10:30 (fine weather).",
    "The dog's owner said: \"don't run\" - and it stopped at once.",
    "Children play football in the park while their parents watch.",
    "A woman with long brown hair holds a red umbrella in the rain.",
]
GERMAN = [
    "Ein Bäcker in weißer Schürze trägt drei Brote über den Platz.",
    "Zwei müde, fröhliche Wanderer ruhen neben einer moosigen Steinmauer!",
    "Ziehen mehrere Seeleute in gelben Mänteln das schwere Seil?",
    "Ein kleiner Junge baut eine Sandburg; er ist 5 Jahre alt.",
    "Drei Leute sitzen in einem Café und trinken um 10:30 Kaffee (schönes Wetter).",
    "Die Besitzerin des Hundes sagte: „lauf nicht“ – und er blieb stehen.",
    "Kinder spielen im Park Fußball, während ihre Eltern zusehen.",
    "Eine Frau mit langen braunen Haaren hält im Regen einen roten Schirm über die Füße.",
]
TRICKY = [
    "",
    " ",
    "   two   spaces  between  ",
    "\ttabs\tand\nnew lines\r\n",
    "\u3000ideographic\u00a0and no-break\u2009spaces",
    "ﬁne ① ② ⑩ and ½",
    "Ｆｕｌｌ－ｗｉｄｔｈ ｌｅｔｔｅｒｓ １２３",
    "café composed, cafe\u0301 decomposed",
    "中文 and emoji 😀😀 glued😀to words, 🎉",
    "a lone ß in Straße, which only the German model has",
    "x\x85y and control\x01characters\x7f",
    "▁already ▁marked",
    "special tokens </s> in <pad> the<unk>text</s>",
    "<s> is no special token here",
    "...!!! ??? ,,,",
]


@dataclass(frozen=True)
class Marian:
    """A MarianTokenizer and the two files converted from its spm models."""

    reference: MarianTokenizer
    source: Tokenizer
    target: Tokenizer
    vocab: dict[str, int]


def converted(spm_file: Path, vocab: dict[str, int]) -> Tokenizer:
    """The tokenizer as serving reads it: saved and loaded again."""
    return Tokenizer.from_str(tokenizer_from_sentencepiece(spm_file, vocab).to_str())


def train_marian(kit: Any, folder: Path, source: Sequence[str], target: Sequence[str], vocab_size: int) -> Marian:
    """``kit``: the ``spm_kit`` fixture (tests/convert/conftest.py)."""
    source_spm = kit.train(source, folder / "source", vocab_size)
    target_spm = kit.train(target, folder / "target", vocab_size)
    vocab = kit.vocab([source_spm, target_spm])
    vocab_file = folder / "vocab.json"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    reference = MarianTokenizer(str(source_spm), str(target_spm), str(vocab_file))
    return Marian(reference, converted(source_spm, vocab), converted(target_spm, vocab), vocab)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, spm_kit: Any) -> Marian:
    """en → de from the built-in sentences: no corpus needed."""
    return train_marian(spm_kit, tmp_path_factory.mktemp("small"), ENGLISH * 4, GERMAN * 4, vocab_size=300)


@pytest.fixture(scope="module")
def multi30k(
    tmp_path_factory: pytest.TempPathFactory, multi30k_dir: Path, spm_kit: Any
) -> tuple[Marian, list[str], list[str]]:
    """en → de trained on the Multi30k training split, with that split's lines."""
    english = list(read_lines(multi30k_dir / "train.en.gz"))
    german = list(read_lines(multi30k_dir / "train.de.gz"))
    return train_marian(spm_kit, tmp_path_factory.mktemp("multi30k"), english, german, vocab_size=2000), english, german


def encode_differences(
    reference: MarianTokenizer, tokenizer: Tokenizer, texts: Sequence[str], target: bool = False
) -> list[str]:
    """The texts that MarianTokenizer (with its target spm if ``target``) and ``tokenizer`` give different ids."""
    ours = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return [
        text for text, encoding in zip(texts, ours, strict=True) if encoding.ids != marian_ids(reference, text, target)
    ]


def marian_ids(reference: MarianTokenizer, text: str, target: bool = False) -> list[int]:
    encoding = (
        reference(text_target=text, add_special_tokens=False) if target else reference(text, add_special_tokens=False)
    )
    return list(encoding["input_ids"])


def decode_differences(reference: MarianTokenizer, tokenizer: Tokenizer, batch: Sequence[list[int]]) -> list[str]:
    """MarianTokenizer decodes with the source spm where the vocabulary is shared: so must the source file."""
    theirs = reference.batch_decode(batch, skip_special_tokens=True)
    ours = tokenizer.decode_batch(list(batch), skip_special_tokens=True)
    return [f"{ids}: {t!r} != {o!r}" for ids, t, o in zip(batch, theirs, ours, strict=True) if t != o]


def random_ids(vocab: dict[str, int], count: int) -> list[list[int]]:
    """Sequences of any ids, half of them thick with the special tokens (as a model's raw output can be)."""
    rng = random.Random(0)
    specials = [vocab["</s>"], vocab["<unk>"], vocab["<pad>"]]
    any_id = [[rng.randrange(len(vocab)) for _ in range(rng.randrange(30))] for _ in range(count)]
    mixed = [
        [rng.choice([*specials, rng.randrange(len(vocab))]) for _ in range(rng.randrange(10))] for _ in range(count)
    ]
    return any_id + mixed


def long_unknown_run(spm_file: Path, text: str) -> bool:
    """Whether SentencePiece finds two or more characters it lacks side by side: the one place where the file
    may differ (see ``test_an_unknown_run_that_is_no_piece_differs``)."""
    processor = spm.SentencePieceProcessor(model_file=str(spm_file))
    pieces = zip(processor.encode(text, out_type=str), processor.encode(text), strict=True)
    return any(processor.is_unknown(i) and len(piece) > 1 for piece, i in pieces)  # an unknown piece is its text


def test_every_multi30k_line_encodes_as_marian(multi30k: tuple[Marian, list[str], list[str]]) -> None:
    marian, english, german = multi30k
    differ = encode_differences(marian.reference, marian.source, english)
    assert not differ, f"{len(differ)} of {len(english)} lines encode differently, e.g. {differ[:3]}"
    differ = encode_differences(marian.reference, marian.target, german, target=True)
    assert not differ, f"{len(differ)} of {len(german)} target lines encode differently, e.g. {differ[:3]}"


def test_every_multi30k_target_decodes_as_marian(multi30k: tuple[Marian, list[str], list[str]]) -> None:
    marian, _, german = multi30k
    batch = [marian.reference(text_target=text)["input_ids"] for text in german]  # with </s>, as a model writes
    differ = decode_differences(marian.reference, marian.source, batch)
    assert not differ, f"{len(differ)} of {len(batch)} decode differently, e.g. {differ[:3]}"


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_text_encodes_as_marian(small: Marian, text: str) -> None:
    assert small.source.encode(text, add_special_tokens=False).ids == marian_ids(small.reference, text)


def test_built_in_sentences_encode_and_decode_as_marian(small: Marian) -> None:
    assert not encode_differences(small.reference, small.source, ENGLISH)
    assert not encode_differences(small.reference, small.target, GERMAN, target=True)
    batch = [small.reference(text_target=text)["input_ids"] for text in GERMAN + TRICKY]
    assert not decode_differences(small.reference, small.source, batch)


def test_random_ids_decode_as_marian(small: Marian) -> None:
    assert not decode_differences(small.reference, small.source, random_ids(small.vocab, 2000))


def test_special_tokens_at_their_vocab_ids(small: Marian) -> None:
    for tokenizer in (small.source, small.target):
        assert tokenizer.get_vocab_size() == len(small.vocab)
        for token in ("</s>", "<unk>", "<pad>"):
            assert tokenizer.token_to_id(token) == small.vocab[token]


def test_an_unknown_run_that_is_no_piece_differs(small: Marian) -> None:
    """The one known difference. MarianTokenizer looks a run of characters that its spm lacks up in vocab.json
    whole: a lone "ß" finds the German piece (as here), "ßä" is no piece and so <unk>. A Unigram model can only
    cover the run with pieces, so the file gives ß, ä."""
    ours = small.source.encode("aßäb", add_special_tokens=False)
    assert ours.tokens[1:3] == ["ß", "ä"]
    assert small.vocab["<unk>"] in marian_ids(small.reference, "aßäb")


def test_refuses_what_it_cannot_reproduce(tmp_path: Path, small: Marian, spm_kit: Any) -> None:
    text, train_spm = ENGLISH * 4, spm_kit.train
    with pytest.raises(ValueError, match="BPE model; only Unigram"):
        tokenizer_from_sentencepiece(train_spm(text, tmp_path / "bpe", 200, model_type="bpe"), small.vocab)
    with pytest.raises(ValueError, match="byte fallback"):
        tokenizer_from_sentencepiece(train_spm(text, tmp_path / "bytes", 400, byte_fallback=True), small.vocab)
    good = train_spm(text, tmp_path / "good", 200)
    with pytest.raises(ValueError, match=r"the special tokens \['<unk>'\] are not in vocab.json"):
        tokenizer_from_sentencepiece(
            good, {"<UNK>" if piece == "<unk>" else piece: i for piece, i in small.vocab.items()}
        )
    with pytest.raises(ValueError, match="ids must be 0..n-1"):
        tokenizer_from_sentencepiece(good, {**small.vocab, "extra": 0})


def test_the_spm_of_your_choice() -> None:
    """Any Marian spm: ``AIAYN_TEST_SPM=.../source.spm AIAYN_TEST_VOCAB=.../vocab.json pytest -k your_choice``;
    the Multi30k validation split in its four languages joins the built-in texts where it is found."""
    spm_name, vocab_name = os.environ.get("AIAYN_TEST_SPM"), os.environ.get("AIAYN_TEST_VOCAB")
    if not (spm_name and vocab_name):
        pytest.skip("set AIAYN_TEST_SPM to a Marian source.spm and AIAYN_TEST_VOCAB to its vocab.json to test them")
    spm_file = Path(spm_name)
    vocab = json.loads(Path(vocab_name).read_text(encoding="utf-8"))
    reference = MarianTokenizer(spm_name, spm_name, vocab_name)
    tokenizer = converted(spm_file, vocab)
    texts = ENGLISH + GERMAN + TRICKY
    data = find_data_dir()
    if data is not None:
        texts += [line for lang in LANGUAGES for line in read_lines(data / f"{VALIDATION_SPLIT}.{lang}.gz")]
    differ = [text for text in encode_differences(reference, tokenizer, texts) if not long_unknown_run(spm_file, text)]
    assert not differ, f"{len(differ)} of {len(texts)} texts encode differently, e.g. {differ[:3]}"
    differ = decode_differences(reference, tokenizer, random_ids(vocab, 2000))
    assert not differ, f"{len(differ)} random id sequences decode differently, e.g. {differ[:3]}"
