"""`aiayn bench --web`'s account of a page's first seconds: each part's median start and end, in the order the parts
end, and a table whose columns keep that order whatever order each folder's parts ended in."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.bench.web import CHROMIUM, median_parts, parts_table, served_folder, visitors


def test_the_parts_are_medians_in_the_order_they_end_and_the_table_keeps_it() -> None:
    rounds = [
        {"weights": (10.0, 50.0), "encoder session": (50.0, 400.0), "runtime": (10.0, 30.0)},
        {"weights": (12.0, 70.0), "encoder session": (70.0, 300.0), "runtime": (12.0, 90.0)},
        {"weights": (11.0, 60.0), "encoder session": (60.0, 500.0), "runtime": (11.0, 40.0)},
    ]
    parts = median_parts(rounds)
    assert parts == {"runtime": (11.0, 40.0), "weights": (11.0, 60.0), "encoder session": (60.0, 400.0)}
    assert list(parts) == ["runtime", "weights", "encoder session"]  # the first round's order of ending
    other = {"encoder session": (5.0, 9.0), "weights": (1.0, 2.0), "runtime": (1.0, 4.0)}
    assert parts_table(["fp32", "w4"], [parts, other], "folder").splitlines() == [
        "| folder | runtime | weights | encoder session |",
        "|---|---|---|---|",
        "| fp32 | 11–40 | 11–60 | 60–400 |",
        "| w4 | 1–4 | 1–2 | 5–9 |",
    ]


NO_CHROMIUM = "Chromium is not installed: apt-get install -y chromium (Debian's package)"


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_a_visitor_keeps_its_cache_from_one_page_to_the_next(tmp_path: Path) -> None:
    """The second visit is a returning visitor's: the folder's large files come from the browser's own cache."""
    (tmp_path / "index.html").write_text("<!doctype html><title>t</title>", encoding="utf-8")
    (tmp_path / "big.bin").write_bytes(bytes(1_000_000))
    fetch = """() => fetch('big.bin').then((r) => r.arrayBuffer()).then(
        () => performance.getEntriesByName(new URL('big.bin', location).href)[0].transferSize)"""
    with served_folder(tmp_path, isolated=False) as url, visitors() as visitor:
        with visitor() as browser:
            first = browser.new_page()
            first.goto(url)
            assert first.evaluate(fetch) > 1_000_000  # over the wire
            first.close()
            second = browser.new_page()
            second.goto(url)
            assert second.evaluate(fetch) < 1_000_000  # the cache's (at most a revalidation's headers)
            second.close()
        with visitor() as stranger:  # another visitor: nothing of the first one's
            page = stranger.new_page()
            page.goto(url)
            assert page.evaluate(fetch) > 1_000_000
            page.close()
