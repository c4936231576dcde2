"""Translations the model itself is unsure of are named, as short ones are: the threshold on the mean
log-probability per token is set on val, kept in config.json, and flags most out-of-domain lines
(``out_of_domain.tsv``: names, numbers, dates, other languages, technical prose; English TAB German) and few
captions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aiayn.core.folder import CONFIDENCE_SECTION, ModelFolder
from aiayn.data.multi30k import load_parallel
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.options import EngineOptions
from aiayn.evaluation.confidence import FLAGGED_SHARE, WORD_MARKED_SHARE, calibrate_confidence
from aiayn.search.output import Output
from aiayn.search.translator import SearchSettings
from aiayn.serve.service import LoadedModel, Prepared, Result, TranslationService

OUT_OF_DOMAIN = [line.split("\t") for line in (Path(__file__).parent / "out_of_domain.tsv").read_text().splitlines()]
COLUMN = {"en-de": 0, "de-en": 1}


def test_a_line_the_model_is_unsure_of_is_named_on_the_page_and_the_cli(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from aiayn.cli import main
    from aiayn.serve.status import status_line

    text = "Two dogs play in the snow.\nJohn and Mary visit Berlin."
    result = TranslationService().translate(text, str(bundled["en-de"]))
    assert result.unsure_lines == [1] and result.short_lines == []
    assert "line(s) 2: the model is unsure of this translation" in status_line(result)
    assert main(["translate", "--model", str(bundled["en-de"]), text]) == 0
    err = capsys.readouterr().err
    assert "line(s) 2: the model is unsure of this translation" in err and "line(s) 1" not in err
    assert "unsure" not in status_line(Result("", "CPU", 1.0, 1, [], 0, [], [], [], []))


def test_a_sentence_is_judged_on_all_its_pieces_and_a_line_on_each_sentence(bundled: dict[str, Path]) -> None:
    model = TranslationService().model(str(bundled["en-de"]))
    prepared = model.prepare("A dog runs. A cat sleeps.\nA bird sings.")
    assert prepared.sentence_of == [0, 1, 2]
    sure, unsure = Output([5, 6, 7], -0.3, True, [-0.1] * 3), Output([5, 6, 7], -4.0, True, [-1.0] * 3)

    def unsure_lines(prepared: Prepared, outputs: list[Output], threshold: float | None) -> list[int]:
        model.min_mean_log_prob = threshold
        return model.assemble(prepared, outputs, 1.0).unsure_lines

    assert unsure_lines(prepared, [sure, sure, sure], -0.5) == []
    assert unsure_lines(prepared, [sure, unsure, sure], -0.5) == [0]  # one sentence of the line is enough
    assert unsure_lines(prepared, [sure, sure, unsure], -0.5) == [1]
    assert unsure_lines(prepared, [unsure, unsure, unsure], None) == []  # a folder without a threshold


@pytest.mark.parametrize("name", ["en-de", "de-en"])
def test_most_out_of_domain_lines_are_flagged_and_few_captions(
    bundled: dict[str, Path], multi30k_dir: Path, name: str
) -> None:
    model = TranslationService().model(str(bundled[name]))
    assert model.min_mean_log_prob is not None and model.min_mean_log_prob < 0
    lines = [pair[COLUMN[name]] for pair in OUT_OF_DOMAIN]
    assert len(lines) == 50
    out_of_domain = model.run(model.prepare(lines), 4)
    flagged = out_of_domain.unsure_lines
    assert len(flagged) >= 45, [lines[i] for i in set(range(50)) - set(flagged)]
    captions = load_parallel("val", model.config.src_lang, model.config.tgt_lang, multi30k_dir).src
    in_domain = model.run(model.prepare(captions), 4)
    assert len(in_domain.unsure_lines) <= 0.04 * len(captions)
    # Words: a marked word in most out-of-domain lines and in few captions (the word threshold is set on val; with
    # fairseq's finishing rule and |Y|^α, 32 of de-en's 50, evaluation/confidence.py).
    assert sum(bool(line.unsure_words) for line in out_of_domain.lines) >= 30
    assert sum(bool(line.unsure_words) for line in in_domain.lines) <= 0.10 * len(captions)


def test_calibration_keeps_the_threshold_that_flags_its_share_of_val(tiny_folder: Path, tmp_path: Path) -> None:
    path = Path(shutil.copytree(tiny_folder, tmp_path / "tiny"))
    folder = ModelFolder.open(path)
    translator = translator_for(folder, load_engine(folder, EngineOptions("onnx", "cpu")))
    words = "the red cat sleeps on old chair a small dog runs after two blue birds".split()
    sources = [translator.source_ids(" ".join(words[i : i + 1 + i % 5])) for i in range(len(words))] * 3
    settings = SearchSettings.of(folder, beam_size=1, max_extra_len=5)
    section = calibrate_confidence(folder, translator, sources, settings, "val")
    reopened = ModelFolder.open(path)
    assert reopened.section(CONFIDENCE_SECTION) == section and section["sentences"] == len(sources)
    means = sorted(o.log_prob / o.scored_tokens for o in translator.outputs(sources, settings))
    threshold = reopened.min_mean_log_prob()
    assert threshold is not None and means[0] - 1e-4 <= threshold <= means[-1]  # a quantile, rounded down
    assert section["flagged_share_on_val"] == pytest.approx(sum(m < threshold for m in means) / len(means), abs=1e-4)
    assert section["flagged_share_on_val"] <= FLAGGED_SHARE
    assert section["word_marked_share_on_val"] <= WORD_MARKED_SHARE + 1 / len(sources)  # a quantile, interpolated
    assert section["min_word_log_prob"] < 0
    loaded = LoadedModel(reopened, load_engine(reopened, EngineOptions("onnx", "cpu")))
    assert loaded.min_mean_log_prob == threshold and loaded.min_word_log_prob == section["min_word_log_prob"]
    with pytest.raises(ValueError, match="needs validation sentences"):
        calibrate_confidence(folder, translator, [], settings, "val")


def test_eval_calibrates_a_folder_on_val_only(
    bundled: dict[str, Path], multi30k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiayn.cli import main

    path = Path(shutil.copytree(bundled["en-de"], tmp_path / "en-de", ignore=shutil.ignore_patterns("*.int8.onnx")))
    command = ["eval", "--model", str(path), "--engine", "onnx", "--limit", "40", "--calibrate-confidence"]
    assert main([*command, "--split", "test_2016_flickr"]) == 2
    assert "calibrate on val only" in capsys.readouterr().err
    assert main([*command, "--split", "val"]) == 0
    section = ModelFolder.open(path).section(CONFIDENCE_SECTION)
    assert section["sentences"] == 40 and section["calibrated_on"] == "val" and section["beam_size"] == 4
    assert f"unsure below a mean log-probability of {section['min_mean_log_prob']}" in capsys.readouterr().out
