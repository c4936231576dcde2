"""What an export publishes of a folder's records (``aiayn.core.public``): paths made local to the folder or cut to
their names, commands argument by argument, the host's fields left out, YAML text that reads back as itself."""

from __future__ import annotations

import pytest
import yaml

from aiayn.core.public import public_command, public_path, public_record, public_sections, yaml_quoted


@pytest.mark.parametrize(
    ("text", "published"),
    [
        ("/home/alice/run/checkpoints", "checkpoints"),  # inside the folder: relative to it
        ("/home/alice/run/", "."),
        ("/home/alice/corpora/train.en", "train.en"),  # elsewhere on the machine: its name
        ("~/corpora/train.en", "train.en"),
        ("../alice/train.en", "train.en"),
        ("C:\\Users\\alice\\train.en", "train.en"),
        ("Helsinki-NLP/opus-mt-en-de", "Helsinki-NLP/opus-mt-en-de"),  # a Hub id, a relative name: as they are
        ("data/train.en", "data/train.en"),
        ("trained on /home/alice/sets/opus (3 pairs)", "trained on opus (3 pairs)"),
        ("https://hf.co/a/b and 1/2", "https://hf.co/a/b and 1/2"),
    ],
)
def test_a_path_is_published_relative_to_the_folder_or_by_its_name(text: str, published: str) -> None:
    assert public_path(text, "/home/alice/run") == published


def test_a_command_keeps_its_flags_and_publishes_each_path_argument() -> None:
    command = "aiayn train --out /home/alice/run --train '/home/alice/my corpora/train.en' --hf=/srv/sets/opus --src en"
    assert public_command(command, "/home/alice/run") == "aiayn train --out . --train train.en --hf=opus --src en"


def test_a_record_loses_its_host_fields_and_a_parent_is_judged_against_its_own_folder() -> None:
    record = {
        "commands": ["aiayn train --out /a/run"],
        "options": {"out": "/a/run", "init_from": "/a/base"},
        "hardware": {"device": "cpu", "platform": "Linux-6.1-x86_64", "host": "box", "user": "alice"},
        "parent": {"folder": "/a/base", "commands": ["aiayn train --out /a/base"], "options": {"out": "/a/base"}},
    }
    assert public_record(record) == {
        "commands": ["aiayn train --out ."],
        "options": {"out": ".", "init_from": "base"},
        "hardware": {"device": "cpu"},
        "parent": {"folder": "base", "commands": ["aiayn train --out ."], "options": {"out": "."}},
    }


def test_an_import_from_a_local_folder_is_published_by_the_folders_name_a_hub_id_as_it_is() -> None:
    local = {"model": {"d_model": 8}, "imported": {"from": "checkpoints/opus-mt", "hub": False}}
    hub = {"imported": {"from": "Org/opus-mt-en-de", "hub": True, "revision": "0" * 40}}
    assert public_sections(local, "imported") == {
        "model": {"d_model": 8},
        "imported": {"from": "opus-mt", "hub": False},
    }
    assert public_sections(hub, "imported") == hub


@pytest.mark.parametrize(
    "text",
    [
        "cc-by-4.0",
        'other: "mine"\n---\nlicense: mit # not this',
        "\\ ' \" \t \r \x00 \x7f \x85 \xa0 \u2028 \u2029 \ufeff \ufffe",
        "- [a, {b: c}] & *ref !tag %x @y `z` | >",
        "🔤 ünïcødé \U0010fffd",
        "",
    ],
)
def test_yaml_quoted_text_reads_back_as_itself(text: str) -> None:
    quoted = yaml_quoted(text)
    assert "\n" not in quoted and yaml.safe_load(f"license: {quoted}\nnext: 1\n") == {"license": text, "next": 1}
