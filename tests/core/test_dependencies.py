"""One table of tested releases (``aiayn.core.dependencies``): pyproject.toml, requirements.txt and the Space's
Gradio say the same ranges, and a release outside its range is named in one line at start."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from aiayn.core.dependencies import SECURITY_FLOORS, TESTED, release_number, untested_line

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*([^;#\s]*)")


def table_name(distribution: str) -> str | None:
    """The table's name for a distribution (its own, or the one it is an ``also`` of), None if not in it."""
    distribution = distribution.lower().replace("_", "-")
    return next((name for name, tested in TESTED.items() if distribution in (name, *tested.also)), None)


def requirement_ranges(requirements: list[str]) -> list[tuple[str, str | None, str]]:
    """(distribution, its table name or None, its range) of each requirement line."""
    found = []
    for requirement in requirements:
        match = REQUIREMENT.match(requirement.strip())
        assert match is not None, requirement
        found.append((match.group(1), table_name(match.group(1)), match.group(2)))
    return found


def test_pyproject_and_requirements_say_the_tables_ranges() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = requirement_ranges(project["dependencies"])
    extras = requirement_ranges([r for extra in project["optional-dependencies"].values() for r in extra])
    lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    space = requirement_ranges([line for line in lines if line.strip() and not line.startswith("#")])
    for distribution, name, given in runtime + extras + space:
        assert name is None or given == TESTED[name].specifier, f"{distribution}{given}: the table says otherwise"
    assert {name for _, name, _ in runtime} == set(TESTED)  # every runtime dependency has its range, and no other
    assert None not in {name for _, name, _ in space}  # the Space installs nothing the table does not range
    sdk = re.search(r"^sdk_version: (\S+)$", (ROOT / "README.md").read_text(encoding="utf-8"), re.MULTILINE)
    assert sdk is not None and TESTED["gradio"].holds(sdk.group(1))


def test_the_extras_hold_the_security_floors_torch_above_cve_2025_32434s_fix() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = requirement_ranges([r for extra in project["optional-dependencies"].values() for r in extra])
    floored = [(distribution, given) for distribution, _, given in extras if distribution in SECURITY_FLOORS]
    assert floored and all(given == f">={SECURITY_FLOORS[name]}" for name, given in floored), floored
    assert release_number(SECURITY_FLOORS["torch"]) >= (2, 6)  # weights_only cannot be got around from 2.6 on


@pytest.mark.parametrize(
    ("releases", "named"),
    [
        ({"gradio": "6.31.0", "numpy": "2.4.6", "onnxruntime-gpu": "1.31.1"}, []),
        ({"gradio": "6.40.2", "onnxruntime": "1.32.0rc1"}, []),
        ({"gradio": "6.30.9"}, ["gradio 6.30.9 (tested >=6.31,<7)"]),
        ({"gradio": "7.0.0", "numpy": "1.26.4"}, ["numpy 1.26.4 (tested >=2.4.6)", "gradio 7.0.0 (tested >=6.31,<7)"]),
        ({"onnxruntime-gpu": "1.18.0"}, ["onnxruntime-gpu 1.18.0 (tested >=1.31.1)", "'onnxruntime-gpu>=1.31.1'"]),
    ],
)
def test_a_release_outside_its_tested_range_is_named_in_one_line(releases: dict[str, str], named: list[str]) -> None:
    line = untested_line(releases=releases)
    assert (line is not None) == bool(named)
    if line is not None:
        assert "\n" not in line and all(part in line for part in named)

