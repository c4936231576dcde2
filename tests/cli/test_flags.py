"""The commands' flags: help that shows every default, choices where there are choices, options that arrive."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from aiayn.cli import build_parser, main
from aiayn.cli.args import engine_options
from aiayn.data.multi30k import ParallelCorpus
from aiayn.engines import ONNX, TORCH
from aiayn.engines.options import EngineOptions
from aiayn.train.options import TrainOptions


def subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices[name]
    return parser


def test_every_train_flag_has_help_and_shows_its_default() -> None:
    parser = subcommand("train")
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert all(a.help for a in flags), [a.dest for a in flags if not a.help]
    text = " ".join(parser.format_help().split())
    shown_defaults = ("(default: 60, or as many as", "(default: 0.1)", "(default: 500)", "(default: tiny)")
    for shown in (*shown_defaults, "(default: auto)"):
        assert shown in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_preset_is_one_of_the_presets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--src", "en", "--tgt", "de", "--out", "unused", "--preset", "huge"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --preset: invalid choice: 'huge'" in err


def test_checkpoint_every_and_cooldown_reach_the_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import aiayn.cli.train
    import aiayn.data.multi30k
    import aiayn.train.loop

    corpus = ParallelCorpus(["a dog"], ["ein Hund"], "en", "de", "train")
    runs: list[TrainOptions] = []

    def train(options: TrainOptions, *data: Any) -> Path:
        runs.append(options)
        return options.out

    monkeypatch.setattr(aiayn.data.multi30k, "load_parallel", lambda *args, **kwargs: corpus)
    monkeypatch.setattr(aiayn.train.loop, "train", train)
    monkeypatch.setattr(aiayn.cli.train, "run_summary", lambda folder: [])  # no run, so nothing to sum up
    base = ["train", "--src", "en", "--tgt", "de", "--out", str(tmp_path / "m")]
    assert main([*base, "--checkpoint-every", "7", "--cooldown", "0"]) == 0 and main(base) == 0
    assert [run.checkpoint_every for run in runs] == [7, TrainOptions.checkpoint_every]
    assert [run.cooldown for run in runs] == [0.0, None]  # None: the run's own on --resume, else 0.2
    with pytest.raises(SystemExit):
        main([*base, "--checkpoint-every", "0"])
    for outside in ("1.5", "-0.1", "half"):
        with pytest.raises(SystemExit):
            main([*base, "--cooldown", outside])


def test_bench_quick_help_says_what_the_speed_page_says() -> None:
    speed = (Path(__file__).resolve().parents[2] / "docs" / "speed.md").read_text(encoding="utf-8")
    assert "(5 rounds of 300 sentences; `--quick`: 2 rounds of 40)" in speed
    assert "2 rounds of 40 sentences; the full run: 5 of 300" in " ".join(subcommand("bench").format_help().split())


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_serve_refuses_a_port_that_is_no_port(capsys: pytest.CaptureFixture[str], port: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--port", port])
    assert exit_info.value.code == 2 and "argument --port" in capsys.readouterr().err


def doubled_defaults(parser: argparse.ArgumentParser) -> list[str]:
    """Flags whose help writes its default by hand where the help formatter adds it again."""
    shown = [a for a in parser._actions if a.help and a.default not in (None, False, []) and a.dest != "help"]
    return [(a.option_strings or [a.dest])[0] for a in shown if "default" in a.help.replace("%(default)s", "")]


@pytest.mark.parametrize("command", ["prepare", "train", "eval", "export", "translate", "serve", "bench"])
def test_help_shows_each_default_once(command: str) -> None:
    assert doubled_defaults(subcommand(command)) == []


@pytest.mark.parametrize("command", ["translate", "serve", "eval"])
def test_cores_is_the_flag_and_threads_its_earlier_name(command: str) -> None:
    """``--cores N`` sets the cores the engine runs on, in lanes of ``--threads-per-lane`` ONNX Runtime threads
    (one by default); ``--threads`` still means ``--cores``. Every command fills the one ``EngineOptions``."""
    parser = build_parser()
    assert parser.parse_args([command, "--cores", "3"]).cores == 3
    assert parser.parse_args([command, "--threads", "2"]).cores == 2
    args = parser.parse_args([command, "--cores", "4", "--threads-per-lane", "2", "--variant", "w8"])
    engine = TORCH if command == "eval" else ONNX  # eval's default where --engine is unset
    assert engine_options(args, engine) == EngineOptions(engine, "auto", "w8", lanes=2, threads=2)


def test_cores_that_do_not_make_whole_lanes_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["translate", "--cores", "3", "--threads-per-lane", "2", "Hallo"]) == 2
    error = capsys.readouterr().err.strip()
    assert "--cores 3 does not split into lanes of --threads-per-lane 2" in error and "\n" not in error
