"""`aiayn train --init-from` an imported (Marian-like) folder: its tokenizer files kept byte for byte, targets
encoded by the target side's own tokenizer, <pad> fed as the start token; the new folder learns, exports and
translates."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, normalizers

from aiayn.cli import main
from aiayn.core.folder import SEARCH_SECTION, TRAINING_RECORD_FILE, ModelFolder
from aiayn.core.tokenizer import TARGET_TOKENIZER_FILE, TOKENIZER_FILE
from aiayn.data.prepare import PreparedData
from aiayn.engines.load import load_engine, translator_for
from aiayn.engines.options import EngineOptions
from aiayn.search.translator import SearchSettings
from aiayn.train.start import continued_search

# Words of the fixture's word-level vocabulary (tests/conftest.py's invented sentences), all lower case.
WORDS = "the red cat sleeps on old a small dog runs after two blue birds three children play near green".split()


# The task: each word "translated" as the next one of WORDS.
TRANSLATION = dict(zip(WORDS, WORDS[1:] + WORDS[:1], strict=True))


def translated(sentence: str) -> str:
    return " ".join(TRANSLATION[word] for word in sentence.split())


def write_pairs(folder: Path, split: str, n: int, shout: bool) -> list[str]:
    """``split``.en and ``split``.de: invented sentences and their translations (in capitals where ``shout``,
    which only the target side's lower-casing tokenizer reads); returns the paths."""
    rng = random.Random(split)
    src = [" ".join(rng.sample(WORDS, rng.randint(2, 5))) for _ in range(n)]
    tgt = [translated(s) for s in src]
    paths = folder / f"{split}.en", folder / f"{split}.de"
    paths[0].write_text("".join(f"{s}\n" for s in src), encoding="utf-8")
    paths[1].write_text("".join(f"{t.upper() if shout else t}\n" for t in tgt), encoding="utf-8")
    return [str(p) for p in paths]


def parent_folder(marian_like_folder: Path, tmp_path: Path, target_side: bool) -> Path:
    """The fixture's folder, or a copy of it whose target side lower-cases first (same vocabulary, another
    normalizer); both files written compact, as no `tokenizers` save would, so a re-serialisation would show."""
    if not target_side:
        return marian_like_folder
    parent = Path(shutil.copytree(marian_like_folder, tmp_path / "imported"))
    source = Tokenizer.from_file(str(parent / TOKENIZER_FILE))
    (parent / TOKENIZER_FILE).write_text(source.to_str(), encoding="utf-8")
    source.normalizer = normalizers.Lowercase()
    (parent / TARGET_TOKENIZER_FILE).write_text(source.to_str(), encoding="utf-8")
    return parent


@pytest.mark.parametrize("target_side", [False, True], ids=["one-tokenizer", "target-tokenizer"])
def test_an_imported_folder_is_fine_tuned_and_its_tokenizers_kept(
    marian_like_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target_side: bool,
) -> None:
    parent = parent_folder(marian_like_folder, tmp_path, target_side)
    out = tmp_path / "fine-tuned"
    train_files = write_pairs(tmp_path, "train", 400, shout=target_side)
    valid_files = write_pairs(tmp_path, "valid", 20, shout=target_side)
    flags = ["--init-from", str(parent), "--out", str(out), "--epochs", "4", "--device", "cpu"]
    flags += ["--max-tokens", "64", "--lr-scale", "3"]  # many small steps: the random model learns in seconds
    assert main(["train", "--train-files", *train_files, "--valid-files", *valid_files, *flags]) == 0
    assert "has no training.json (an imported checkpoint)" in capsys.readouterr().out

    record = json.loads((out / TRAINING_RECORD_FILE).read_text())
    assert record["parent"]["schedule_steps"] == 0 and record["schedule_steps"] == record["steps"]  # eq. 3 anew
    val_losses = [entry["val_loss"] for entry in record["epochs"]]
    assert val_losses[-1] < 0.7 * val_losses[0], val_losses  # 2.68 → 1.31 when written
    files = [TOKENIZER_FILE, *([TARGET_TOKENIZER_FILE] if target_side else [])]
    for name in files:
        assert (out / name).read_bytes() == (parent / name).read_bytes(), name
    assert not (out / TARGET_TOKENIZER_FILE).exists() or target_side

    # The targets were cut by the target side's tokenizer: the capitals of a shouted target are words, not <unk>.
    folder = ModelFolder.open(out)
    tokens = folder.config.special_tokens
    targets = PreparedData.open(folder.prepared_dir).train.tgt
    first = (tmp_path / "train.de").read_text(encoding="utf-8").splitlines()[0]
    expected = folder.tokenizer.encode_target_batch([first])[0]
    assert targets[0] == expected and tokens.unk not in expected
    if target_side:
        assert set(folder.tokenizer.encode(first)) == {tokens.unk}  # what the source side would have made of it

    # The contract's graphs and the CPU serving graphs, proven against PyTorch on the validation sample the run
    # kept (greedy and beam 4 identical).
    assert main(["export", str(out)]) == 0
    assert "greedy 20/20 identical, beam-4 20/20 identical (ONNX vs PyTorch)" in capsys.readouterr().out
    # Through the library: the CLI leaves out characters its vocabulary lacks alone, and a word-level one lacks
    # them all (SentencePiece, an imported checkpoint's, has them).
    translator = translator_for(folder, load_engine(folder, EngineOptions("onnx", "cpu")))
    for beam in (1, 4):
        [ids] = translator.translate_ids([translator.source_ids("the red cat sleeps")], SearchSettings(beam_size=beam))
        assert ids and not set(ids) & {tokens.pad, tokens.eos, tokens.unk}  # the search never chooses <pad>
        assert set(folder.tokenizer.decode(ids).split()) <= set(WORDS)


def test_a_continued_run_keeps_the_parents_decoding_defaults_but_not_what_was_tuned_for_its_weights() -> None:
    imported = {"beam_size": 6, "length_normalization": "power", "length_penalty": 1.0}
    tuned = {"length_penalty": 0.8, "tuned_on": {"split": "val"}}
    assert continued_search(ModelFolder(Path("unused"), {SEARCH_SECTION: imported})) == imported
    assert continued_search(ModelFolder(Path("unused"), {SEARCH_SECTION: {**imported, **tuned}})) == {
        "beam_size": 6,
        "length_normalization": "power",
    }
    assert continued_search(ModelFolder(Path("unused"), {SEARCH_SECTION: tuned})) == {}  # a folder trained here
    # The normalisation chosen on val too (`aiayn eval --length-normalization gnmt,power`): back to the parent's own.
    chosen = {"length_penalty": 1.4, "length_normalization": "power"}
    for before, kept in ((None, {}), ("power", {"length_normalization": "power"})):
        section = {**chosen, "tuned_on": {"split": "val", "length_normalization_before": before}}
        assert continued_search(ModelFolder(Path("unused"), {SEARCH_SECTION: section})) == kept
