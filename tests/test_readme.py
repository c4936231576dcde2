"""The README keeps up with the code: its folder tour names every module, and the newcomer finds what they need."""

from __future__ import annotations

from pathlib import Path

from aiayn.text.sentences import MAX_CHARS, MAX_FILE_CHARS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def test_the_folder_tour_names_every_module() -> None:
    tour = section("A tour of the folders")
    modules = [p for p in (ROOT / "aiayn").rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert modules and [str(p.relative_to(ROOT)) for p in modules if f"`{p.name}`" not in tour] == []


def test_the_first_steps_name_python_the_address_and_the_full_install() -> None:
    start = section("The two commands")
    assert "Python 3.11 or newer" in start and "http://127.0.0.1:7860" in start
    assert 'aiayn translate "Two dogs play in the snow."' in start
    for command in ("aiayn train", "aiayn export", "aiayn bench", "aiayn eval --engine torch"):
        assert f"`{command}`" in start


def test_the_serving_section_names_both_endpoints_and_the_limits() -> None:
    serving = section("Serving")
    assert "`translate`" in serving and "`translate_file`" in serving
    assert f"{MAX_CHARS} characters" in serving and f"{MAX_FILE_CHARS:,} characters".replace(",", " ") in serving
