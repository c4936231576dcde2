"""`aiayn prepare` and `aiayn train` on your own files: text pairs, TSV, prepared folders; bad corpora exit 2."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aiayn.cli import main

WORDS = "red blue green cat dog bird runs sleeps jumps big small old".split()
SIZES = ["vocab_size=64", "d_model=32", "n_heads=4", "d_ff=64", "n_encoder_layers=1", "n_decoder_layers=1"]


def write_pairs(folder: Path, split: str, n: int) -> tuple[Path, Path]:
    rng = random.Random(split)
    src = [" ".join(rng.sample(WORDS, rng.randint(2, 5))) for _ in range(n)]
    paths = folder / f"{split}.en", folder / f"{split}.de.gz"
    paths[0].write_text("".join(f"{s}\n" for s in src), encoding="utf-8")
    paths[1].write_bytes(gzip.compress("".join(f"{' '.join(reversed(s.split()))}\n" for s in src).encode()))
    return paths


def tiny_training(out: Path) -> list[str]:
    flags = ["--out", str(out), "--epochs", "1", "--max-tokens", "256", "--device", "cpu", "--warmup", "10"]
    for size in SIZES:
        flags += ["--set", size]
    return flags


def test_prepare_then_train_on_the_prepared_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train, valid = write_pairs(tmp_path, "train", 120), write_pairs(tmp_path, "val", 10)
    prepared = tmp_path / "prepared"
    args = ["--train-files", *map(str, train), "--valid-files", *map(str, valid), "--vocab-size", "64"]
    assert main(["prepare", *args, "--out", str(prepared)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["train"]["kept"] == 120 and "pairs/s" in err
    assert main(["train", "--prepared", str(prepared), *tiny_training(tmp_path / "model")]) == 0
    record = json.loads((tmp_path / "model" / "training.json").read_text())
    assert record["data"]["sources"]["train"]["files"][1]["path"] == str(train[1])
    config = json.loads((tmp_path / "model" / "config.json").read_text())["model"]
    assert (config["src_lang"], config["tgt_lang"]) == ("en", "de")  # from the file names


def test_train_on_a_tsv_prepares_into_the_model_folder(tmp_path: Path) -> None:
    rng = random.Random(0)
    for split, n in (("train", 100), ("valid", 10)):
        rows = [" ".join(rng.sample(WORDS, 3)) for _ in range(n)]
        (tmp_path / f"{split}.en-de.tsv").write_text("".join(f"{r}\t{r.upper()}\n" for r in rows), encoding="utf-8")
    flags = ["--train-tsv", str(tmp_path / "train.en-de.tsv"), "--valid-tsv", str(tmp_path / "valid.en-de.tsv")]
    assert main(["train", *flags, *tiny_training(tmp_path / "model")]) == 0
    assert (tmp_path / "model" / "data" / "train.src.bin").is_file()
    assert json.loads((tmp_path / "model" / "training.json").read_text())["data"]["sources"]["train"]["kind"] == "tsv"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: ["--train-files", *map(str, write_pairs(d, "train", 5))], "--train-files needs --valid-files"),
        (
            lambda d: [
                "--train-files",
                str(write_pairs(d, "train", 5)[0]),
                str(write_pairs(d, "short", 4)[1]),
                "--valid-files",
                *map(str, write_pairs(d, "val", 3)),
            ],
            "train.en has 5 lines but",
        ),
        (lambda d: ["--src", "en", "--tgt", "en"], "--src and --tgt must differ"),
        (lambda d: ["--train-tsv", "a.tsv", "--hf", "x"], "give one corpus, not --train-tsv and --hf"),
    ],
)
def test_bad_corpora_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, message: str
) -> None:
    code = main(["train", *make(tmp_path), "--out", str(tmp_path / "m")])  # type: ignore[operator]
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("aiayn train: error: ") and message in err and "Traceback" not in err


def test_a_run_ends_with_a_summary_and_resumes_from_its_folder_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train, valid = write_pairs(tmp_path, "train", 120), write_pairs(tmp_path, "val", 10)
    out = tmp_path / "model"
    corpus = ["--train-files", *map(str, train), "--valid-files", *map(str, valid)]
    flags = [*tiny_training(out), "--max-steps", "3"]
    flags.remove("--epochs"), flags.remove("1")
    assert main(["train", *corpus, *flags]) == 0
    err = "".join(capsys.readouterr())  # the trainer's notes on stdout, the summary on stderr
    assert "small corpus" in err and "stopped after 3 steps" in err and "--max-steps was reached" in err
    assert "best validation BLEU" in err and "at step 3" in err
    # training.json holds the command: --resume alone goes on with its corpus and flags, and a flag given now wins.
    assert main(["train", "--out", str(out), "--resume", "--max-steps", "5"]) == 0
    err = "".join(capsys.readouterr())
    assert "resuming from step 3" in err and "stopped after 5 steps" in err
    record = json.loads((out / "training.json").read_text())
    assert record["steps"] == 5 and record["options"]["max_tokens"] == 256  # the first command's --max-tokens


def test_resume_of_a_folder_without_a_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--out", str(tmp_path / "nothing"), "--resume"]) == 2
    assert "no run to resume" in capsys.readouterr().err


def checkpoint_step(path: Path) -> tuple[int, int] | None:
    """(step, epochs finished) of a run's last.pt, or None before its first save."""
    import torch

    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True)  # written to a new name, then renamed: never half a file
    return int(state["step"]), int(state["epoch"])


def test_a_run_killed_between_checkpoints_resumes_from_its_folder_losing_only_the_steps_since(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    train, valid = write_pairs(tmp_path, "train", 600), write_pairs(tmp_path, "val", 10)
    corpus = ["--train-files", *map(str, train), "--valid-files", *map(str, valid)]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["train", *corpus, *tiny_training(straight), "--max-tokens", "128"]) == 0  # one epoch, small batches
    steps = json.loads((straight / "training.json").read_text())["steps"]
    every = 4
    assert steps > 4 * every, steps  # the kill falls well inside the one epoch
    command = [sys.executable, "-m", "aiayn.cli", "train", *corpus, *tiny_training(killed), "--max-tokens", "128"]
    command += ["--checkpoint-every", str(every)]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    last = killed / "checkpoints" / "last.pt"
    seen = None
    try:
        deadline = time.monotonic() + 120
        while (seen is None or seen[0] < 2 * every) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            seen = checkpoint_step(last)
    finally:
        os.kill(run.pid, signal.SIGKILL)  # no handler, no last save: the run stops as a power cut would stop it
        run.wait()
    assert run.returncode == -signal.SIGKILL, "the run ended before it was killed"
    step, epochs = checkpoint_step(last) or (0, 0)
    # Saved every 4 steps mid-epoch: the kill loses at most the 3 steps since the last save, not the epoch.
    assert seen is not None and seen[0] >= 2 * every and step % every == 0 and epochs == 0 and step < steps
    capsys.readouterr()
    assert main(["train", "--out", str(killed), "--resume"]) == 0
    assert f"resuming from step {step} (epoch 1)" in "".join(capsys.readouterr())
    a, b = (torch.load(out / "checkpoints" / "last.pt", weights_only=True) for out in (straight, killed))
    assert a["step"] == b["step"] == steps
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def corpus_flags(folder: Path, pairs: int = 40) -> list[str]:
    train, valid = write_pairs(folder, "train", pairs), write_pairs(folder, "val", 6)
    return ["--train-files", *map(str, train), "--valid-files", *map(str, valid)]


def refused_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_prepare_refuses_a_folder_it_did_not_write_and_leaves_it_byte_for_byte(
    tmp_path: Path, tiny_folder: Path, capsys: pytest.CaptureFixture[str], folder_bytes: Any
) -> None:
    corpus = corpus_flags(tmp_path)
    home = tmp_path / "home"
    shutil.copytree(tiny_folder, home / "model")  # a model folder, and a note of the user's beside it
    (home / "notes.txt").write_text("mine", encoding="utf-8")
    before = folder_bytes(home)
    assert main(["prepare", *corpus, "--vocab-size", "64", "--out", str(home)]) == 2
    err = refused_line(capsys)
    assert f"{home} holds notes.txt, which aiayn prepare did not write" in err and "--overwrite" in err
    assert folder_bytes(home) == before
    # --overwrite never deletes the corpus it reads (nor the current or home folder)
    assert main(["prepare", *corpus, "--vocab-size", "64", "--out", str(tmp_path), "--overwrite"]) == 2
    assert "--overwrite would delete" in refused_line(capsys) and (tmp_path / "train.en").is_file()
    assert main(["prepare", *corpus, "--out", str(home / "notes.txt" / "prepared")]) == 2  # under a file
    assert "File exists" in refused_line(capsys) and folder_bytes(home) == before


def test_prepare_replaces_its_own_output_whole_and_a_failed_run_leaves_it_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], folder_bytes: Any
) -> None:
    corpus, out = corpus_flags(tmp_path), tmp_path / "prepared"
    assert main(["prepare", *corpus, "--vocab-size", "64", "--out", str(out)]) == 0
    assert main(["prepare", *corpus, "--vocab-size", "70", "--out", str(out)]) == 0  # its own: replaced
    assert json.loads((out / "prepared.json").read_text())["settings"]["vocab_size"] == 70
    capsys.readouterr()
    before = folder_bytes(out)
    # no pair fits 2 tokens: the run fails after the tokenizer was trained, and the old folder stays whole
    assert main(["prepare", *corpus, "--vocab-size", "64", "--max-length", "2", "--out", str(out)]) == 2
    assert "none of the 40 train pairs fits" in refused_line(capsys)
    assert folder_bytes(out) == before and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    assert main(["prepare", *corpus, "--vocab-size", "64", "--out", str(out)]) == 2
    assert "holds notes.txt, which aiayn prepare did not write" in refused_line(capsys)
    assert folder_bytes(out) == {**before, "notes.txt": folder_bytes(out)["notes.txt"]}
    assert main(["prepare", *corpus, "--vocab-size", "64", "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"  # --overwrite replaces its own files only


def test_train_refuses_a_model_folder_it_did_not_start_and_leaves_it_byte_for_byte(
    tmp_path: Path, tiny_folder: Path, capsys: pytest.CaptureFixture[str], folder_bytes: Any
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_folder, model)  # a bundled or imported folder: config.json, tokenizer.json, weights
    before = folder_bytes(model)
    assert main(["train", *corpus_flags(tmp_path), *tiny_training(model)]) == 2
    err = refused_line(capsys)
    assert f"{model} holds config.json, which aiayn train did not write; choose another --out" in err
    assert folder_bytes(model) == before


def test_a_run_killed_before_its_first_checkpoint_starts_again_in_its_own_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiayn.train.loop import Trainer

    corpus, model = corpus_flags(tmp_path), tmp_path / "model"

    def killed(self: Trainer) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "run", killed)
        assert main(["train", *corpus, *tiny_training(model)]) == 2
    assert "training interrupted" in capsys.readouterr().err
    assert (model / "config.json").is_file() and not (model / "checkpoints" / "last.pt").exists()
    assert main(["train", *corpus, *tiny_training(model)]) == 0  # the same command, in its own folder
    capsys.readouterr()
    assert main(["train", *corpus, *tiny_training(model)]) == 2  # a run is there now: --resume goes on with it
    assert "already holds a training run; pass --resume" in refused_line(capsys)
