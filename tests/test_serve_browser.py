"""A real browser: Playwright drives Debian's Chromium through the page, end to end."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiayn.serve.app import build_app
from aiayn.serve.service import TranslationService

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def page_url(bundled: dict[str, Path]) -> Iterator[str]:
    app = build_app(TranslationService(engine="onnx", device="cpu"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    app.close()


def test_type_translate_read_and_see_the_heatmap(page_url: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.goto(page_url, wait_until="networkidle")
        page.locator("#source-text textarea").fill("Two dogs play in the snow.")
        page.locator("#translate-button").click()
        translation = page.locator("#translation textarea")
        expect(translation).to_have_value("Zwei Hunde spielen im Schnee.", timeout=30_000)
        expect(page.locator("#status")).to_contain_text("ExecutionProvider", timeout=30_000)
        heatmap = page.locator("#attention-heatmap table")
        expect(heatmap).to_be_visible(timeout=30_000)
        expect(heatmap).to_contain_text("_Hunde")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
        browser.close()
