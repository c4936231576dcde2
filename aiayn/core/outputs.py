"""What a command may write over: nothing but its own earlier output, replaced whole once the new one is complete.

Every command that writes a folder (`aiayn prepare`, `train`, `import`, `export --to web|space|transformers|
ctranslate2`) leaves a manifest in it, ``.aiayn-output.json``: which command wrote it and the files it wrote (a
name ending in ``/`` stands for a whole folder of its own, as a training run's ``checkpoints/``). Before writing,
``claim`` reads the folder named as output: absent, empty, or holding only what the manifest of that very command
lists, it is the command's to write; anything else (a file the command did not write, another command's output, a
home folder) is refused in one line that names the file and how to go on. ``--overwrite`` lifts the refusal for a
folder that is neither the command's input nor holds it, nor the current or home folder or above them: the command
replaces its own files there (those its manifest lists, and those it writes now), and keeps every other file where
it is, naming them in one line; it never deletes a file it would not write.

``written_whole`` writes an output beside its place (a new hidden folder), fsyncs every file of it and renames it
into place, and only then removes the old one: a failure at any moment leaves the old output whole. ``write_file``
(``replacing``, for a writer that wants a file object) does the same for one file of a folder written in place (a
training run's ``config.json``, weights, record): its temporary twin is created exclusively under a name nobody can
guess, so that a link planted beside it is never followed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MANIFEST_FILE = ".aiayn-output.json"
TMP_SUFFIX = ".tmp"  # ``write_file``'s temporary twin of a file, which a killed command may leave
# A twin's name: ``.NAME.<16 random hex digits>.tmp`` (``NAME.tmp``, fixed, as earlier releases named it, is known too).
TWIN = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{16}" + re.escape(TMP_SUFFIX))
NAMED_AT_MOST = 5  # of the files --overwrite kept, the line names this many
# O_EXCL: created here or refused, a link in its place never followed.
EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Command:
    """A command that writes a folder: its name as a user types it, and how to go on when its output is refused."""

    name: str  # "aiayn prepare"; what the manifest records
    refused_fix: str  # "choose another --out, or pass --overwrite to replace the folder whole"


@contextmanager
def replacing(path: Path) -> Iterator[BinaryIO]:
    """A file to write ``path``'s new content into: ``path``'s twin, created exclusively (never through a link) under
    a name nobody can guess, with the mode a new file gets; when the block ends, fsynced and renamed over ``path``.
    A failure removes it and leaves ``path`` as it was."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}{TMP_SUFFIX}")
    f = os.fdopen(os.open(tmp, EXCLUSIVE, 0o666), "wb")
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def write_file(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole or its old content: written beside it, fsynced, renamed over it."""
    with replacing(path) as f:
        f.write(data)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so that the renames in it survive a power cut."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def entries(folder: Path) -> Iterator[str]:
    """Every file and link under ``folder`` (a link to a folder is one entry, never followed), as relative POSIX
    paths in sorted order; folders themselves hold nothing to lose."""
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        links = [name for name in dirs if (here / name).is_symlink()]
        dirs[:] = sorted(name for name in dirs if name not in links)
        for name in sorted([*files, *links]):
            yield (here / name).relative_to(folder).as_posix()


def read_manifest(folder: Path) -> tuple[str, set[str]] | None:
    """(the command that wrote ``folder``, the files it lists), or None where it holds no readable manifest."""
    try:
        data = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        return str(data["command"]), {str(name) for name in data["files"]}
    except (OSError, ValueError, TypeError, KeyError):
        return None


def write_manifest(folder: Path, command: Command, files: Iterable[str]) -> None:
    manifest = {"command": command.name, "files": sorted(files)}
    write_file(folder / MANIFEST_FILE, (json.dumps(manifest, indent=2) + "\n").encode())


def is_listed(entry: str, listed: set[str]) -> bool:
    """``entry`` is listed, lies in a listed folder (``checkpoints/``), or is a listed file's temporary twin."""
    folder, _, name = entry.rpartition("/")
    twin = TWIN.fullmatch(name)
    named = f"{folder}/{twin['name']}".lstrip("/") if twin else entry.removesuffix(TMP_SUFFIX)
    if named == MANIFEST_FILE or named in listed or entry in listed:
        return True
    parts = entry.split("/")
    return any("/".join(parts[:depth]) + "/" in listed for depth in range(1, len(parts)))


def foreign_entries(out: Path, command: Command) -> Iterator[str]:
    """The entries of the folder ``out`` that ``command`` did not write."""
    manifest = read_manifest(out)
    listed = manifest[1] if manifest is not None and manifest[0] == command.name else set()
    return (entry for entry in entries(out) if not is_listed(entry, listed))


def foreign_entry(out: Path, command: Command) -> str | None:
    """The first entry of the folder ``out`` that ``command`` did not write, or None."""
    return next(foreign_entries(out, command), None)


def is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def claim(out: Path, command: Command, overwrite: bool = False, inputs: Iterable[Path] = ()) -> None:
    """Refuse, in one line, an ``out`` that ``command`` may not write: a file or link, a folder holding what it did
    not write (unless ``overwrite``), and even with ``overwrite`` one of its ``inputs`` or a folder holding one,
    the current folder, the home folder, or a folder above them."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise FileExistsError(f"{out} is not a folder; give a folder for {command.name} to write")
    if not out.exists():
        return
    if overwrite:
        where = out.resolve()
        kept = [Path(p).resolve() for p in (Path.cwd(), Path.home(), *inputs)]
        held = next((p for p in kept if is_within(p, where)), None)
        if held is not None:
            raise FileExistsError(f"--overwrite would delete {held} with {out}; give {command.name} another folder")
        return
    entry = foreign_entry(out, command)
    if entry is not None:
        raise FileExistsError(f"{out} holds {entry}, which {command.name} did not write; {command.refused_fix}")


def mark(out: Path, command: Command, files: Iterable[str]) -> None:
    """Make ``out`` (claimed) ``command``'s folder, written in place: ``files``, names or ``folder/``, are its own."""
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(out, command, files)


def beside(out: Path, label: str) -> Path:
    """A new, hidden name beside ``out`` that nothing holds yet."""
    return out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.{label}")


def sync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder``."""
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        sync_folder(Path(root))


def keep_foreign(out: Path, staging: Path, command: Command) -> list[str]:
    """``--overwrite``: move every entry of ``out`` that ``command`` did not write and does not write now into
    ``staging`` (the new output, its manifest written), so that they outlive the old folder; the entries moved.
    One in the way of the new output (a file where it writes a folder) is refused, everything moved back."""
    written = set(entries(staging))
    foreign = [entry for entry in foreign_entries(out, command) if entry not in written]
    moved: list[str] = []
    try:
        for entry in foreign:
            target = staging / entry
            above = [p for p in target.parents if staging in p.parents]
            if target.exists() or target.is_symlink() or any(p.is_symlink() or p.is_file() for p in above):
                raise FileExistsError(
                    f"{out / entry} is in the way of what {command.name} writes; move it, or give another folder"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            (out / entry).rename(target)
            moved.append(entry)
        for folder in {(staging / entry).parent for entry in moved}:
            sync_folder(folder)
    except BaseException:
        for entry in moved:
            (staging / entry).rename(out / entry)
        raise
    return moved


def say_kept(out: Path, command: Command, kept: list[str]) -> None:
    more = len(kept) - NAMED_AT_MOST
    named = ", ".join(kept[:NAMED_AT_MOST]) + (f" and {more} more" if more > 0 else "")
    print(f"--overwrite kept {len(kept)} file(s) in {out} that {command.name} did not write: {named}", file=sys.stderr)


@contextmanager
def written_whole(out: Path, command: Command, overwrite: bool = False, inputs: Iterable[Path] = ()) -> Iterator[Path]:
    """Claim ``out``, give the caller an empty folder beside it to write ``command``'s output into, and when the
    block ends, put that output in ``out``'s place whole: its manifest written, every file fsynced, claimed again
    (nothing may have come in meanwhile), with ``overwrite`` the files it did not write moved into it
    (``keep_foreign``), renamed into place, and only then the old folder removed. A failure leaves ``out`` as it
    was and removes the new folder."""
    out, inputs = Path(out), list(inputs)
    claim(out, command, overwrite, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = beside(out, "new")
    staging.mkdir()  # follows the umask, as the folder it becomes
    try:
        yield staging
        write_manifest(staging, command, entries(staging))
        sync_tree(staging)
        claim(out, command, overwrite, inputs)
        kept = keep_foreign(out, staging, command) if overwrite and out.exists() else []
        old = beside(out, "old")
        try:
            if out.exists():
                out.rename(old)
            try:
                staging.rename(out)
            except BaseException:
                if old.exists():
                    old.rename(out)
                raise
        except BaseException:
            for entry in kept:
                (staging / entry).rename(out / entry)
            raise
        sync_folder(out.parent)
        shutil.rmtree(old, ignore_errors=True)
        if kept:
            say_kept(out, command, kept)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already where all went well
