"""The README keeps up with the code: short, its links resolve, its commands parse, and its journeys run on tiny
data where they can; the tour of the code (docs/code.md) names every module."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from aiayn.cli import build_parser, main
from aiayn.text.sentences import MAX_CHARS, MAX_FILE_CHARS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAX_LINES = 250
# The journey of training on your own pair, on files of invented sentences: a tiny model, a few steps.
TINY = ["--max-steps", "3", "--warmup", "2", "--device", "cpu", "--max-tokens", "256"]
TINY += [
    f"--set={size}" for size in ("vocab_size=80", "d_model=32", "d_ff=64", "n_encoder_layers=1", "n_decoder_layers=1")
]
WORDS_EN = "a the red small dog cat runs sleeps on grass near river".split()
WORDS_ES = "un el rojo pequeño perro gato corre duerme en hierba cerca río".split()


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def commands(text: str) -> list[list[str]]:
    """Every `aiayn ...` line of the bash blocks, continuation lines joined and comments dropped, as argv."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["aiayn"]:
                found.append(words[1:])
    return found


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= MAX_LINES


def test_every_command_parses() -> None:
    found = commands(README)
    assert {argv[0] for argv in found} >= {"translate", "serve", "import", "export", "train", "eval"}
    for argv in found:
        build_parser().parse_args(argv)  # exits (SystemExit) on an unknown flag or a bad value


def test_the_first_steps_name_python_the_address_and_the_full_install() -> None:
    start = section(README, "The two commands")
    assert "Python 3.11 or newer" in start and "http://127.0.0.1:7860" in start
    assert 'aiayn translate "Two dogs play in the snow."' in start
    for command in ("aiayn train", "aiayn export", "aiayn bench", "aiayn eval --engine torch"):
        assert f"`{command}`" in start


def test_the_bundled_journey_translates_as_its_comment_says(
    bundled: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    journey = section(README, "Journeys")
    line = next(line for line in journey.splitlines() if line.startswith('aiayn translate "'))
    command, _, expected = line.partition("#")
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out.strip() == expected.strip()


def test_the_training_journey_runs_on_tiny_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's own commands of "Train on your own pair" on invented files, each run cut to a few steps: the
    folder trained, scored, translating, published as a Space, and exported to transformers as it is (pre-LN, the
    default: Pegasus)."""
    import random

    monkeypatch.chdir(tmp_path)
    rng = random.Random(0)
    for split, n in (("train", 60), ("valid", 10), ("test", 5)):
        picks = [rng.sample(range(len(WORDS_EN)), 4) for _ in range(n)]
        for lang, words in (("en", WORDS_EN), ("es", WORDS_ES)):
            Path(f"{split}.{lang}").write_text("".join(" ".join(words[i] for i in p) + "\n" for p in picks))
    journey = section(README, "Journeys").split("### Train on your own pair")[1].split("\n### ")[0]
    ran = []
    for argv in commands(journey):
        if argv[0] == "serve" or "--resume" in argv or "--init-from" in argv:
            continue  # a page that blocks; a run that already ended; a parent that needs the Hub
        assert main(argv + TINY if argv[0] == "train" else argv) == 0, argv
        ran.append(argv[0])
    assert ran == ["train", "eval", "translate", "export", "export"]
    assert "trained on train.en + train.es (60 pairs)" in Path("space-en-es/README.md").read_text()
    assert json.loads(Path("hf-en-es/config.json").read_text())["model_type"] == "pegasus"
    capsys.readouterr()


def test_the_tour_of_the_code_names_every_module() -> None:
    tour = (ROOT / "docs" / "code.md").read_text(encoding="utf-8")
    modules = [p for p in (ROOT / "aiayn").rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert modules and [str(p.relative_to(ROOT)) for p in modules if f"`{p.name}`" not in tour] == []


def test_the_serving_page_names_both_endpoints_and_the_limits() -> None:
    serving = section((ROOT / "docs" / "serve.md").read_text(encoding="utf-8"), "The page, in short")
    assert "`translate`" in serving and "`translate_file`" in serving
    assert f"{MAX_CHARS} characters" in serving and f"{MAX_FILE_CHARS:,} characters".replace(",", " ") in serving


# Every README command that starts a server, and the test that runs it with its defaults (a free --port added;
# a folder the README imports from the Hub stood in for by a copy of a bundled one).
SERVERS = {
    "serve": "tests/serve/test_app.py::launched",  # the page on the bundled models (--device cpu: CI has no GPU)
    "serve --model models/en-de --variant w8": "tests/test_readme.py::test_the_readmes_model_servers_serve",
    "serve --model models/en-por --model models/en-pob": "tests/test_readme.py::test_the_readmes_model_servers_serve",
    "serve --ray --replicas 2": "tests/serve/test_ray.py::served",
    "serve --mcp --api-keys keys.txt": "tests/serve/test_libretranslate.py::server",  # with --device cpu, as above
    "serve --model runs/en-es": "tests/cli/test_journey.py",  # the journey's own trained folder, served
}


def test_every_readme_command_that_starts_a_server_is_run_by_a_test() -> None:
    started = {" ".join(argv) for argv in commands(README) if argv[0] == "serve"}
    assert started == set(SERVERS)
    for test in SERVERS.values():
        path, _, name = test.partition("::")
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8") if name else (ROOT / path).is_file()


@pytest.mark.parametrize("typed", [line for line in SERVERS if line.startswith("serve --model models/")])
def test_the_readmes_model_servers_serve(
    typed: str,
    bundled: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    serve_page: Callable[..., AbstractContextManager[Any]],
    models_info: Callable[[str], list[dict[str, str]]],
) -> None:
    argv = shlex.split(typed)[1:]
    folders = [Path(argv[i + 1]) for i, flag in enumerate(argv) if flag == "--model"]
    for folder, source in zip(folders, bundled.values(), strict=False):
        shutil.copytree(source, tmp_path / folder)
    monkeypatch.chdir(tmp_path)  # where the README's folders are
    with serve_page(argv, tmp_path / "serve.log") as page:
        served = models_info(page.url)
    variant = argv[argv.index("--variant") + 1] if "--variant" in argv else "fp32"
    assert [(Path(m["model"]).name, m["variant"]) for m in served] == [(folder.name, variant) for folder in folders]
