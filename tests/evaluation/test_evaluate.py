"""`aiayn eval`'s pieces without an engine: what it scores (the user's files, a Multi30k split, the folder's
validation sample), how it scores a translator's output, and the confidence thresholds it calibrates on val. The
model is a NumPy fake that writes its source back, over a bundled folder's tokenizer."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from aiayn.core.folder import CONFIDENCE_SECTION, ModelFolder
from aiayn.data.multi30k import ParallelCorpus
from aiayn.evaluation import evaluate as evaluate_module
from aiayn.evaluation.confidence import calibrate_confidence, quantile_below
from aiayn.evaluation.evaluate import corpus_of, evaluate, evaluation_set
from aiayn.evaluation.metrics import score
from aiayn.search.step import FullDistributionStep
from aiayn.search.translator import SearchSettings, Translator

PAD, BOS, EOS = 0, 2, 3  # the bundled folders' special ids
EchoState = tuple[np.ndarray, np.ndarray]  # (sources (rows, src_len), prefixes (rows, fed))


class Echo(FullDistributionStep[EchoState]):
    """Writes its source back token by token, then </s> (log-probability 0): each token with the log-probability
    ``sure[token]`` (``default`` for the others), every other token impossible."""

    bos_id, eos_id, pad_id = BOS, EOS, PAD
    never_generate: tuple[int, ...] = ()

    def __init__(self, vocab: int, sure: dict[int, float] | None = None, default: float = -0.1) -> None:
        self.vocab, self.sure, self.default = vocab, sure or {}, default

    def start(self, src_ids: np.ndarray) -> EchoState:
        return src_ids, np.zeros((len(src_ids), 0), dtype=np.int64)

    def select(self, state: EchoState, rows: np.ndarray) -> EchoState:
        return state[0][rows], state[1][rows]

    def step(self, state: EchoState, tgt_ids: np.ndarray) -> tuple[np.ndarray, EchoState]:
        sources, prefixes = state[0], np.concatenate([state[1], tgt_ids], axis=1)
        log_probs = np.full((len(sources), self.vocab), -np.inf, dtype=np.float32)  # (rows, vocab)
        for row, (source, prefix) in enumerate(zip(sources.tolist(), prefixes.tolist(), strict=True)):
            written = len(prefix) - 1
            token = source[written] if written < len(source) and source[written] != PAD else EOS
            log_probs[row, token] = 0.0 if token == EOS else self.sure.get(token, self.default)
        return log_probs, (sources, prefixes)


def folder_of(bundled: Path, where: Path, src: str = "en", tgt: str = "de", **sections: object) -> ModelFolder:
    """A folder of the bundled model's config (with ``src`` → ``tgt`` and ``sections``) and tokenizer: no weights."""
    where.mkdir()
    config = json.loads((bundled / "config.json").read_text(encoding="utf-8"))
    config = {"model": {**config["model"], "src_lang": src, "tgt_lang": tgt}, **sections}
    (where / "config.json").write_text(json.dumps(config), encoding="utf-8")
    shutil.copy(bundled / "tokenizer.json", where / "tokenizer.json")
    return ModelFolder.open(where)


def test_the_users_files_are_scored_in_the_folders_pair(bundled: dict[str, Path], tmp_path: Path) -> None:
    folder = folder_of(bundled["en-de"], tmp_path / "model")
    (tmp_path / "test.en").write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    files = str(tmp_path / "test.en"), str(tmp_path / "test.de")
    expected = ParallelCorpus(["A dog.", "Two cats."], ["Ein Hund.", "Zwei Katzen."], "en", "de", "test.en", files)
    assert evaluation_set(folder, files=files) == expected
    (tmp_path / "pairs.tsv").write_text("A dog.\tEin Hund.\n", encoding="utf-8")  # no pair in its name: the folder's
    tsv = ParallelCorpus(["A dog."], ["Ein Hund."], "en", "de", "pairs.tsv", (str(tmp_path / "pairs.tsv"),))
    assert evaluation_set(folder, tsv=str(tmp_path / "pairs.tsv")) == tsv
    (tmp_path / "a.txt").write_text("A dog.\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("Ein Hund.\n", encoding="utf-8")
    unnamed = evaluation_set(folder, files=(str(tmp_path / "a.txt"), str(tmp_path / "b.txt")))
    assert (unnamed.src_lang, unnamed.tgt_lang, unnamed.split) == ("en", "de", "a.txt")

    def refused(**given: object) -> str:
        with pytest.raises(ValueError) as refusal:
            evaluation_set(folder, **given)  # type: ignore[arg-type]
        return str(refusal.value)

    (tmp_path / "back.de-en.tsv").write_text("Ein Hund.\tA dog.\n", encoding="utf-8")
    assert refused(tsv=str(tmp_path / "back.de-en.tsv")) == (
        "the test set is de→en but model translates en→de; give that pair's files"
    )
    assert refused(split="val", files=files) == "give --split or --test-files SRC REF or --test-tsv FILE, not both"
    assert refused(split="val", tsv="x.tsv").endswith("not both")
    blank = SimpleNamespace(src_lang="en", tgt_lang="de", describe=lambda: {"files": [{"path": "a"}, {"path": "b"}]})
    with pytest.raises(ValueError, match="^the test set a, b holds no pairs$"):  # files without a pair to score
        corpus_of(SimpleNamespace(**vars(blank), pairs=lambda: iter([])), "a", folder)
    in_memory = SimpleNamespace(src_lang="en", tgt_lang="de", describe=dict, pairs=lambda: iter([("A dog.", "Hund.")]))
    assert corpus_of(in_memory, "mine", folder) == ParallelCorpus(["A dog."], ["Hund."], "en", "de", "mine")


def test_a_multi30k_pair_is_scored_on_its_split(bundled: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "multi30k"  # two lines of each file, as Multi30k names them
    data.mkdir()
    for split in ("val", "test_2016_flickr"):
        for lang, line in (("de", "Ein Hund."), ("en", "A dog.")):
            with gzip.open(data / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write(f"{line} ({split})\n{line}\n")
    multi30k = folder_of(bundled["en-de"], tmp_path / "de-en", "de", "en")
    files = str(data / "test_2016_flickr.de.gz"), str(data / "test_2016_flickr.en.gz")
    test = ParallelCorpus(
        ["Ein Hund. (test_2016_flickr)", "Ein Hund."],
        ["A dog. (test_2016_flickr)", "A dog."],
        "de",
        "en",
        "test_2016_flickr",
        files,
    )
    assert evaluation_set(multi30k, data_dir=data) == test  # its test set unless a split is named
    val = evaluation_set(multi30k, "val", data_dir=data)
    assert (val.split, val.src[0], val.tgt[0]) == ("val", "Ein Hund. (val)", "A dog. (val)")


def test_another_pair_is_scored_on_the_folders_validation_sample(bundled: dict[str, Path], tmp_path: Path) -> None:
    own = folder_of(bundled["en-de"], tmp_path / "en-es", "en", "es")
    for split in (None, "test_2016_flickr"):
        with pytest.raises(ValueError) as refused:
            evaluation_set(own, split)
        assert str(refused.value) == (
            "en→es is not a Multi30k pair: give --test-files SRC REF or --test-tsv FILE (or --split val for the "
            "validation sample training kept in the folder)"
        )
    with pytest.raises(ValueError) as refused:
        evaluation_set(own, "val")
    assert str(refused.value) == (
        "en-es keeps no validation sample (it was not trained here); give --test-files SRC REF or --test-tsv FILE"
    )
    own.write_validation_sample([("A dog.", "Un perro."), ("Two cats.", "Dos gatos.")])
    sample = ParallelCorpus(
        ["A dog.", "Two cats."], ["Un perro.", "Dos gatos."], "en", "es", "val", (str(own.validation_file),)
    )
    assert evaluation_set(own, "val") == sample
    for pair in (("fr", "es"), ("es", "de")):  # one side in Multi30k is not enough
        with pytest.raises(ValueError, match="is not a Multi30k pair"):
            evaluation_set(folder_of(bundled["en-de"], tmp_path / "-".join(pair), *pair))


class Bar:
    """A progress bar that keeps what it was given: its settings and each count."""

    made: list[Bar] = []

    def __init__(self, total: int, unit: str, disable: bool, desc: str) -> None:
        self.total, self.unit, self.disable, self.desc = total, unit, disable, desc
        self.counted: list[int] = []
        self.closed = False
        Bar.made.append(self)

    def update(self, n: int) -> None:
        self.counted.append(n)

    def close(self) -> None:
        self.closed = True


def test_evaluate_scores_the_translators_output_against_the_references(
    bundled: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = folder_of(bundled["en-de"], tmp_path / "model")
    translator = Translator(Echo(folder.config.vocab_size), folder.tokenizer, 64, max_sentences=2)
    sources = ["Zwei Hunde spielen im Schnee.", "Ein Mann liest.", "Eine Frau läuft."]
    references = ["Zwei Hunde spielen im Schnee.", "Ein Mann liest ein Buch.", "Eine Frau läuft."]
    corpus = ParallelCorpus(sources, references, "de", "de", "val")
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(evaluate_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(evaluate_module, "tqdm", Bar)  # tqdm's own thread would outlive the test
    settings = SearchSettings(beam_size=2)
    done = evaluate(translator, corpus, settings)
    assert done.translations == sources  # the echo's
    assert (done.split, done.sentences, done.settings, done.seconds) == ("val", 3, settings, 2.5)
    assert done.scores == score(sources, references) and 0 < done.scores.bleu < 100
    bar = Bar.made.pop()
    assert vars(bar) == {
        "total": 3,
        "unit": "sent",
        "disable": False,
        "desc": "val beam 2",
        "counted": [2, 1],  # each length batch's sentences
        "closed": True,
    }
    clock = iter([0.0, 1.0])
    evaluate(translator, corpus, settings, progress=False)
    assert Bar.made.pop().disable


def test_calibration_keeps_the_thresholds_that_flag_their_share_of_val(
    bundled: dict[str, Path], tmp_path: Path
) -> None:
    """3 % of the outputs under the mean log-probability threshold, 5 % with a word under the word threshold
    (quantiles, rounded down), written to the folder's confidence section with what they were set on. Here both
    quantiles fall on three tied outputs: those are not flagged, only the one output under them (1 of 41)."""
    folder = folder_of(bundled["en-de"], tmp_path / "model")
    pieces = folder.tokenizer.vocabulary()
    ids = {piece: pieces.index(piece) for piece in ("▁Zwei", "▁Hunde", "▁im", "▁Schne", "e", ".", "▁Hund", "▁spielen")}
    rng = np.random.default_rng(0)
    sure = {token: float(np.float32(-rng.uniform(0.01, 0.15))) for token in ids.values()}  # a word above -0.9
    sure[ids["▁Hund"]], sure[ids["▁spielen"]] = -1.0, -1.2  # alone: a mean of -0.5 and -0.6
    usual = [piece for piece in ids if piece not in ("▁Hund", "▁spielen")]
    chosen = [list(rng.choice(usual, size=1 + i % 6)) for i in range(37)] + [["▁Hund"]] * 3 + [["▁spielen"]]
    sources = [[ids[piece] for piece in sentence] + [EOS] for sentence in chosen]
    translator = Translator(Echo(len(pieces), sure), folder.tokenizer, 64, max_sentences=16)
    progress: list[int] = []
    settings = SearchSettings(beam_size=2, length_penalty=0.8)
    section = calibrate_confidence(folder, translator, sources, settings, "val", progress.append)
    assert section == {
        "min_mean_log_prob": -0.5,
        "min_word_log_prob": -1.0,
        "calibrated_on": "val",
        "sentences": 41,
        "flagged_share_on_val": 0.0244,
        "word_marked_share_on_val": 0.0244,
        "beam_size": 2,
        "length_penalty": 0.8,
        "length_normalization": "gnmt",
    }
    assert ModelFolder.open(folder.path).section(CONFIDENCE_SECTION) == section
    assert sum(progress) == 41 and len(progress) == 3
    with pytest.raises(ValueError) as refused:
        calibrate_confidence(folder, translator, [], settings, "val")
    assert str(refused.value) == "calibrating the confidence threshold needs validation sentences; none were given"


def test_a_threshold_is_rounded_down_to_four_decimals() -> None:
    assert quantile_below(np.array([-1.23456]), 0.5) == -1.2346  # down, so it never flags more
    assert quantile_below(np.array([0.12349]), 0.5) == 0.1234
    assert quantile_below(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), 0.25) == 1.0
