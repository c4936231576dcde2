"""`aiayn prepare`: a corpus written once as memory-mapped token ids, too-long pairs skipped and counted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aiayn.core.config import SpecialTokens
from aiayn.data.multi30k import ParallelCorpus
from aiayn.data.prepare import PREPARED_FILE, PrepareSettings, prepare
from aiayn.data.sources import TextFiles
from aiayn.data.token_arrays import id_dtype

WORDS = "red blue green cat dog bird runs sleeps jumps big small old the a on".split()
TOKENS = SpecialTokens()


def corpus(n: int, split: str = "train", seed: int = 0) -> ParallelCorpus:
    rng = np.random.default_rng(seed)
    src = [" ".join(rng.choice(WORDS, rng.integers(1, 8))) for _ in range(n)]
    return ParallelCorpus(src, [s.upper() for s in src], "en", "de", split)


def settings(**changes: object) -> PrepareSettings:
    return PrepareSettings(**{"vocab_size": 120, "max_length": 64, "batch_pairs": 7, **changes})  # type: ignore[arg-type]


def test_token_arrays_hold_each_pair_and_batches_add_the_special_tokens(tmp_path: Path) -> None:
    train, valid = corpus(50), corpus(9, "val", seed=1)
    data = prepare(tmp_path / "prepared", train, valid, settings())
    tokenizer = data.tokenizer
    assert len(data.train) == 50 and data.train.src.ids.dtype == id_dtype(tokenizer.vocab_size) == np.uint16
    assert isinstance(data.train.src.ids, np.memmap)
    for i in (0, 17, 49):  # written in batches of 7: across their borders too
        assert data.train.src[i] == tokenizer.encode(train.src[i])
        assert data.train.tgt[i] == tokenizer.encode(train.tgt[i])
    rows = np.array([3, 0, 41])
    src_ids, tgt_in, tgt_out = data.train.padded(rows, TOKENS)
    for b, i in enumerate(rows):
        src, tgt = tokenizer.encode(train.src[i]), tokenizer.encode(train.tgt[i])
        assert src_ids[b].tolist() == [*src, TOKENS.eos] + [TOKENS.pad] * (src_ids.shape[1] - len(src) - 1)
        assert tgt_in[b, : len(tgt) + 1].tolist() == [TOKENS.bos, *tgt]
        assert tgt_out[b, : len(tgt) + 1].tolist() == [*tgt, TOKENS.eos]
        assert (tgt_in[b, len(tgt) + 1 :] == TOKENS.pad).all() and (tgt_out[b, len(tgt) + 1 :] == TOKENS.pad).all()
    src_lengths, tgt_lengths = data.train.lengths()
    assert src_lengths[17] == len(tokenizer.encode(train.src[17])) and tgt_lengths.dtype == np.int32
    assert data.valid_references == valid.tgt
    assert data.valid.source_ids(TOKENS.eos)[2] == [*tokenizer.encode(valid.src[2]), TOKENS.eos]


def test_pairs_over_the_length_limit_or_empty_are_skipped_and_counted(tmp_path: Path) -> None:
    long = " ".join(["cat dog"] * 40)
    train = ParallelCorpus(
        ["a cat", long, "the dog", "", "a bird"], ["A CAT", "A", "THE DOG", "X", long], "en", "de", "t"
    )
    valid = ParallelCorpus(["a cat", long], ["A CAT", "LONG"], "en", "de", "v")
    data = prepare(tmp_path / "p", train, valid, settings(vocab_size=60, max_length=20))
    counts = json.loads((tmp_path / "p" / PREPARED_FILE).read_text())["counts"]
    assert counts["train"] == {"read": 5, "kept": 2, "skipped_too_long": 2, "skipped_empty": 1}
    assert counts["valid"] == {"read": 2, "kept": 1, "skipped_too_long": 1, "skipped_empty": 0}
    assert [data.tokenizer.decode(data.train.tgt[i]) for i in range(2)] == ["A CAT", "THE DOG"]
    assert data.valid_references == ["A CAT"]
    with pytest.raises(ValueError, match="none of the 2 train pairs fits: 0 have an empty side, 2 a side over 3"):
        prepare(
            tmp_path / "q", ParallelCorpus([long, long], ["A", "B"], "en", "de", "t"), valid, settings(max_length=3)
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # nothing half-written beside it


def test_the_record_says_where_the_data_came_from_and_a_rerun_reuses_it(tmp_path: Path) -> None:
    for split, n in (("train", 30), ("val", 5)):
        pairs = corpus(n, split)
        (tmp_path / f"{split}.en").write_text("".join(f"{s}\n" for s in pairs.src))
        (tmp_path / f"{split}.de").write_text("".join(f"{s}\n" for s in pairs.tgt))
    train = TextFiles.named(tmp_path / "train.en", tmp_path / "train.de", None, None)
    valid = TextFiles.named(tmp_path / "val.en", tmp_path / "val.de", None, None)
    data = prepare(tmp_path / "p", train, valid, settings(), reuse=True)
    sources = data.record["sources"]
    assert (sources["src_lang"], sources["tgt_lang"]) == ("en", "de")
    assert [f["lines"] for f in sources["train"]["files"]] == [30, 30]
    assert sources["train"]["files"][0]["path"] == str(tmp_path / "train.en")
    assert len(sources["valid"]["files"][1]["sha256"]) == 64
    written = (tmp_path / "p" / "train.src.bin").stat().st_mtime_ns
    again = prepare(tmp_path / "p", train, valid, settings(), reuse=True)  # same files, same settings: reused
    assert (tmp_path / "p" / "train.src.bin").stat().st_mtime_ns == written and len(again.train) == 30
    (tmp_path / "train.de").write_text("".join(f"{s}!\n" for s in corpus(30).tgt))
    changed = prepare(tmp_path / "p", train, valid, settings(), reuse=True)  # a file changed: prepared again
    assert changed.record["sources"]["train"]["files"][1]["sha256"] != sources["train"]["files"][1]["sha256"]
    mixed = TextFiles.named(tmp_path / "val.en", tmp_path / "val.de", "de", "en")
    with pytest.raises(ValueError, match="training pairs are en->de but the validation pairs de->en"):
        prepare(tmp_path / "x", train, mixed, settings())


def test_a_large_corpus_trains_the_tokenizer_on_an_even_sample(tmp_path: Path) -> None:
    data = prepare(tmp_path / "p", corpus(100), corpus(5, "val"), settings(tokenizer_sample=30))
    assert data.record["tokenizer"]["every_kth_pair"] == 4  # 25 of the 100 pairs
    assert len(data.train) == 100  # all of them are written
    given = prepare(tmp_path / "q", corpus(20), corpus(5, "val"), settings(), tokenizer=data.tokenizer)
    assert given.record["tokenizer"]["sha256"] == data.record["tokenizer"]["sha256"]
    assert "every_kth_pair" not in given.record["tokenizer"]
