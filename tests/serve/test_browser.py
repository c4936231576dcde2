"""A real browser: Playwright drives Debian's Chromium through the page, good input and bad, end to end."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from aiayn.bench.web import CHROMIUM, chromium
from aiayn.engines.options import EngineOptions
from aiayn.serve.drain import Lifecycle
from aiayn.serve.operations import OperatorOptions, operated
from aiayn.serve.page import build_app, examples_for
from aiayn.serve.server import launch
from aiayn.serve.service import TranslationService

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TIMEOUT_MS = 30_000

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed: apt-get install -y chromium (Debian's package)"
)


@pytest.fixture(scope="module")
def service(bundled: dict[str, Path]) -> TranslationService:
    return TranslationService(EngineOptions(device="cpu"))


@pytest.fixture(scope="module")
def page_url(service: TranslationService) -> Iterator[str]:
    """The page behind the server's doors (``doors.py``): whatever it asks for, the allowlist must let through."""
    app = build_app(service)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lifecycle = Lifecycle()
    routes, middleware = operated(lifecycle, OperatorOptions(metrics=False, access_log=None))
    launch(app, port=port, routes=routes, middleware=middleware)
    lifecycle.ready()
    yield f"http://127.0.0.1:{port}/"
    app.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as opened:
        yield opened


@pytest.fixture
def page(browser: Browser, page_url: str) -> Iterator[Page]:
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    page.set_default_timeout(TIMEOUT_MS)
    refused: list[tuple[int, str]] = []  # what the server's doors, or Gradio, refused the page
    page.on("response", lambda answer: refused.append((answer.status, answer.url)) if answer.status >= 400 else None)
    # Not "networkidle": the page keeps a heartbeat connection open for its session state.
    page.goto(page_url, wait_until="load")
    page.locator("#translate-button").wait_for()
    yield page
    page.close()
    assert refused == []


def translate_on_page(page: Page, text: str) -> None:
    page.locator("#source-text textarea").fill(text)
    page.locator("#translate-button").click()


def test_type_translate_read_and_see_the_heatmap(page: Page) -> None:
    translate_on_page(page, "Two dogs play in the snow.")
    expect(page.locator("#translation textarea")).to_have_value("Zwei Hunde spielen im Schnee.")
    expect(page.locator("#status")).to_contain_text("1 sentence(s) in")
    expect(page.locator("#status")).to_contain_text("on CPUExecutionProvider")
    heatmap = page.locator("#attention-heatmap table")
    expect(heatmap).to_be_visible()
    expect(heatmap.locator("tr").first).to_contain_text("_dogs")
    expect(heatmap).to_contain_text("_Hunde")
    assert heatmap.locator("tr").count() == 1 + 7  # header + Zwei Hunde spielen im Schnee . </s>
    page.get_by_label("0", exact=True).check()  # one head instead of the average
    expect(heatmap).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)


def test_the_words_the_model_was_unsure_of_are_marked_in_the_translation(
    page: Page, service: TranslationService
) -> None:
    text = "John and Mary visit Berlin."
    result = service.translate(text, "en-de")
    words = [result.text[start:end] for start, end in result.lines[0].unsure_words]
    assert words  # the CLI's and the JSON route's marks
    translate_on_page(page, text)
    expect(page.locator("#translation textarea")).to_have_value(result.text)
    marked = page.locator("#unsure-words .highlighted .text")  # HighlightedText's labelled spans
    expect(marked).to_have_text(words)
    expect(page.locator("#unsure-words")).to_contain_text(result.text.split()[0])  # the whole translation shown
    translate_on_page(page, "Two dogs play in the snow.")
    expect(page.locator("#translation textarea")).to_have_value("Zwei Hunde spielen im Schnee.")
    expect(marked).to_have_count(0)  # a translation the model is sure of: nothing marked


def test_swap_and_examples(page: Page, service: TranslationService) -> None:
    translate_on_page(page, "Two dogs play in the snow.")
    expect(page.locator("#translation textarea")).to_have_value("Zwei Hunde spielen im Schnee.")
    page.locator("#swap-button").click()
    expect(page.locator("#source-text textarea")).to_have_value("Zwei Hunde spielen im Schnee.")
    page.locator("#translate-button").click()
    expect(page.locator("#translation textarea")).to_have_value("Two dogs play in the snow.")
    german_example = examples_for(service.model("de-en"))[0][0]  # the examples follow the direction
    page.locator("#examples").get_by_text(german_example[:30]).click()
    expect(page.locator("#source-text textarea")).to_have_value(german_example)


def test_bad_input_on_the_page_gets_a_message_and_the_page_keeps_working(
    page: Page, service: TranslationService, tmp_path: Path
) -> None:
    translation, status = page.locator("#translation textarea"), page.locator("#status")
    translate_on_page(page, "   \n ")
    expect(status).to_contain_text("Nothing to translate")
    expect(translation).to_have_value("")
    translate_on_page(page, "Two dogs play in the snow.")
    expect(translation).to_have_value("Zwei Hunde spielen im Schnee.")
    translate_on_page(page, "x" * 10_000)
    expect(status).to_contain_text("not translated: the text has 10000 characters; at most 5000")
    expect(translation).to_have_value("")  # the earlier translation and its timing are not left beside the error
    expect(page.locator("#heatmap")).to_contain_text("Translate a sentence to see", timeout=TIMEOUT_MS)
    long_sentence = " ".join(["the big dog runs and the small cat sleeps"] * 45)  # ~410 tokens
    translate_on_page(page, long_sentence)
    expect(translation).to_have_value(service.translate(long_sentence, "en-de").text)
    translate_on_page(page, "A dog 🐕 runs on the beach. Привет!")
    expect(translation).to_have_value(service.translate("A dog runs on the beach.", "en-de").text + " Привет!")
    expect(status).to_contain_text("left out: 🐕")

    page.get_by_text("Translate a UTF-8 .txt file").click()
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("A dog runs on the beach. Caf\xe9.".encode("latin-1"))
    page.locator("#upload input[type=file]").set_input_files(str(latin1))
    expect(page.locator(".toast-body").last).to_contain_text("not UTF-8 text")

    translate_on_page(page, "A girl jumps into the pool.")
    expect(translation).to_have_value(service.translate("A girl jumps into the pool.", "en-de").text)
