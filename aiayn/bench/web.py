"""`aiayn bench --web`: the browser folder (``export/web.py``) in Debian's Chromium against `aiayn translate`.

The folder is written for the model, served by its own ``preview.py`` (a static server sending the headers its Space
sends: the page is cross-origin isolated and runs WASM on every core) and opened by Playwright in Chromium; the
page's ``window.aiayn.translate`` then translates untidy test captions (doubled spaces, tabs, padding) at greedy and
at beam 4. Figures: the time from opening the page to its first translation, ms per caption, the folder's size, and
how many lines equal the service's, which is what `aiayn translate` prints. Playwright is a dev dependency, imported
inside the functions that drive it.
"""

from __future__ import annotations

import gzip
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.bench.serving import free_port, wait_until_serving
from aiayn.core.contract import DECODER_FILE, ENCODER_FILE
from aiayn.core.folder import ModelFolder
from aiayn.engines.onnx.external_data import EXTERNAL_DATA_FILE
from aiayn.export.web import PREVIEW_FILE, export_web
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
ROUNDS = 3  # fresh pages; the times are their medians
BATCH = 32  # lines a batch-mates check translates together
INDEX = "index.html"
GRAPH_FILES = (ENCODER_FILE, DECODER_FILE, EXTERNAL_DATA_FILE)
GZIP_LEVEL = 6  # gzip's default, as web servers use it
OPUS_MT_VOCAB = 58101  # opus-mt-en-de's vocabulary: the base size's folder is that checkpoint's size


@dataclass(frozen=True)
class WebPlan:
    """How many test captions: timed at each beam, translated alone against in batches, timed at the base size."""

    captions: int
    alone: int
    base_captions: int


WEB_FULL, WEB_QUICK = WebPlan(200, 1000, 8), WebPlan(40, 100, 3)


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
def served_folder(path: Path, isolated: bool = True) -> Iterator[str]:
    """The folder on a free loopback port until the block ends, its URL: by its ``preview.py``, cross-origin
    isolated as its Space; or (not ``isolated``) by ``python -m http.server``, which sends no such header."""
    port = free_port()
    plain = ["-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(path)]
    command = [sys.executable, *([str(path / PREVIEW_FILE), str(port)] if isolated else plain)]
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


@contextmanager
def visitors() -> Iterator[Callable[[], AbstractContextManager[Any]]]:
    """Debian's Chromium driven by Playwright, each visitor with a profile of its own on disk, as a real one has:
    the HTTP cache and V8's cache of the compiled WASM outlive a page, so a visitor's second page opens as a
    returning visitor's does (a ``Browser.new_context`` keeps neither). Yields the function that opens a new one."""
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        raise FileNotFoundError("Chromium is not installed: apt-get install -y chromium (Debian's package)")
    with sync_playwright() as playwright:

        @contextmanager
        def visitor() -> Iterator[Any]:
            with tempfile.TemporaryDirectory(prefix="aiayn-visitor-") as profile:
                context = playwright.chromium.launch_persistent_context(
                    profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS
                )
                try:
                    yield context
                finally:
                    context.close()

        yield visitor


def open_page(browser: Any, url: str, device: str = "wasm", threads: int = 0) -> tuple[Any, float]:
    """A new page at ``url`` running ONNX Runtime on ``device`` (wasm: the CLI's very answers; webgpu; auto) on
    ``threads`` WASM threads (0: the page's choice, one per core where it is isolated), and the seconds from opening
    it to its first translation (greedy, one line)."""
    page = browser.new_page()
    started = time.perf_counter()
    page.goto(f"{url}?device={device}" + (f"&threads={threads}" if threads else ""))
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


def downloaded_files(page: Any, folder: Path) -> list[Path]:
    """The folder's files the page has fetched so far (the page itself, its modules, the graphs, the WASM), as the
    browser's resource timing lists them."""
    names = page.evaluate("performance.getEntriesByType('resource').map((entry) => new URL(entry.name).pathname)")
    fetched = {name.lstrip("/") for name in names} | {INDEX}
    return sorted(folder / name for name in fetched if (folder / name).is_file())


@dataclass(frozen=True)
class Download:
    """What a WASM page downloads, in MB: as the files are (what `python -m http.server` sends), and gzipped
    one by one (what a host that compresses every response sends), and the graphs' share of the former."""

    files_mb: float
    gzip_mb: float
    graphs_mb: float

    @classmethod
    def of(cls, files: Sequence[Path]) -> Download:
        sizes = [f.stat().st_size for f in files]
        squeezed = [len(gzip.compress(f.read_bytes(), GZIP_LEVEL)) for f in files]
        graphs = sum(f.stat().st_size for f in files if f.name in GRAPH_FILES)
        return cls(sum(sizes) / 1e6, sum(squeezed) / 1e6, graphs / 1e6)


def first_parts(page: Any) -> dict[str, tuple[float, float]]:
    """Where an opened page's first seconds went: each part of loading it and its first translation (``timings``
    of ``page/aiayn.js``: the config, the runtime's module, the weights' download, each session, the tokenizer,
    sentencex), as (start, end) in ms since the page was opened."""
    timings = page.evaluate("window.aiayn.timings")
    return {name: (float(t["start"]), float(t["end"])) for name, t in timings.items()}


def median_parts(rounds: Sequence[dict[str, tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Each part's median start and end over ``rounds``, in the order the parts end."""
    names = sorted(rounds[0], key=lambda name: rounds[0][name][1])
    return {n: (statistics.median(r[n][0] for r in rounds), statistics.median(r[n][1] for r in rounds)) for n in names}


def parts_table(labels: Sequence[str], parts: Sequence[dict[str, tuple[float, float]]], header: str) -> str:
    """A Markdown table: one row per label, each part's start–end (ms) in the columns, in the first row's order."""
    names = list(parts[0])
    rows = [f"| {header} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, spans in zip(labels, parts, strict=True):
        rows.append(f"| {label} | " + " | ".join(f"{spans[n][0]:.0f}–{spans[n][1]:.0f}" for n in names) + " |")
    return "\n".join(rows)


def parts_report(figures: Sequence[WebFigures]) -> str:
    """Where each folder's first translation's time goes: each part's start and end (ms, medians)."""
    return parts_table([f"{f.pair}, {f.variant}" for f in figures], [f.parts for f in figures], "folder")


@dataclass(frozen=True)
class WebFigures:
    pair: str
    variant: str
    download: Download
    first_s: float
    second_s: float  # the same, the same visitor's next page (its browser's caches kept)
    parts: dict[str, tuple[float, float]]  # part of the first translation's time → (start, end) ms, medians
    lines: int
    identical: dict[int, int]  # beam → lines equal to `aiayn translate`'s (in the round with fewest)
    ms_per_line: dict[int, float]  # beam → milliseconds per caption
    alone: dict[int, int]  # beam → lines whose translation alone equals theirs in batches of BATCH (0: not run)


def batch_mates(page: Any, lines: Sequence[str], beam: int) -> int:
    """How many of ``lines`` translate alone as they do in batches of ``BATCH`` lines."""
    batched = []
    for start in range(0, len(lines), BATCH):
        batched += translate_in_page(page, lines[start : start + BATCH], beam)[0]
    script = """async ([lines, beam]) => {
        const out = [];
        for (const line of lines) out.push((await window.aiayn.translate([line], {beam}))[0]);
        return out;
    }"""
    alone = page.evaluate(script, [list(lines), beam])
    return sum(a == b for a, b in zip(alone, batched, strict=True))


def measure_web(
    model: LoadedModel,
    captions: Sequence[str],
    variant: str = "fp32",
    beams: Sequence[int] = (1, 4),
    rounds: int = ROUNDS,
    alone: Sequence[str] = (),
) -> WebFigures:
    """The ``variant`` folder of ``model`` (loaded with that variant: `aiayn translate --variant`) in Chromium on the
    untidy ``captions``: what the page downloads, identity and speed at each beam size, and whether the lines of
    ``alone`` translate alone as in batches. The times are medians of ``rounds``, each a new visitor (a profile of
    its own) whose first page is timed after one untimed pass (the first translation's time is the cold one),
    then whose second page is timed to its first translation (its caches warm); every round's translations are
    compared."""
    lines = untidy(captions)
    expected = {beam: cli_translations(model, lines, beam) for beam in beams}
    first, second, parts, times = [], [], [], {beam: [] for beam in beams}
    identical = dict.fromkeys(beams, len(lines))
    with tempfile.TemporaryDirectory(prefix="aiayn-web-") as tmp:
        out = Path(tmp)
        export_web(model.folder, out, variant)
        with served_folder(out) as url, visitors() as visitor:
            for _ in range(rounds):
                with visitor() as browser:
                    page, first_s = open_page(browser, url)
                    first.append(first_s)
                    parts.append(first_parts(page))
                    download = Download.of(downloaded_files(page, out))
                    # Once untimed: Chromium compiles the 14 MB of WASM into optimized code in the background for
                    # seconds after the page opens, on the cores the timed runs would otherwise share with it.
                    translate_in_page(page, lines, 1)
                    for beam in beams:
                        got, ms = translate_in_page(page, lines, beam)
                        same = sum(a == b for a, b in zip(got, expected[beam], strict=True))
                        identical[beam] = min(identical[beam], same)
                        times[beam].append(ms / len(lines))
                    page.close()
                    page, second_s = open_page(browser, url)
                    second.append(second_s)
                    page.close()
            with visitor() as browser:
                page, _ = open_page(browser, url)
                mates = {beam: batch_mates(page, alone, beam) if alone else 0 for beam in beams}
                page.close()
    pair = f"{model.config.src_lang}-{model.config.tgt_lang}"
    speed = {beam: statistics.median(ms) for beam, ms in times.items()}
    visits = statistics.median(first), statistics.median(second)
    return WebFigures(pair, variant, download, *visits, median_parts(parts), len(lines), identical, speed, mates)


def web_report(figures: Sequence[WebFigures], alone: int = 0) -> str:
    """The figures as a Markdown table; ``alone``: how many lines the batch-mates check translated (0: none)."""
    header = (
        "| pair | variant | downloaded (gzip) | of it graphs | first translation | on a second visit "
        "| identical, greedy | identical, beam 4 | ms/caption, greedy | ms/caption, beam 4 |"
    )
    if alone:
        header += f" alone = in batches of {BATCH}, greedy | the same, beam 4 |"
    rows = [header, "|---" * (header.count("|") - 1) + "|"]
    for f in figures:
        d = f.download
        row = (
            f"| {f.pair} | {f.variant} | {d.files_mb:.1f} MB ({d.gzip_mb:.1f}) | {d.graphs_mb:.1f} MB "
            f"| {f.first_s:.2f} s | {f.second_s:.2f} s | {f.identical[1]}/{f.lines} | {f.identical[4]}/{f.lines} "
            f"| {f.ms_per_line[1]:.1f} | {f.ms_per_line[4]:.1f} |"
        )
        rows.append(row + (f" {f.alone[1]}/{alone} | {f.alone[4]}/{alone} |" if alone else ""))
    return "\n".join(rows)


@dataclass(frozen=True)
class BaseWebFigures:
    variant: str
    download: Download
    first_s: float
    parts: dict[str, tuple[float, float]]  # as WebFigures.parts, of the one page
    lines: int
    threads: int  # the page's WASM threads (one per core, cross-origin isolated)
    ms_per_line: float  # greedy, on ``threads``
    ms_one_thread: float  # greedy, on one thread
    identical_to_one: int  # lines equal to one thread's
    tokens_per_line: float  # the outputs' mean length in tokens (a random model's outputs run long)


def measure_web_base(
    folder: ModelFolder, captions: Sequence[str], variants: Sequence[str], vocab_size: int = OPUS_MT_VOCAB
) -> list[BaseWebFigures]:
    """Each variant's folder of a base-size model (Table 3: 6 + 6 layers, d_model 512) with ``vocab_size`` tokens
    and seeded random weights (``base_size.base_folder``): what a WASM page downloads, its first translation and
    where its time went, and ms per caption at greedy after one untimed pass, on the page's threads and on one
    (whose lines the threads' must equal); one fresh page each."""
    from aiayn.bench.base_size import base_folder
    from aiayn.core.config import PRESETS
    from aiayn.export.onnx_export import export_onnx
    from aiayn.model.weights import load_model

    figures = []
    with tempfile.TemporaryDirectory(prefix="aiayn-web-base-") as tmp:
        base = base_folder(folder, Path(tmp) / "base", PRESETS["base"].replace(vocab_size=vocab_size))
        export_onnx(load_model(base), base)
        lines = untidy(captions)
        with chromium() as browser:
            for variant in variants:
                out = Path(tmp) / variant
                export_web(base, out, variant)
                with served_folder(out) as url:
                    page, first_s = open_page(browser, url)
                    parts, threads = first_parts(page), page.evaluate("window.aiayn.ready")["threads"]
                    download = Download.of(downloaded_files(page, out))
                    translate_in_page(page, lines[:2], 1)
                    got, ms = translate_in_page(page, lines, 1)
                    page.close()
                    one, _ = open_page(browser, url, threads=1)
                    translate_in_page(one, lines[:2], 1)
                    alone, ms_one = translate_in_page(one, lines, 1)
                    one.close()
                tokens = statistics.mean(len(base.tokenizer.encode(text)) for text in got)
                same = sum(a == b for a, b in zip(got, alone, strict=True))
                per_line = (ms / len(lines), ms_one / len(lines))
                figures.append(
                    BaseWebFigures(variant, download, first_s, parts, len(lines), threads, *per_line, same, tokens)
                )
                shutil.rmtree(out)
    return figures


def base_web_report(figures: Sequence[BaseWebFigures], vocab_size: int = OPUS_MT_VOCAB) -> str:
    rows = [
        f"| base size, vocabulary {vocab_size} | downloaded (gzip) | of it graphs | first translation "
        "| threads | ms/caption, greedy | on 1 thread | threads / 1 thread | identical to 1 thread | tokens/caption |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        d = f.download
        rows.append(
            f"| {f.variant} | {d.files_mb:.1f} MB ({d.gzip_mb:.1f}) | {d.graphs_mb:.1f} MB | {f.first_s:.1f} s "
            f"| {f.threads} | {f.ms_per_line:.0f} | {f.ms_one_thread:.0f} | {f.ms_per_line / f.ms_one_thread:.2f}× "
            f"| {f.identical_to_one}/{f.lines} | {f.tokens_per_line:.0f} |"
        )
    parts = parts_table([f.variant for f in figures], [f.parts for f in figures], "base size")
    return "\n".join(rows) + f"\n\nWhere the first translation's time went (ms since the page opened):\n\n{parts}"
