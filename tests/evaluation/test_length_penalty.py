"""The length penalty α of §6.1 tuned on val and kept in the model folder, where every translation takes it from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aiayn.core.folder import ModelFolder
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.data.multi30k import ParallelCorpus
from aiayn.engines.onnx.engine import PortableOnnxEngine
from aiayn.evaluation.evaluate import tune_length_penalty
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
        PortableOnnxEngine.load(folder, device="cpu"), SubwordTokenizer.load(folder / "tokenizer.json"), 64
    )
    before = json.loads((folder / "config.json").read_text())
    val = ParallelCorpus(SENTENCES, SENTENCES, "en", "de", "val")
    bleu = tune_length_penalty(ModelFolder.open(folder), translator, val, 3, [0.6, 1.2, 2.0])
    best = max(bleu, key=lambda alpha: bleu[alpha])
    after = json.loads((folder / "config.json").read_text())
    assert after["search"]["length_penalty"] == best
    assert after["search"]["tuned_on"]["split"] == "val" and set(after["search"]["tuned_on"]["bleu"]) == {
        "0.6",
        "1.2",
        "2.0",
    }
    assert after["model"] == before["model"] and after["onnx"] == before["onnx"]  # the graphs' stamps still match
    tuned = SearchSettings.of(ModelFolder.open(folder), beam_size=2)
    assert tuned == SearchSettings(beam_size=2, length_penalty=best)
    assert TranslationService(device="cpu").model(str(folder)).search.length_penalty == best

    test = ParallelCorpus(SENTENCES, SENTENCES, "en", "de", "test_2016_flickr")
    with pytest.raises(ValueError, match="on val only"):
        tune_length_penalty(ModelFolder.open(folder), translator, test, 3, [0.6, 1.2])
