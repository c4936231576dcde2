"""Every link, path, command and flag that README.md and docs/ name exists, so that a renamed file, heading or flag
cannot leave a dangling reference behind. Each test lists every dangling reference of its kind at once, as
`document:line: what`. Torch-free and fast: the files are walked, the CLI's parser is built (no command runs)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from aiayn.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The repository's own folders and files: a path that starts with one of them names the repository.
TOP = ("aiayn", "tests", "scripts", "docs", "pretrained", ".ci")
SKIP = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", "mutants", "runs", ".gpu"}
# Files with these endings, named bare (`page.py`) or under a folder of the package (`serve/page.py`), are ours.
SOURCE = (".py", ".sh", ".js", ".html", ".md", ".toml", ".tsv", ".txt")
# Named files that are not in the repository but written or fetched by it: each with the module that names it.
WRITTEN = {
    "preview.py": "aiayn/export/web.py",  # the browser folder's local server
    "sentencex_wasm.js": "aiayn/export/npm.py",  # a pinned npm file the browser folder carries
}

# Flags the docs show with a value the CLI refuses, on purpose (what a bad flag does): each is checked to be refused.
REFUSED = {"--device gpu": "translate"}

FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.M | re.S)
SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
URL = re.compile(r"[a-z]+://\S+")
ROOTED = re.compile(r"(?<![\w./~$-])(?<!\]\()((?:aiayn|tests|scripts|docs|pretrained|\.ci)/[\w./-]*)(::\w+|#[\w-]+)?")
# `aiayn COMMAND ...`: in a code span after any space; in a fenced block only where a shell line starts a command
AIAYN = r"aiayn[ \t]+([a-z]+)\b([^\n#;&|`]*)"  # the command, and the rest of its line
SPAN_COMMAND = re.compile(r"(?:^|(?<=[\s;&|(]))" + AIAYN)
BLOCK_COMMAND = re.compile(r"(?:^[ \t]*(?:\$[ \t]+)?(?:[A-Z_]+=\S*[ \t]+)*|(?<=[;&|(])[ \t]*)" + AIAYN)
FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)(?:[ =]([^\s\]\[-][^\s\]\[]*))?")  # a flag, and its value


@dataclass
class Document:
    path: Path
    text: str
    prose: str = field(init=False)  # the text with its fenced blocks blanked out (same offsets, same lines)
    blocks: list[tuple[int, str]] = field(init=False)  # each fenced block: its offset and its text

    def __post_init__(self) -> None:
        self.blocks = [(m.start(), m.group()) for m in FENCE.finditer(self.text)]
        self.prose = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), self.text)

    @property
    def name(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    def where(self, offset: int) -> str:
        return f"{self.name}:{self.text.count(chr(10), 0, offset) + 1}"

    def spans(self) -> Iterator[tuple[int, str]]:
        """Each inline code span of the prose: its offset and its text."""
        for m in SPAN.finditer(self.prose):
            if "\n\n" not in m.group(1):
                yield m.start(1), m.group(1)


@cache
def documents() -> list[Document]:
    return [Document(path, path.read_text(encoding="utf-8")) for path in DOCUMENTS]


@cache
def repository() -> tuple[frozenset[str], frozenset[str]]:
    """The repository's files and folders (posix, relative to the root; folders without their slash)."""
    files, folders = set(), set()
    for top in ROOT.iterdir():
        if top.is_file():
            files.add(top.name)
        elif top.name in TOP:
            folders.add(top.name)
            for path in top.rglob("*"):
                relative = path.relative_to(ROOT)
                if SKIP.intersection(relative.parts):
                    continue
                (folders if path.is_dir() else files).add(relative.as_posix())
    return frozenset(files), frozenset(folders)


def exists(path: str, anywhere: bool = False) -> bool:
    """Whether ``path`` is a file or folder of the repository; ``anywhere``: under any folder of it (`serve/page.py`
    is aiayn/serve/page.py)."""
    files, folders = repository()
    path = path.rstrip("/")
    names = files | folders
    return path in names or anywhere and any(name.endswith("/" + path) for name in names)


@cache
def anchors(path: Path) -> frozenset[str]:
    """GitHub's anchors of a Markdown file's headings (outside fenced blocks): lowercased, punctuation dropped, each
    space a hyphen, a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    prose = FENCE.sub("", path.read_text(encoding="utf-8"))
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", prose, flags=re.M):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return frozenset(found)


def anchor_problem(target: Path, anchor: str) -> str | None:
    if target.suffix == ".md" and target.is_file() and anchor not in anchors(target):
        return f"#{anchor} is no heading of {target.relative_to(ROOT).as_posix()}"
    return None


def test_every_link_lands_on_a_file_and_a_heading() -> None:
    problems = []
    for doc in documents():
        for m in LINK.finditer(doc.prose):
            link = m.group(1)
            if URL.match(link) or link.startswith("mailto:"):
                continue
            path, _, anchor = link.partition("#")
            target = (doc.path.parent / path).resolve() if path else doc.path
            if not target.exists() or (ROOT not in target.parents and target != ROOT):
                problems.append(f"{doc.where(m.start())}: ({link}) names no file of the repository")
            elif anchor and (problem := anchor_problem(target, anchor)):
                problems.append(f"{doc.where(m.start())}: ({link}): {problem}")
    assert not problems, "dangling links:\n" + "\n".join(problems)


def rooted_problems(doc: Document) -> Iterator[str]:
    """Paths that start at the repository's root (aiayn/..., tests/..., docs/x.md#anchor, file.py::test), in prose,
    code spans and fenced blocks alike."""
    for m in ROOTED.finditer(URL.sub(lambda u: " " * len(u.group()), doc.text)):
        path, suffix = m.group(1).rstrip("."), m.group(2) or ""
        if "*" in path:
            continue
        where = doc.where(m.start())
        if not exists(path):
            yield f"{where}: {path} is no file or folder of the repository"
        elif suffix.startswith("#") and (problem := anchor_problem(ROOT / path, suffix[1:])):
            yield f"{where}: {path}{suffix}: {problem}"
        elif suffix.startswith("::") and not re.search(
            rf"^\s*(?:async )?(?:def|class) {suffix[2:]}\b", (ROOT / path).read_text(encoding="utf-8"), re.M
        ):
            yield f"{where}: {path} defines no {suffix[2:]}"


def span_problems(doc: Document) -> Iterator[str]:
    """Within code spans, paths under a folder of the repository (`serve/page.py`, `engines/onnx/`), bare file
    names (`page.py`, `gpu_session.sh`) and dotted modules of the package (`aiayn.engines.load`)."""
    _, folders = repository()
    folder_names = {Path(f).name for f in folders}
    for offset, span in doc.spans():
        where = doc.where(offset)
        for word in span.split():
            word = re.sub(r"::\w+$", "", word.strip("()[],;:'\"").rstrip("."))
            if "*" in word or word.startswith(TOP) or not re.fullmatch(r"[\w./-]+", word):
                continue  # a glob, a rooted path (rooted_problems), not a path
            if "/" in word and not word.startswith((".", "/")):
                first, ending = word.split("/")[0], Path(word.rstrip("/")).suffix
                if first in folder_names and (word.endswith("/") or ending in SOURCE or not ending):
                    if not exists(word, anywhere=True):
                        yield f"{where}: `{word}` is under no folder of the repository"
            elif word.endswith(SOURCE[:4]) and "/" not in word:
                if word not in WRITTEN and not any(Path(f).name == word for f in repository()[0]):
                    yield f"{where}: `{word}` is no file of the repository"
            elif re.fullmatch(r"aiayn(\.\w+)+", word) and (problem := module_problem(word)):
                yield f"{where}: `{word}`: {problem}"


def module_problem(dotted: str) -> str | None:
    """None where ``dotted`` is a module of the package, or a module and a name it defines or imports."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[n:]
            if rest and not re.search(rf"\b{rest[0]}\b", module.read_text(encoding="utf-8")):
                return f"{'.'.join(parts[:n])} has no {rest[0]}"
            return None
    return "no such module"


def test_every_path_the_docs_name_exists() -> None:
    problems = [p for doc in documents() for p in [*rooted_problems(doc), *span_problems(doc)]]
    assert not problems, "paths that name nothing:\n" + "\n".join(problems)


def test_the_files_written_by_the_code_are_named_by_it() -> None:
    """The exceptions above stay honest: each module still names the file it writes or fetches."""
    for name, module in WRITTEN.items():
        assert name in (ROOT / module).read_text(encoding="utf-8"), f"{module} no longer names {name}"


@cache
def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def flag_problems(text: str, command: str | None = None) -> Iterator[str]:
    """The flags of ``text`` that ``aiayn command`` (None: every command) lacks, and their values outside the flag's
    choices."""
    who = f"aiayn {command}" if command else "aiayn"
    for flag, value in FLAG.findall(text):
        actions = [a for name in ([command] if command else commands()) for a in commands()[name]._actions]
        actions = [a for a in actions if flag in a.option_strings]
        if not actions:
            yield f"{who} has no {flag}" if command else f"no command of aiayn has {flag}"
        elif all(a.choices is not None for a in actions) and re.fullmatch(r"[a-z0-9][\w.-]*(?:[|,][\w.-]+)*", value):
            choices = sorted({str(choice) for a in actions for choice in a.choices or ()})
            wrong = [v for v in re.split(r"[|,]", value) if v not in choices and ".." not in v]
            if wrong:
                yield f"{who} {flag}: {', '.join(wrong)} is not one of {', '.join(choices)}"


def command_lines(doc: Document) -> Iterator[tuple[int, str, re.Pattern[str]]]:
    """Each piece of shell in the document with the pattern of its commands: fenced blocks line by line (a `\\`
    continuation, or a usage line's indented `[--flag ...]` continuation, joined; comments dropped), and every code
    span."""
    for offset, block in doc.blocks:
        lines: list[tuple[int, str]] = []
        position = offset
        for line in block.split("\n"):
            if lines and (lines[-1][1].endswith("\\") or re.match(r"\s+\[", line)):
                lines[-1] = (lines[-1][0], lines[-1][1].rstrip("\\") + " " + line)
            else:
                lines.append((position, line))
            position += len(line) + 1
        for start, line in lines:
            yield start, re.sub(r"(^|\s)#.*", "", line), BLOCK_COMMAND
    for offset, span in doc.spans():
        yield offset, span, SPAN_COMMAND


def test_every_command_and_flag_the_docs_name_exists() -> None:
    """`aiayn COMMAND --flag value` wherever it is written as code: the command is a subcommand of the CLI's parser,
    each flag one of its flags, and a value of a flag with choices one of them. A code span that is a flag alone
    (`--variant w8`) names a flag of some command."""
    problems = []
    for doc in documents():
        for offset, code, pattern in command_lines(doc):
            for m in pattern.finditer(code):
                command, rest = m.groups()
                if command not in commands():
                    problems.append(f"{doc.where(offset + m.start())}: aiayn has no command {command}")
                    continue
                problems += [f"{doc.where(offset + m.start())}: {p}" for p in flag_problems(rest, command)]
            if code.startswith("--") and code not in REFUSED:
                problems += [f"{doc.where(offset)}: `{code}`: {p}" for p in flag_problems(code)]
    assert not problems, "commands and flags that do not exist:\n" + "\n".join(problems)


def test_the_flags_shown_as_refused_are_refused() -> None:
    for flags, command in REFUSED.items():
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args([command, *flags.split()])


MEASURED_ON = "*Measured on:* "
# Tables of figures that no machine moves (translations' quality).
NOT_SPEED = ("| model | test set | BLEU | chrF |",)
MEASURED = re.compile(r"; (figures from the text of )?commit [0-9a-f]{7,}\b.*; \S")  # CPU; commit; command


def test_every_speed_table_names_its_machine_and_commit() -> None:
    """docs/speed.md's tables and the README's figures: the line under each names its CPU, its commit and its
    command (`*Measured on:* CPU; commit C; command.`), so that a reader can tell the AMD EPYC's from the Xeon's."""
    problems = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "speed.md"):
        lines = doc.read_text(encoding="utf-8").splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("|") and not lines[i - 1].startswith("|")]
        for start in starts:
            end = next(i for i in range(start, len(lines) + 1) if i == len(lines) or not lines[i].startswith("|"))
            note = next((line for line in lines[end : end + 3] if line.strip()), "")
            if lines[start].startswith(NOT_SPEED):
                continue
            if not (note.startswith(MEASURED_ON) and MEASURED.search(note)):
                problems.append(f"{doc.relative_to(ROOT)}:{start + 1}: no `{MEASURED_ON}CPU; commit; command` under it")
    assert not problems, "speed tables without their machine:\n" + "\n".join(problems)
