"""Training proves learning on a synthetic task, writes a loadable folder, and resumes exactly after a kill."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from aiayn.core.folder import (
    CHECKPOINT_DIR,
    CONFIDENCE_SECTION,
    TOKENIZER_FILE,
    TRAINING_PLOT_FILE,
    TRAINING_RECORD_FILE,
    ModelFolder,
)
from aiayn.core.normalizer import is_tidy
from aiayn.core.tokenizer import SubwordTokenizer
from aiayn.data.multi30k import ParallelCorpus
from aiayn.engines.pytorch import TorchEngine
from aiayn.model.weights import load_model
from aiayn.search.translator import SearchSettings, Translator
from aiayn.train.checkpoint import average_state_dicts
from aiayn.train.corpus import clauses_section
from aiayn.train.loop import train
from aiayn.train.options import TrainOptions, cooled, fitted_schedule, learning_rate, with_schedule

WORDS = "red blue green cat dog bird runs sleeps jumps big small old".split()
# A model small enough to learn in seconds on 2 CPU cores.
TINY = {
    "vocab_size": 64,
    "d_model": 64,
    "n_heads": 4,
    "d_ff": 128,
    "n_encoder_layers": 2,
    "n_decoder_layers": 2,
    "dropout": 0.0,
}


def reverse_corpus(n: int, seed: int, split: str) -> ParallelCorpus:
    """Sentences of distinct invented words and their word-reversed copies."""
    rng = random.Random(seed)
    src = [" ".join(rng.sample(WORDS, rng.randint(2, 5))) for _ in range(n)]
    return ParallelCorpus(
        src=src, tgt=[" ".join(reversed(s.split())) for s in src], src_lang="en", tgt_lang="de", split=split
    )


def options(out: Path, **changes: object) -> TrainOptions:
    base = TrainOptions(
        out=out,
        overrides=dict(TINY),
        epochs=20,
        max_tokens=512,
        lr_scale=0.3,
        warmup_steps=100,
        cooldown=0.0,  # eq. 3 to the end, which the schedule tests compute
        label_smoothing=0.0,
        seed=3,
        device="cpu",
        checkpoint_every=7,
    )
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def test_learning_rate_follows_equation_3() -> None:
    assert learning_rate(100, 512, 4000, 1.0) == pytest.approx(512**-0.5 * 100 * 4000**-1.5)
    assert learning_rate(4000, 512, 4000, 1.0) == pytest.approx(512**-0.5 * 4000**-0.5)
    assert learning_rate(16000, 512, 4000, 2.0) == pytest.approx(2 * 512**-0.5 * 16000**-0.5)


def test_sentences_over_the_90th_percentile_of_the_training_sources_are_split_into_clauses() -> None:
    assert clauses_section(list(range(1, 101)))["split_over_tokens"] == 90


def test_tiny_model_learns_to_reverse_and_writes_a_loadable_folder(tmp_path: Path) -> None:
    # Its time (about 30 s idle) is the proof: a real run of 30 epochs, until the tiny model reverses every
    # held-out sentence exactly, where a looser check would pass a model that learned little.
    folder = train(options(tmp_path / "m", epochs=30), reverse_corpus(3000, 0, "train"), reverse_corpus(60, 1, "val"))
    for name in ("config.json", TOKENIZER_FILE, "model.safetensors", TRAINING_RECORD_FILE, TRAINING_PLOT_FILE):
        assert (folder / name).is_file(), name
    record = json.loads((folder / TRAINING_RECORD_FILE).read_text())
    assert record["seed"] == 3 and record["steps"] > 0 and len(record["epochs"]) == 30
    written = ModelFolder.open(folder)  # the tokenizer carries the text contract; long sentences get a limit
    assert is_tidy(written.tokenizer.tokenizer) and written.clause_limit() is not None
    test = reverse_corpus(40, 2, "test")
    translator = Translator(TorchEngine(load_model(folder)), SubwordTokenizer.load(folder / TOKENIZER_FILE), 256)
    out = translator.translate(test.src, SearchSettings(beam_size=1))
    assert out == test.tgt


def test_killed_run_resumes_at_the_right_step_with_identical_weights(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(300, 0, "train"), reverse_corpus(20, 1, "val")
    straight = train(options(tmp_path / "straight", epochs=3), train_data, val)
    # "Kill" after 10 steps (mid-epoch), then resume to the end.
    killed = tmp_path / "killed"
    train(options(killed, epochs=3, max_steps=10), train_data, val)
    assert torch.load(killed / CHECKPOINT_DIR / "last.pt", weights_only=True)["step"] == 10
    with pytest.raises(FileExistsError, match="--resume"):
        train(options(killed, epochs=3), train_data, val)
    train(options(killed, epochs=3, resume=True), train_data, val)
    a = torch.load(straight / CHECKPOINT_DIR / "last.pt", weights_only=True)
    b = torch.load(killed / CHECKPOINT_DIR / "last.pt", weights_only=True)
    assert a["step"] == b["step"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    whole_epochs = [[e["train_loss"] for e in state["history"] if not e.get("partial")] for state in (a, b)]
    assert whole_epochs[0] == pytest.approx(whole_epochs[1])


def test_checkpoint_averaging_is_the_mean(tmp_path: Path) -> None:
    paths = []
    for i, value in enumerate((1.0, 2.0, 6.0)):
        path = tmp_path / f"epoch{i}.pt"
        torch.save({"model": {"w": torch.full((2,), value)}}, path)
        paths.append(path)
    assert torch.equal(average_state_dicts(paths)["w"], torch.full((2,), 3.0))


def test_init_from_continues_a_model_folder_where_its_schedule_left_off(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(300, 0, "train"), reverse_corpus(20, 1, "val")
    parent = train(options(tmp_path / "parent", epochs=2), train_data, val)
    parent_steps = json.loads((parent / TRAINING_RECORD_FILE).read_text())["steps"]

    # With a zero learning rate one step changes nothing: the child starts from the parent's weights.
    frozen = train(
        options(tmp_path / "frozen", init_from=parent, overrides={}, lr_scale=0.0, max_steps=1), train_data, val
    )
    start = torch.load(frozen / CHECKPOINT_DIR / "last.pt", weights_only=True)["model"]
    for name, tensor in load_model(parent).state_dict().items():
        assert torch.equal(start[name], tensor), name

    child = train(options(tmp_path / "child", init_from=parent, epochs=1, overrides={"dropout": 0.1}), train_data, val)
    assert (child / TOKENIZER_FILE).read_text() == (parent / TOKENIZER_FILE).read_text()
    state = torch.load(child / CHECKPOINT_DIR / "last.pt", weights_only=True)
    steps = state["step"]
    want_lr = learning_rate(parent_steps + steps, TINY["d_model"], 100, 0.3)  # eq. 3 goes on, no new warm-up
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(want_lr)
    record = json.loads((child / TRAINING_RECORD_FILE).read_text())
    assert record["parent"]["schedule_steps"] == parent_steps and record["parent"]["commands"]
    assert record["schedule_steps"] == parent_steps + steps
    assert json.loads((child / "config.json").read_text())["model"]["dropout"] == 0.1

    # A continued run continued again: eq. 3 stands after the parent's and the child's steps.
    grandchild = train(options(tmp_path / "grandchild", init_from=child, overrides={}, max_steps=1), train_data, val)
    lr = torch.load(grandchild / CHECKPOINT_DIR / "last.pt", weights_only=True)["optimizer"]["param_groups"][0]["lr"]
    assert lr == pytest.approx(learning_rate(parent_steps + steps + 1, TINY["d_model"], 100, 0.3))


def test_a_continued_run_keeps_its_parents_schedule_through_a_kill_and_resume(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(100, 0, "train"), reverse_corpus(10, 1, "val")
    parent = train(options(tmp_path / "parent", epochs=1), train_data, val)  # lr scale 0.3, warm-up 100
    parent_steps = json.loads((parent / TRAINING_RECORD_FILE).read_text())["steps"]
    unset = {"init_from": parent, "overrides": {}, "lr_scale": None, "warmup_steps": None}
    killed = train(options(tmp_path / "child", epochs=5, max_steps=3, **unset), train_data, val)
    # The same command plus --resume: the run in --out goes on, on the parent's schedule.
    resumed = train(options(killed, epochs=5, max_steps=5, resume=True, **unset), train_data, val)
    state = torch.load(resumed / CHECKPOINT_DIR / "last.pt", weights_only=True)
    assert state["step"] == 5 and state["options"]["lr_scale"] == 0.3 and state["options"]["warmup_steps"] == 100
    want_lr = learning_rate(parent_steps + 5, TINY["d_model"], 100, 0.3)
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(want_lr)


def test_a_new_run_without_schedule_settings_takes_its_presets_and_cools_down() -> None:
    unset = TrainOptions(out=Path("unused"))  # the tiny preset: 2.5× eq. 3's rate
    new = with_schedule(unset, {})
    assert (new.lr_scale, new.warmup_steps, new.cooldown) == (2.5, 4000, 0.2)
    base = with_schedule(TrainOptions(out=Path("unused"), preset="base"), {})
    assert (base.lr_scale, base.warmup_steps, base.cooldown) == (1.0, 4000, 0.2)  # the paper's eq. 3
    imported = with_schedule(TrainOptions(out=Path("unused"), init_from=Path("opus")), {})  # no record
    assert imported.lr_scale == 1.0
    continued = with_schedule(unset, {"lr_scale": 0.5, "warmup_steps": 8000})  # recorded before the cool-down
    assert (continued.lr_scale, continued.warmup_steps, continued.cooldown) == (0.5, 8000, 0.0)
    assert with_schedule(unset, {"lr_scale": 2.5, "cooldown": 0.3}).cooldown == 0.3  # a run goes on as it began
    given = TrainOptions(out=Path("unused"), lr_scale=0.0, warmup_steps=10)
    assert with_schedule(given, {"lr_scale": 2.5, "warmup_steps": 8000}).lr_scale == 0.0  # given wins, even 0


def test_init_from_refuses_another_pair_or_architecture(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(100, 0, "train"), reverse_corpus(10, 1, "val")
    parent = train(options(tmp_path / "parent", epochs=1), train_data, val)
    other_pair = ParallelCorpus(train_data.src, train_data.tgt, "en", "fr", "train")
    with pytest.raises(ValueError, match="translates en->de"):
        train(options(tmp_path / "a", init_from=parent, overrides={}), other_pair, val)
    with pytest.raises(ValueError, match="d_model cannot change"):
        train(options(tmp_path / "b", init_from=parent, overrides={"d_model": 32}), train_data, val)
    shutil.rmtree(parent / CHECKPOINT_DIR)  # as in a bundled folder: nothing to --resume there
    with pytest.raises(ValueError, match="the --init-from folder itself"):
        train(options(parent, init_from=parent, overrides={}), train_data, val)


def test_a_resumed_run_is_recorded_before_its_first_epoch_ends(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(100, 0, "train"), reverse_corpus(10, 1, "val")
    out = tmp_path / "m"
    train(options(out, max_steps=1, command="aiayn train --out m"), train_data, val)
    train(options(out, max_steps=2, resume=True, command="aiayn train --out m --resume"), train_data, val)
    record = json.loads((out / TRAINING_RECORD_FILE).read_text())  # both runs stopped mid-epoch
    assert record["commands"] == ["aiayn train --out m", "aiayn train --out m --resume"] and record["steps"] == 2


def test_a_damaged_last_checkpoint_says_what_can_be_done_instead(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(100, 0, "train"), reverse_corpus(10, 1, "val")
    out = train(options(tmp_path / "m", max_steps=1), train_data, val)
    (out / CHECKPOINT_DIR / "last.pt").write_bytes(b"cut short")
    with pytest.raises(ValueError, match="cannot be read") as err:
        train(options(out, resume=True), train_data, val)
    assert f"delete {out / CHECKPOINT_DIR / 'last.pt'} and run the command again without --resume" in str(err.value)
    assert f"--init-from {out} --out NEW_DIR" in str(err.value) and "resume from another" not in str(err.value)


def test_a_warm_up_longer_than_the_run_is_fitted_to_it_with_the_same_peak() -> None:
    fitted = fitted_schedule(planned_steps=171, warmup_steps=4000, lr_scale=1.0)
    assert fitted is not None and fitted["warmup_steps"] == 42 and fitted["planned_steps"] == 171
    peak = learning_rate(4000, 128, 4000, 1.0)
    assert learning_rate(42, 128, fitted["warmup_steps"], fitted["lr_scale"]) == pytest.approx(peak)
    assert learning_rate(171, 128, fitted["warmup_steps"], fitted["lr_scale"]) < peak  # and it decays within the run
    assert fitted_schedule(planned_steps=100_000, warmup_steps=4000, lr_scale=1.0) is None


def test_the_cool_down_takes_the_rate_linearly_to_zero_over_the_runs_last_share() -> None:
    # Eq. 3's rate until the last fifth, then a straight line down to zero.
    assert cooled(1e-3, 0.5, 0.2) == 1e-3 and cooled(1e-3, 0.8, 0.2) == pytest.approx(1e-3)
    assert cooled(1e-3, 0.9, 0.2) == pytest.approx(0.5e-3) and cooled(1e-3, 1.3, 0.2) == 0.0
    assert cooled(1e-3, 0.99, 0.0) == 1e-3  # 0: the paper's eq. 3 to the end


def test_a_run_cools_down_over_its_last_steps(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(100, 0, "train"), reverse_corpus(10, 1, "val")
    out = train(options(tmp_path / "m", max_steps=10, cooldown=0.5), train_data, val)
    lr = torch.load(out / CHECKPOINT_DIR / "last.pt", weights_only=True)["optimizer"]["param_groups"][0]["lr"]
    # The 10th update, 9 of 10 made before it: a fifth of the way from eq. 3's rate down to zero is left.
    assert lr == pytest.approx(learning_rate(10, TINY["d_model"], 100, 0.3) * 0.2)


def test_a_time_limited_run_cools_down_before_its_limit(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(300, 0, "train"), reverse_corpus(20, 1, "val")
    limited = options(tmp_path / "m", epochs=None, time_limit_minutes=0.08, warmup_steps=None, cooldown=1.0)
    out = train(limited, train_data, val)
    record = json.loads((out / TRAINING_RECORD_FILE).read_text())
    fitted = record["fitted_schedule"]
    eq3 = learning_rate(record["steps"], TINY["d_model"], fitted["warmup_steps"], fitted["lr_scale"])
    lr = torch.load(out / CHECKPOINT_DIR / "last.pt", weights_only=True)["optimizer"]["param_groups"][0]["lr"]
    # The cool-down spans the whole run and is counted in its time (no step bounds it): the last update came
    # after most of the limit was spent (an epoch's validation may have ended it earlier), so well below eq. 3.
    assert 0.0 < lr < 0.9 * eq3


def test_max_steps_makes_that_many_steps_and_keeps_the_weights_where_it_stops(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(300, 0, "train"), reverse_corpus(20, 1, "val")
    out = train(options(tmp_path / "m", epochs=None, max_steps=23, warmup_steps=None), train_data, val)
    record = json.loads((out / TRAINING_RECORD_FILE).read_text())
    assert record["steps"] == 23 and record["stopped_by"] == "max-steps"
    last = record["epochs"][-1]
    assert last["step"] == 23 and last["partial"] and last["cpu_minutes"] > 0
    assert record["fitted_schedule"]["warmup_steps"] == 5  # a quarter of the 23 planned steps, not 4000
    assert (out / "model.safetensors").is_file()
    # A new run on the user's own pairs keeps some of them, so the folder can be checked without the corpus.
    assert ModelFolder.open(out).validation_sample()[:2] == list(zip(val.src, val.tgt, strict=True))[:2]
    # The weights kept get their unsure-translation threshold, set on the run's 20 validation pairs.
    assert ModelFolder.open(out).section(CONFIDENCE_SECTION)["sentences"] == 20


def test_a_time_limited_run_plans_its_warm_up_from_its_pace(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(300, 0, "train"), reverse_corpus(20, 1, "val")
    out = train(options(tmp_path / "m", epochs=None, time_limit_minutes=0.08, warmup_steps=None), train_data, val)
    record = json.loads((out / TRAINING_RECORD_FILE).read_text())
    # A loaded 2-core machine once made 29 steps in 3 s (the old limit): 10 are enough to plan from.
    assert record["stopped_by"] == "time limit" and record["steps"] >= 10
    assert record["epochs"][-1]["step"] == record["steps"]  # validated (and kept) where the limit stopped it
    fitted = record["fitted_schedule"]
    assert fitted["warmup_steps"] == max(1, int(fitted["planned_steps"] * 0.25)) < 4000


def test_a_chosen_warm_up_is_never_fitted_but_warned_of(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_data, val = reverse_corpus(100, 0, "train"), reverse_corpus(10, 1, "val")
    out = train(options(tmp_path / "m", max_steps=3), train_data, val)  # warm-up 100, given
    assert not json.loads((out / TRAINING_RECORD_FILE).read_text())["fitted_schedule"]
    assert "the warm-up (100 steps, as chosen) is longer than this run's ~3 steps" in capsys.readouterr().out


def test_resume_without_a_run_says_so(tmp_path: Path) -> None:
    train_data, val = reverse_corpus(100, 0, "train"), reverse_corpus(10, 1, "val")
    with pytest.raises(FileNotFoundError, match="no run to resume in .*start it without --resume"):
        train(options(tmp_path / "m", resume=True), train_data, val)
