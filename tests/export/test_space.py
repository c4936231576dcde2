"""`aiayn export MODEL --to space`: a folder that is a whole Gradio Space for one model, served from a fresh virtual
environment that installs only its requirements.txt and its sdk_version Gradio, answering as `aiayn translate`."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import gradio
import pytest
import yaml
from gradio_client import Client

from aiayn.bench.web import CHROMIUM, chromium
from aiayn.cli import main
from aiayn.core.folder import ModelFolder
from aiayn.engines.options import EngineOptions
from aiayn.export.space import ImportWalk, imports

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [
    "A woman in a green coat walks her dog along the beach.",
    "Three boys kick a ball across the muddy field.",
    "An old bus waits at the corner of a quiet street.",
]


def export(model: str, out: Path, *flags: str) -> Path:
    assert main(["export", model, "--to", "space", "--out", str(out), *flags]) == 0
    return out


def front_matter(space: Path) -> dict[str, Any]:
    text = (space / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    front: dict[str, Any] = yaml.safe_load(text.split("\n---\n")[0].removeprefix("---\n"))
    return front


def torch_free_modules() -> list[str]:
    """The import-linter contract's torch-free modules (pyproject.toml)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(c["source_modules"] for c in contracts if "torch" in c.get("forbidden_modules", []))


def cli_translate(model: str, lines: list[str], beam: int, variant: str = "fp32") -> list[str]:
    command = [sys.executable, "-m", "aiayn.cli", "translate", "--model", model, "--beam", str(beam), "--device", "cpu"]
    command += ["--variant", variant]
    return subprocess.run(command, input="\n".join(lines), capture_output=True, text=True, check=True).stdout.split(
        "\n"
    )[: len(lines)]


def json_route(url: str, sentences: list[str], direction: str, beam: int) -> list[str]:
    body = json.dumps({"sentences": sentences, "direction": direction, "beam": beam}).encode()
    request = urllib.request.Request(f"{url}v1/translate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return list(json.loads(answer.read())["translations"])


def assert_answers_as_translate(
    url: str, model: str, direction: str, sentences: list[str], variant: str = "fp32"
) -> None:
    """The JSON route and the page's API give `aiayn translate --model MODEL --variant VARIANT`'s lines, at greedy
    and beam 4."""
    client = Client(url, verbose=False)
    for beam in (1, 4):
        expected = cli_translate(model, sentences, beam, variant)
        assert json_route(url, sentences, direction, beam) == expected
        assert [client.predict(s, direction, beam, api_name="/translate")[0] for s in sentences] == expected


def test_the_space_holds_the_page_the_model_and_what_it_needs(bundled: dict[str, Path], tmp_path: Path) -> None:
    space = export("en-de", tmp_path / "space")
    assert sorted(p.name for p in (space / "model").iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "training.json",
    ]
    space_card = front_matter(space)
    assert (space_card["sdk"], space_card["app_file"], space_card["sdk_version"]) == (
        "gradio",
        "app.py",
        gradio.__version__,
    )
    readme = (space / "README.md").read_text()
    assert "trained on Multi30k image captions (29 000 pairs)" in readme
    requirements = (space / "requirements.txt").read_text().split()
    names = [line.split("==")[0] for line in requirements]
    assert "onnxruntime" in names and "sentencex" in names and all("==" in line for line in requirements)
    assert "py3langid" in names and "mcp" not in names  # LibreTranslate's "auto"; MCP only with --mcp
    assert not {"gradio", "torch", "onnxruntime-gpu"} & set(names)
    assert (space / ".gitattributes").read_text() == "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    assert 'device="cpu", variant="fp32"' in (space / "app.py").read_text()
    assert "served with ONNX Runtime on the CPU (fp32 weights)" in readme

    # The package's part is what app.py reaches, all of it torch-free by the layer contract.
    copied = sorted(
        ".".join(p.relative_to(space).with_suffix("").parts).removesuffix(".__init__") for p in space.rglob("*.py")
    )
    copied.remove("app")
    app = (space / "app.py").read_text()
    modules, third_party = ImportWalk().reached(app)
    assert copied == modules and "aiayn.engines.onnx.serving.engine" in modules  # imported inside a function
    assert {name for name, _ in imports(app) if name.startswith("aiayn.")} <= set(modules)
    allowed = torch_free_modules()
    outside = [m for m in modules if not any(m == a or m.startswith(a + ".") or a.startswith(m + ".") for a in allowed)]
    assert outside == [] and "torch" not in third_party


def test_a_gpu_space_installs_onnxruntime_gpu_and_carries_the_graphs(bundled: dict[str, Path], tmp_path: Path) -> None:
    space = export("en-de", tmp_path / "space", "--device", "cuda")
    assert {"encoder.onnx", "decoder.onnx"} <= {p.name for p in (space / "model").iterdir()}
    names = [line.split("==")[0] for line in (space / "requirements.txt").read_text().split()]
    assert "onnxruntime-gpu[cuda,cudnn]" in names and "onnxruntime" not in names
    assert 'device="cuda"' in (space / "app.py").read_text()
    assert front_matter(space)["suggested_hardware"] == "t4-small"
    assert "*.onnx filter=lfs" in (space / ".gitattributes").read_text()


def test_refusals_are_one_line(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    assert main(["export", str(tiny_folder), "--to", "space", "--out", str(taken)]) == 2
    assert "holds file, which aiayn export --to space did not write" in capsys.readouterr().err
    assert main(["export", str(tiny_folder), "--device", "cuda"]) == 2
    assert "--device goes with --to space" in capsys.readouterr().err
    ungraphed = tmp_path / "ungraphed"
    ungraphed.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (ungraphed / name).write_bytes((tiny_folder / name).read_bytes())
    assert main(["export", str(ungraphed), "--to", "space", "--out", str(tmp_path / "gpu"), "--device", "cuda"]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "encoder.onnx" in error
    for device, variant in (("cpu", "fp16"), ("cuda", "w8")):
        out = str(tmp_path / f"{device}-{variant}")
        assert (
            main(["export", str(tiny_folder), "--to", "space", "--out", out, "--device", device, "--variant", variant])
            == 2
        )
        assert f"a Space on the {device.upper()} serves --variant" in capsys.readouterr().err


def test_an_imported_folder_names_its_checkpoint_and_licence(tiny_folder: Path, tmp_path: Path) -> None:
    """From its ``imported`` section: the front matter's licence and model link, the README's and page's line."""
    folder = tmp_path / "opus"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (folder / name).write_bytes((tiny_folder / name).read_bytes())
    imported = {"from": "Org/opus-mt-en-de", "hub": True, "license": "cc-by-4.0"}
    ModelFolder.open(folder).write_section("imported", imported)
    space = export(str(folder), tmp_path / "space")
    card = (space / "README.md").read_text()
    assert '\nlicense: "cc-by-4.0"\nmodels:\n  - "Org/opus-mt-en-de"\n---\n' in card
    assert "imported from Org/opus-mt-en-de (licence cc-by-4.0)" in card
    assert "imported from Org/opus-mt-en-de (licence cc-by-4.0)" in (space / "app.py").read_text()


def test_the_page_says_what_each_model_knows(bundled: dict[str, Path]) -> None:
    from aiayn.serve.page import build_app
    from aiayn.serve.service import TranslationService

    assert ModelFolder.open("de-en").provenance() == "trained on Multi30k image captions (29 000 pairs)"
    page = json.dumps(
        build_app(TranslationService(EngineOptions(device="cpu")), ["en-de", "de-en"]).get_config_file(),
        default=str,
        ensure_ascii=False,
    )
    assert "**en → de**: trained on Multi30k image captions (29 000 pairs)." in page
    assert "**de → en**: trained on Multi30k image captions (29 000 pairs)." in page


@pytest.fixture(scope="module", params=["fp32", "w8"])
def served(
    request: pytest.FixtureRequest,
    bundled: dict[str, Path],
    space_python: Path,
    serve_space: Callable[..., AbstractContextManager[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str]]:
    """(variant, URL): the bundled en-de's Space of each variant, served by its own app.py from the one fresh
    environment that every Space test shares."""
    variant = request.param
    folder = tmp_path_factory.mktemp(f"space-{variant}")
    space = export("en-de", folder / "space", "--variant", variant, "--mcp")
    assert f'variant="{variant}"' in (space / "app.py").read_text() and "mcp=True" in (space / "app.py").read_text()
    with serve_space(space_python, space, folder / "space.log") as url:
        yield variant, url


def test_the_space_serves_from_a_fresh_environment_as_translate(
    served: tuple[str, str], models_info: Callable[[str], list[dict[str, str]]]
) -> None:
    variant, url = served
    assert_answers_as_translate(url, "en-de", "en-de", SENTENCES, variant)
    models = models_info(url)  # the operators' routes, with the Space's own requirements
    assert [(m["direction"], m["variant"], m["device"]) for m in models] == [("en-de", variant, "CPUExecutionProvider")]


def test_the_space_answers_libretranslate_and_mcp_as_translate(
    served: tuple[str, str], mcp_translate: Callable[..., tuple[list[str], list[str]]]
) -> None:
    """An exported Space (`--mcp`), from its own folder: LibreTranslate's door and the MCP tool answer as `aiayn
    translate` does."""
    variant, url = served
    expected = cli_translate("en-de", SENTENCES, 4, variant)
    body = json.dumps({"q": SENTENCES, "source": "en", "target": "de"}).encode()
    request = urllib.request.Request(f"{url}translate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert json.loads(answer.read()) == {"translatedText": expected}
    tools, (translation, _) = mcp_translate(url, SENTENCES[0], "en-de", 4)
    assert "translate" in tools and translation == expected[0]


@pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed: apt-get install -y chromium (Debian's package)"
)
def test_every_feature_of_the_page_works_in_the_exported_space(served: tuple[str, str], tmp_path: Path) -> None:
    """In Chromium, on the Space's own page: translate, the heatmap and its heads, swap (one direction: nothing to
    swap to), an example, the unsure and the long-sentence notes, a file's upload and its translation's download;
    the answers `aiayn translate --variant`'s, and nothing in the page's console."""
    from playwright.sync_api import expect

    from aiayn.serve.page import FALLBACK_EXAMPLES
    from aiayn.serve.service import TranslationService
    from aiayn.serve.status import from_one, notes

    variant, url = served
    service = TranslationService(EngineOptions(device="cpu", variant=variant))
    translation_of = partial(service.translate, model="en-de")
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.set_default_timeout(60_000)
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(url, wait_until="load")
        expect(page.get_by_text(f"{variant} weights", exact=False)).to_be_visible()
        source, translation, status = (
            page.locator("#source-text textarea"),
            page.locator("#translation textarea"),
            page.locator("#status"),
        )

        def translate(text: str) -> None:
            source.fill(text)
            page.locator("#translate-button").click()
            expect(translation).to_have_value(translation_of(text).text)
            for note in notes(*from_one(translation_of(text))):
                expect(status).to_contain_text(note)

        translate("Two dogs play in the snow.")
        heatmap = page.locator("#attention-heatmap table")
        expect(heatmap).to_be_visible()
        expect(heatmap.locator("tr").first).to_contain_text("_dogs")
        page.get_by_label("0", exact=True).check()  # one head instead of the average
        expect(heatmap).to_be_visible()

        page.locator("#swap-button").click()  # the Space serves en → de alone: the texts stay
        expect(source).to_have_value("Two dogs play in the snow.")
        example = FALLBACK_EXAMPLES["en"][0]  # the Space keeps no corpus: the built-in examples
        page.locator("#examples").get_by_text(example[:30]).click()
        expect(source).to_have_value(example)

        unsure = "Two dogs play in the snow.\nJohn and Mary visit Berlin."
        assert translation_of(unsure).unsure_lines == [1]
        translate(unsure)
        translate(" ".join(["the big dog runs and the small cat sleeps"] * 45))  # ~410 tokens, clause by clause

        page.get_by_text("Translate a UTF-8 .txt file").click()
        upload = tmp_path / "captions.txt"
        upload.write_text("\n".join(SENTENCES), encoding="utf-8")
        page.locator("#upload input[type=file]").set_input_files(str(upload))
        link = page.locator("#download a[download]").first
        expect(link).to_be_visible()
        downloaded = page.request.get(link.get_attribute("href") or "").text()
        assert downloaded == service.translate_file("\n".join(SENTENCES), "en-de") + "\n"
        page.close()
    assert errors == []


def test_the_repositorys_own_space_serves_from_the_fresh_environment_as_translate(
    space_python: Path, serve_space: Callable[..., AbstractContextManager[str]], tmp_path: Path
) -> None:
    """The repository is a Space too (app.py, requirements.txt and README.md's front matter at its root): run as a
    Space runs it, from the environment every Space test shares, it answers as `aiayn translate`. That environment
    holds an exported Space's requirements too, so the root's must name each of them itself."""
    space = export("en-de", tmp_path / "space")
    card = front_matter(ROOT)
    assert (card["sdk"], card["app_file"], card["sdk_version"]) == ("gradio", "app.py", gradio.__version__)
    exported = (space / "requirements.txt").read_text().split()
    root = (ROOT / "requirements.txt").read_text().splitlines()
    root_names = {line.split(">=")[0].strip() for line in root if line.strip() and not line.startswith("#")}
    assert {line.split("==")[0] for line in exported} <= root_names
    with serve_space(space_python, ROOT, tmp_path / "root.log") as url:
        assert_answers_as_translate(url, "en-de", "en-de", SENTENCES[:1])
        assert_answers_as_translate(url, "de-en", "de-en", ["Zwei Hunde spielen im Schnee."])
