"""`aiayn bench --web`: the browser folder (``export/web.py``) in Debian's Chromium against `aiayn translate`.

The folder is written for the model, served by ``python -m http.server`` (the plain static server a visitor's
Space is) and opened by Playwright in Chromium; the page's ``window.aiayn.translate`` then translates untidy
test captions (doubled spaces, tabs, padding) at greedy and at beam 4. Figures: the time from opening the page
to its first translation, ms per caption, the folder's size, and how many lines equal the service's, which is
what `aiayn translate` prints. Playwright is a dev dependency, imported inside the functions that drive it.
"""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.bench.serving import free_port, wait_until_serving
from aiayn.export.web import export_web
from aiayn.serve.service import LoadedModel

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SPACING = [" ", " ", "  ", "\t", " \t "]
PADDING = ["", " ", "  ", "\t"]
FIRST_LINE = "Two dogs play in the snow."
CAPTIONS, QUICK_CAPTIONS = 200, 40  # test captions translated at each beam size (--quick: fewer)
ROUNDS = 3  # fresh pages; the times are their medians


def untidy(lines: Sequence[str], seed: int = 0) -> list[str]:
    """``lines`` with each space turned into a random run of spaces and tabs, and padded at both ends."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split(" ")
        spaced = words[0] + "".join(rng.choice(SPACING) + word for word in words[1:])
        out.append(rng.choice(PADDING) + spaced + rng.choice(PADDING))
    return out


@contextmanager
def served_folder(path: Path) -> Iterator[str]:
    """``python -m http.server`` in ``path`` on a free loopback port, until the block ends: its URL."""
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(path)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_until_serving(server, url)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (never a browser of Playwright's own): a ``Browser``."""
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        raise FileNotFoundError("Chromium is not installed: apt-get install -y chromium (Debian's package)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, url: str, device: str = "wasm") -> tuple[Any, float]:
    """A new page at ``url`` running ONNX Runtime on ``device`` (wasm: the CLI's very answers; webgpu; auto), and
    the seconds from opening it to its first translation (greedy, one line)."""
    page = browser.new_page()
    started = time.perf_counter()
    page.goto(f"{url}?device={device}")
    page.evaluate("lines => window.aiayn.translate(lines, {beam: 1})", [FIRST_LINE])
    return page, time.perf_counter() - started


def translate_in_page(page: Any, lines: Sequence[str], beam: int) -> tuple[list[str], float]:
    """``window.aiayn.translate(lines, {beam})`` in the page: the translations and the milliseconds it took."""
    script = """async ([lines, beam]) => {
        const started = performance.now();
        const out = await window.aiayn.translate(lines, {beam});
        return [out, performance.now() - started];
    }"""
    out, ms = page.evaluate(script, [list(lines), beam])
    return list(out), float(ms)


def cli_translations(model: LoadedModel, lines: Sequence[str], beam: int) -> list[str]:
    """What `aiayn translate` prints for ``lines`` (one chunk: its lines are searched together)."""
    return model.run(model.prepare(list(lines)), beam).text.split("\n")


@dataclass(frozen=True)
class WebFigures:
    pair: str
    size_mb: float
    first_s: float
    lines: int
    identical: dict[int, int]  # beam → lines equal to `aiayn translate`'s (in the round with fewest)
    ms_per_line: dict[int, float]  # beam → milliseconds per caption


def measure_web(
    model: LoadedModel, captions: Sequence[str], beams: Sequence[int] = (1, 4), rounds: int = ROUNDS
) -> WebFigures:
    """The folder of ``model`` in Chromium on the untidy ``captions``: identity and speed at each beam size. The
    times are medians of ``rounds``, each in a fresh page after one untimed pass (the first translation's time is
    the cold one); every round's translations are compared."""
    lines = untidy(captions)
    expected = {beam: cli_translations(model, lines, beam) for beam in beams}
    first, times = [], {beam: [] for beam in beams}
    identical = dict.fromkeys(beams, len(lines))
    with tempfile.TemporaryDirectory(prefix="aiayn-web-") as tmp:
        out = Path(tmp)
        export_web(model.folder, out)
        size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
        with served_folder(out) as url, chromium() as browser:
            for _ in range(rounds):
                page, first_s = open_page(browser, url)
                first.append(first_s)
                # Once untimed: Chromium compiles the 14 MB of WASM into optimized code in the background for
                # seconds after the page opens, on the cores the timed runs would otherwise share with it.
                translate_in_page(page, lines, 1)
                for beam in beams:
                    got, ms = translate_in_page(page, lines, beam)
                    same = sum(a == b for a, b in zip(got, expected[beam], strict=True))
                    identical[beam] = min(identical[beam], same)
                    times[beam].append(ms / len(lines))
                page.close()
    pair = f"{model.config.src_lang}-{model.config.tgt_lang}"
    speed = {beam: statistics.median(ms) for beam, ms in times.items()}
    return WebFigures(pair, size / 1e6, statistics.median(first), len(lines), identical, speed)


def web_report(figures: Sequence[WebFigures]) -> str:
    rows = [
        "| pair | folder | first translation | lines | identical, greedy | identical, beam 4 | ms/caption, greedy "
        "| ms/caption, beam 4 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        rows.append(
            f"| {f.pair} | {f.size_mb:.1f} MB | {f.first_s:.2f} s | {f.lines} | {f.identical[1]}/{f.lines} "
            f"| {f.identical[4]}/{f.lines} | {f.ms_per_line[1]:.1f} | {f.ms_per_line[4]:.1f} |"
        )
    return "\n".join(rows)
