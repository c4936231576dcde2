"""The length penalty α of §6.1 tuned on val and kept in the model folder, where every translation takes it from."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiayn.cli import main
from aiayn.core.folder import ModelFolder
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.data.multi30k import ParallelCorpus
from aiayn.engines import ONNX_PORTABLE
from aiayn.engines.onnx.portable.engine import PortableOnnxEngine
from aiayn.engines.options import EngineOptions
from aiayn.engines.placement import Placement
from aiayn.evaluation.evaluate import kept_normalization, tune_length_penalty
from aiayn.evaluation.metrics import score
from aiayn.search.step import FullDistributionStep
from aiayn.search.translator import SearchSettings, Translator
from aiayn.serve.service import TranslationService

SENTENCES = ["the red cat sleeps.", "a small dog runs after two blue birds!", "das rote Haus"]


@pytest.fixture
def folder(tiny_folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_folder, tmp_path / "model"))


def test_a_folder_without_a_tuned_value_uses_the_papers(folder: Path) -> None:
    assert SearchSettings.of(ModelFolder.open(folder)) == SearchSettings(beam_size=4, length_penalty=0.6)
    assert SearchSettings.of(ModelFolder.open(folder), beam_size=2, length_penalty=1.0).length_penalty == 1.0


def test_tuning_on_val_keeps_the_best_and_every_translation_uses_it(folder: Path) -> None:
    translator = Translator(
        PortableOnnxEngine.load(folder, Placement(ONNX_PORTABLE)), SubwordTokenizer.load(folder / "tokenizer.json"), 64
    )
    before = json.loads((folder / "config.json").read_text())
    val = ParallelCorpus(SENTENCES, SENTENCES, "en", "de", "val")
    (bleu,) = tune_length_penalty(ModelFolder.open(folder), translator, val, 3, [0.6, 1.2, 2.0]).values()
    best = max(bleu, key=lambda alpha: bleu[alpha])
    after = json.loads((folder / "config.json").read_text())
    assert after["search"]["length_penalty"] == best and after["search"]["length_normalization"] == "gnmt"
    assert after["search"]["tuned_on"]["split"] == "val" and set(after["search"]["tuned_on"]["bleu"]["gnmt"]) == {
        "0.6",
        "1.2",
        "2.0",
    }
    assert after["model"] == before["model"] and after["onnx"] == before["onnx"]  # the graphs' stamps still match
    tuned = SearchSettings.of(ModelFolder.open(folder), beam_size=2)
    assert tuned == SearchSettings(beam_size=2, length_penalty=best)
    assert TranslationService(EngineOptions(device="cpu")).model(str(folder)).search.length_penalty == best

    test = ParallelCorpus(SENTENCES, SENTENCES, "en", "de", "test_2016_flickr")
    with pytest.raises(ValueError, match="on val only"):
        tune_length_penalty(ModelFolder.open(folder), translator, test, 3, [0.6, 1.2])


WORDS = "<pad> <unk> <s> </s> two dogs play together in the deep white snow".split()
PAD, BOS, EOS = 0, 2, 3
REFERENCE = WORDS[4:]  # eight words


class WordCodec:
    """One id per word of WORDS."""

    def encode_source(self, text: str) -> list[int]:
        return [WORDS.index(word) for word in text.split()] + [EOS]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(WORDS[i] for i in ids)


class ShortOrLong(FullDistributionStep[np.ndarray]):
    """A model torn between two outputs: </s> at once (probability 0.5), or REFERENCE word by word (0.5 for its
    first word, then 0.9 for each next word, then </s>). Without a length penalty the empty output scores
    log 0.5 = -0.69 against the reference's log 0.5 + 7 log 0.9 = -1.43; the reference's 9 tokens win once
    lp = (14/6)^α exceeds 2.07, that is from α ≈ 0.86: α = 0.6 keeps the empty output, 1.2 and 2.0 the reference."""

    bos_id, eos_id, pad_id = BOS, EOS, PAD
    never_generate: tuple[int, ...] = ()

    def start(self, src_ids: np.ndarray) -> np.ndarray:
        return np.zeros((src_ids.shape[0], 0), dtype=np.int64)  # the state: each row's prefix

    def select(self, state: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return state[rows]

    def step(self, state: np.ndarray, tgt_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        state = np.concatenate([state, tgt_ids], axis=1)  # (rows, length)
        reference = [WORDS.index(word) for word in REFERENCE]
        log_probs = np.full((state.shape[0], len(WORDS)), -np.inf, dtype=np.float32)  # (rows, vocab): impossible
        for row, prefix in enumerate(state.tolist()):
            written = prefix[1:]
            if not written:
                log_probs[row, [EOS, reference[0]]] = np.log(0.5)
            elif written == reference[: len(written)] and len(written) < len(reference):
                log_probs[row, reference[len(written)]] = np.log(0.9)
            else:
                log_probs[row, EOS] = 0.0
        return log_probs, state


@pytest.fixture
def config_only(bundled: dict[str, Path], tmp_path: Path) -> Path:
    """A folder of the bundled model's config.json alone: all that tuning reads and writes."""
    (tmp_path / "model").mkdir()
    return Path(shutil.copy(bundled["en-de"] / "config.json", tmp_path / "model" / "config.json")).parent


def test_tuning_keeps_the_alpha_whose_translations_score_best(config_only: Path) -> None:
    translator = Translator(ShortOrLong(), WordCodec(), 64)
    sentence = " ".join(REFERENCE)
    val = ParallelCorpus([sentence, "two dogs"], [sentence, sentence], "en", "de", "val")
    folder = ModelFolder.open(config_only)  # the bundled config: tuned under |Y|^α; here under GNMT's lp
    bleu = tune_length_penalty(folder, translator, val, 4, [0.6, 1.2, 2.0], ["gnmt"])["gnmt"]
    assert bleu[0.6] == 0.0 and bleu[1.2] == bleu[2.0] == pytest.approx(100.0)
    assert SearchSettings.of(ModelFolder.open(config_only)).length_penalty == 1.2  # the best; of two equal, the first


class Recording(Translator):
    """A translator over ``ShortOrLong`` that keeps the settings of each translation."""

    def __init__(self) -> None:
        super().__init__(ShortOrLong(), WordCodec(), 64)
        self.settings: list[SearchSettings] = []

    def translate(
        self, texts: Sequence[str], settings: SearchSettings | None = None, on_batch: Any = None
    ) -> list[str]:
        assert settings is not None  # tuning names each search's settings
        self.settings.append(settings)
        return super().translate(texts, settings, on_batch)


def test_tuning_searches_with_the_folders_own_settings_and_keeps_them(
    config_only: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An imported checkpoint's beam and normalisation stay in the section; tuning searches with its |Y|^α, under
    which the reference's 9 tokens win from α ≈ 0.33 on (GNMT's would keep the empty output at 0.6)."""
    folder = ModelFolder.open(config_only)
    folder.write_section("search", {"beam_size": 6, "length_normalization": "power", "length_penalty": 0.1})
    sentence, other = " ".join(REFERENCE), "two dogs play in the white snow"
    val = ParallelCorpus([sentence, "two dogs"], [sentence, other], "en", "de", "val")
    translator = Recording()
    bleu = tune_length_penalty(ModelFolder.open(config_only), translator, val, 2, [0.3, 0.6, 2.0])
    power = [SearchSettings(2, alpha, length_normalization="power") for alpha in (0.3, 0.6, 2.0)]
    assert translator.settings == power  # the folder's normalisation, the beam asked for, each candidate α
    reference_bleu = score([sentence, sentence], [sentence, other]).bleu
    assert bleu == {"power": {0.3: 0.0, 0.6: reference_bleu, 2.0: reference_bleu}}
    assert round(reference_bleu, 2) != reference_bleu
    assert ModelFolder.open(config_only).section("search") == {
        "beam_size": 6,
        "length_normalization": "power",
        "length_penalty": 0.6,
        "tuned_on": {
            "split": "val",
            "beam_size": 2,
            "length_normalization_before": "power",
            "bleu": {"power": {"0.3": 0.0, "0.6": round(reference_bleu, 2), "2.0": round(reference_bleu, 2)}},
        },
    }
    assert capsys.readouterr().err == ""  # no progress bar per candidate
    tuned = SearchSettings.of(ModelFolder.open(config_only), beam_size=3, length_penalty=None)  # None: the folder's
    assert tuned == SearchSettings(3, 0.6, length_normalization="power")
    test = ParallelCorpus(val.src, val.tgt, "en", "de", "test_2016_flickr")
    with pytest.raises(ValueError) as refused:
        tune_length_penalty(folder, Translator(ShortOrLong(), WordCodec(), 64), test, 2, [0.6])
    assert (
        str(refused.value) == "tune the length penalty on val only, not test_2016_flickr: test sets are for reporting"
    )


def test_tuned_under_both_normalizations_power_is_kept_within_the_margin(config_only: Path) -> None:
    """gnmt,power: α under each; |Y|^α, which generate and CTranslate2 reproduce, is kept unless GNMT's best val
    BLEU beats its best by more than PORTABLE_BLEU_MARGIN. ShortOrLong's reference wins from α ≈ 0.33 under |Y|^α
    and from α ≈ 0.86 under GNMT's: at 0.6 only power finds it, at 1.2 both."""
    sentence = " ".join(REFERENCE)
    val = ParallelCorpus([sentence], [sentence], "en", "de", "val")
    translator = Translator(ShortOrLong(), WordCodec(), 64)
    bleu = tune_length_penalty(ModelFolder.open(config_only), translator, val, 2, [0.6, 1.2], ["gnmt", "power"])
    assert bleu == {
        "gnmt": {0.6: 0.0, 1.2: pytest.approx(100.0)},
        "power": {0.6: pytest.approx(100.0), 1.2: pytest.approx(100.0)},
    }
    section = ModelFolder.open(config_only).section("search")
    assert (section["length_normalization"], section["length_penalty"]) == ("power", 0.6)
    assert section["tuned_on"]["bleu"] == {"gnmt": {"0.6": 0.0, "1.2": 100.0}, "power": {"0.6": 100.0, "1.2": 100.0}}
    assert SearchSettings.of(ModelFolder.open(config_only)) == SearchSettings(4, 0.6, length_normalization="power")
    assert kept_normalization({"gnmt": 42.34, "power": 42.25}) == "power"
    assert kept_normalization({"gnmt": 42.36, "power": 42.25}) == "gnmt"
    assert kept_normalization({"power": 40.0, "gnmt": 42.0}) == "gnmt"
    assert kept_normalization({"gnmt": 41.0}) == "gnmt"


def test_eval_takes_a_known_normalization_and_two_only_to_tune(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--length-normalization", "gnmt,cubic"])
    assert "expected gnmt or power, or both separated by a comma; got gnmt,cubic" in capsys.readouterr().err
    assert main(["eval", "--length-normalization", "gnmt,power"]) == 2
    assert "--length-normalization takes one name, unless with --tune-length-penalty" in capsys.readouterr().err
