"""What an export publishes of a model folder's records: nothing of the machine that wrote them.

``training.json`` and ``config.json`` keep what a run needs on its own machine: the folders and files it read, by
their full paths, the commands as typed, the host's platform. A Space, a browser folder or a transformers folder
goes to strangers, so each gets them as ``public_record`` and ``public_sections`` give them: a path inside the model
folder relative to it (``.`` for the folder itself), any other local path (absolute, under ``~`` or climbing out
with ``..``) by its name alone, the host's fields left out. Text written into a YAML front matter goes through
``yaml_quoted``: a licence from a model card (``"a: b\\n---"``) is read back as that text, never as more YAML.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

# Where a path starts that says where on a machine it lies: POSIX or Windows absolute, a share, a home.
LOCAL_START = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")
SEPARATORS = re.compile(r"[\\/]+")
# A POSIX path inside text ("trained on /home/alice/set (3 pairs)"): after a space, a bracket, a quote or "=".
EMBEDDED = re.compile(r"(?<![^\s(\[\"'=])~?/[^\s)\]\"',;]+")
# The record's fields about the machine (``hardware``'s platform), and any its readers may add about the host.
HOST_FIELDS = frozenset({"platform", "host", "hostname", "node", "user"})
COMMAND_FIELDS = frozenset({"commands", "command"})  # text typed at a shell: each argument judged on its own
# Where a nested record is named as the record that holds it saw it (a parent's ``folder``): never as ``.``.
OUTER_FIELDS = frozenset({"folder"})


def is_local_path(text: str) -> bool:
    """Whether ``text`` is a path that names where on its machine it lies."""
    return bool(LOCAL_START.match(text)) or ".." in SEPARATORS.split(text)


def last_name(path: str) -> str:
    """``/home/alice/corpora/train.en`` → ``train.en``."""
    parts = [part for part in SEPARATORS.split(path) if part not in ("", ".", "..", "~")]
    return parts[-1] if parts else "."


def public_path(text: str, folder: str | None = None) -> str:
    """``text`` as an export may show it: relative to ``folder`` (the model folder, as its record spells it) where
    it lies inside it, a local path by its last name, and so each local path inside text; anything else (a Hub id,
    a relative name) as it is."""
    if folder:
        base = folder.rstrip("/\\")
        if text.rstrip("/\\") == base:
            return "."
        if text.startswith((base + "/", base + "\\")):
            return text[len(base) + 1 :]
    if is_local_path(text):
        return last_name(text)
    return EMBEDDED.sub(lambda found: last_name(found.group()), text)


def public_command(command: str, folder: str | None = None) -> str:
    """A command as typed, each path argument (``--out DIR`` or ``--out=DIR``) through ``public_path``."""
    try:
        words = shlex.split(command)
    except ValueError:  # not what shlex.join wrote: published by the name of the program alone
        return command.split(" ", 1)[0]
    published = []
    for word in words:
        flag, equals, value = word.partition("=")
        if equals and flag.startswith("--"):
            published.append(f"{flag}={public_path(value, folder)}")
        else:
            published.append(public_path(word, folder))
    return shlex.join(published)


def scrubbed(value: Any, folder: str | None, command: bool = False) -> Any:
    """``value`` with every path through ``public_path`` (``public_command`` where it is a command) and the host's
    fields left out; a nested record (a parent's) is judged against its own folder."""
    if isinstance(value, dict):
        options = value.get("options")
        own = options.get("out") if isinstance(options, dict) and isinstance(options.get("out"), str) else folder
        return {
            key: scrubbed(item, folder if key in OUTER_FIELDS else own, key in COMMAND_FIELDS)
            for key, item in value.items()
            if key not in HOST_FIELDS
        }
    if isinstance(value, list):
        return [scrubbed(item, folder, command) for item in value]
    if isinstance(value, str):
        return public_command(value, folder) if command else public_path(value, folder)
    return value


def public_record(record: dict[str, Any]) -> dict[str, Any]:
    """``training.json`` as an export publishes it: commands and paths relative to the folder, no host detail."""
    published: dict[str, Any] = scrubbed(record, None)
    return published


def public_sections(sections: dict[str, Any], imported_section: str) -> dict[str, Any]:
    """``config.json``'s sections as an export publishes them: a checkpoint imported from a local folder by that
    folder's name (a Hub id as it is), any other path as ``public_path`` gives it."""
    published: dict[str, Any] = scrubbed(sections, None)
    imported = published.get(imported_section)
    if isinstance(imported, dict) and not imported.get("hub") and isinstance(imported.get("from"), str):
        published[imported_section] = {**imported, "from": last_name(imported["from"])}
    return published


def yaml_quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that reads back as exactly ``text``: quotes and backslashes escaped,
    and every character YAML would not keep as it is (line breaks, controls, format characters) as an escape."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif ord(char) <= 0xFF:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'
