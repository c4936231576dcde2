"""`aiayn export --to web`: the static folder, served by `python -m http.server`, translates in Debian's Chromium
exactly as `aiayn translate` does, untidy lines included, greedy and beam 4, in both directions."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiayn.bench.web import CHROMIUM, chromium, cli_translations, open_page, served_folder, translate_in_page, untidy
from aiayn.cli import main
from aiayn.core.folder import ModelFolder
from aiayn.export.npm import PACKAGES, matches
from aiayn.export.web import export_web
from aiayn.serve.service import LoadedModel, TranslationService

CAPTIONS = 30  # test captions per direction (`aiayn bench --web` runs 200)
# Lines the captions do not have: white space of every kind, an emoji and another script (left out or kept),
# two sentences, a long sentence cut into clauses, a character whose NFKC leaves the vocabulary (¼), an empty line.
EXTRA = {
    "en": [
        "",
        "\u00a0A dog\u2003runs\u3000on the  beach 🐕. Привет!",
        "Two men talk. A woman watches them from the door.",
        "A man in a red shirt is riding a bike down the street, and a woman in a blue dress is walking her dog "
        "in the park, while two children play.",
        "A ¼ pound burger on a plate.",
    ],
    "de": [
        "",
        "\u00a0Ein Hund\u2003rennt\u3000am  Strand 🐕. Привет!",
        "Zwei Männer reden. Eine Frau sieht ihnen von der Tür aus zu.",
        "Ein Mann in einem roten Hemd fährt mit dem Fahrrad die Straße entlang, und eine Frau in einem blauen Kleid "
        "geht mit ihrem Hund im Park spazieren, während zwei Kinder spielen.",
    ],
}

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed: apt-get install -y chromium (Debian's package)"
)


@pytest.fixture(scope="module")
def service(bundled: dict[str, Path]) -> TranslationService:
    return TranslationService(device="cpu")  # as `aiayn translate` runs on a CPU


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as opened:
        yield opened


@pytest.fixture(scope="module")
def pages(bundled: dict[str, Path], browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Each bundled pair's folder, written and served, open in Chromium."""
    opened, sites = {}, {}
    for pair in ("en-de", "de-en"):
        out = tmp_path_factory.mktemp(pair)
        try:
            export_web(ModelFolder.open(pair), out)
        except FileNotFoundError as err:  # the npm registry unreachable, and nothing cached
            pytest.skip(f"the npm files for the browser folder are unavailable: {err}")
        sites[pair] = out
    with served_folder(sites["en-de"]) as en_de, served_folder(sites["de-en"]) as de_en:
        for pair, url in (("en-de", en_de), ("de-en", de_en)):
            page, _ = open_page(browser, url)
            opened[pair] = page
        yield opened
        for page in opened.values():
            page.close()


def lines_for(multi30k_dir: Path, language: str) -> list[str]:
    with gzip.open(multi30k_dir / f"test_2016_flickr.{language}.gz", "rt", encoding="utf-8") as f:
        captions = f.read().split("\n")[:CAPTIONS]
    return untidy(captions) + EXTRA[language]


@pytest.mark.parametrize("pair", ["en-de", "de-en"])
@pytest.mark.parametrize("beam", [1, 4])
def test_the_browser_translates_as_the_cli(
    pages: dict[str, Any], service: TranslationService, multi30k_dir: Path, pair: str, beam: int
) -> None:
    model: LoadedModel = service.model(pair)
    lines = lines_for(multi30k_dir, model.config.src_lang)
    got, _ = translate_in_page(pages[pair], lines, beam)
    assert got == cli_translations(model, lines, beam)


def test_the_page_box_and_bad_calls(pages: dict[str, Any], service: TranslationService) -> None:
    page = pages["en-de"]
    text = "Two dogs play in the snow.\n\n  A man\trides a bike. "
    page.locator("#source").fill(text)
    page.locator("#beam").fill("1")
    page.locator("#translate").click()
    expected = "\n".join(cli_translations(service.model("en-de"), text.split("\n"), 1))
    page.wait_for_function("expected => document.getElementById('translation').value === expected", arg=expected)
    assert "Translated in" in page.locator("#status").inner_text()
    for call, message in (
        ("window.aiayn.translate(['a\\nb'])", "line 1 holds a line break"),
        ("window.aiayn.translate('a dog')", "lines must be an array of strings"),
        ("window.aiayn.translate(['a dog'], {beam: 0})", "beam must be a positive integer"),
    ):
        with pytest.raises(Exception, match=message):
            page.evaluate(call)


def test_the_folder_is_static_and_names_what_it_holds(pages: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "site"
    lines = export_web(ModelFolder.open("en-de"), out)
    names = {p.name for p in out.iterdir()}
    assert {"index.html", "aiayn.js", "encoder.onnx", "decoder.onnx", "tokenizer.json", "config.json"} <= names
    assert {Path(f).name for package in PACKAGES for f in package.files} <= names
    assert "sdk: static" in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["web"]["variant"] == "fp32"
    assert lines[0].startswith(f"wrote {out}: ") and " MB " in lines[0]


def test_export_to_web_needs_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "en-de", "--to", "web"]) == 2
    assert "--out DIR goes with --to web" in capsys.readouterr().err
    assert main(["export", "en-de", "--out", "somewhere"]) == 2


def test_a_tarball_is_refused_unless_its_sha512_is_the_pinned_one() -> None:
    abc = "sha512-3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj/uu9RU1EI2Q86A4qmslPpUyknw=="
    assert matches(b"abc", abc) and not matches(b"abd", abc)


def test_the_page_picks_webgpu_only_where_the_browser_offers_an_adapter(pages: dict[str, Any], browser: Any) -> None:
    url = pages["en-de"].url.split("?")[0]
    page = browser.new_page()
    page.goto(url)  # ?device=auto, the default
    has_adapter = page.evaluate("async () => 'gpu' in navigator && (await navigator.gpu.requestAdapter()) !== null")
    ready = page.evaluate("window.aiayn.ready")
    assert ready["device"] == ("webgpu" if has_adapter else "wasm")
    assert page.evaluate("window.aiayn.translate(['Two dogs play in the snow.'], {beam: 1})")[0]
    asked = browser.new_page()
    asked.goto(f"{url}?device=webgpu")
    if has_adapter:
        assert asked.evaluate("window.aiayn.ready")["device"] == "webgpu"
    else:  # the page says why it cannot, and how to open it instead
        asked.wait_for_function("document.getElementById('status').textContent.includes('no WebGPU adapter')")
        assert "?device=wasm" in asked.locator("#status").inner_text()
    page.close()
    asked.close()
