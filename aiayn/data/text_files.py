"""Plain or gzipped UTF-8 text files, one sentence a line: checked once in blocks, then read line by line.

``summarize_file`` reads a file in 1 MiB blocks (fast, bounded memory) and refuses it with the file and the
line named: an empty file, bytes that are not UTF-8, a line without its tab in a tab-separated file. It returns
what a training record keeps: the path, the line count and the sha256 of the file as stored (what
``sha256sum`` prints). ``read_lines`` then streams the lines themselves.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

BLOCK_BYTES = 1 << 20
FIX_ENCODING = "convert it to UTF-8 first (e.g. iconv -f latin1 -t utf-8)"


@dataclass(frozen=True)
class FileSummary:
    path: str
    lines: int
    sha256: str  # of the bytes as stored (gzipped or not)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HashingReader:
    """A binary file whose bytes are hashed as they are read (under gzip: the compressed bytes)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        return data


def text_bytes(path: Path, raw: Any) -> Any:
    """The file's text as a binary stream: gunzipped when its name ends in .gz."""
    return gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw


def not_utf8(path: Path, line: int, column: int, err: UnicodeDecodeError) -> ValueError:
    """``column``: the bad byte's 0-based offset in its line (reported 1-based, as editors count)."""
    return ValueError(f"{path}: line {line} is not UTF-8 text ({err.reason} at its byte {column + 1}); {FIX_ENCODING}")


# A line with no tab, or with two: the first such line of a chunk is all an error needs.
BAD_PAIR_LINE = re.compile(rb"^[^\t\n]*$|^[^\n]*\t[^\n]*\t", re.MULTILINE)


def check_tabs(path: Path, chunk: bytes, first_line: int) -> None:
    """Every line of ``chunk`` (complete lines, the first numbered ``first_line``) holds exactly one tab."""
    body = chunk[:-1] if chunk.endswith(b"\n") else chunk
    bad = BAD_PAIR_LINE.search(body)
    if bad is not None:
        tabs = bad.group().count(b"\t")
        line = first_line + body.count(b"\n", 0, bad.start())
        raise ValueError(
            f"{path}: line {line} has {'no' if tabs == 0 else 'more than one'} tab; "
            "each line of a pairs file must be SOURCE<TAB>TARGET"
        )


def summarize_file(path: str | Path, tab_separated: bool = False) -> FileSummary:
    """Line count and sha256 of ``path``, after checking that it is non-empty UTF-8 (and SOURCE<TAB>TARGET)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    lines = 0
    carry = b""  # the last, unfinished line of the previous block: "\n" never splits a UTF-8 character
    with path.open("rb") as raw:
        hashing = HashingReader(raw)
        text = text_bytes(path, hashing)
        try:
            while block := text.read(BLOCK_BYTES):
                end = block.rfind(b"\n") + 1
                if end == 0:
                    carry += block
                    continue
                lines = check_chunk(path, carry + block[:end], lines, tab_separated)
                carry = block[end:]
        except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
            raise ValueError(f"{path} is not gzipped UTF-8 text ({err}); copy or download it again") from err
        if carry:
            lines = check_chunk(path, carry, lines, tab_separated)
    if lines == 0:
        raise ValueError(f"{path} is empty; a corpus file holds one sentence a line")
    return FileSummary(str(path), lines, hashing.digest.hexdigest())


def check_chunk(path: Path, chunk: bytes, lines_before: int, tab_separated: bool) -> int:
    """Check complete lines (the file's last may lack its "\\n"); returns the line count after them."""
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = chunk.rfind(b"\n", 0, err.start) + 1
        line = lines_before + chunk.count(b"\n", 0, err.start) + 1
        raise not_utf8(path, line, err.start - line_start, err) from err
    if tab_separated:
        check_tabs(path, chunk, lines_before + 1)
    return lines_before + chunk.count(b"\n") + (not chunk.endswith(b"\n"))


def read_lines(path: str | Path) -> Iterator[str]:
    """The lines of ``path`` without their line ends; only "\\n" ends a line (as in ``summarize_file``)."""
    path = Path(path)
    with path.open("rb") as raw:
        for number, line in enumerate(text_bytes(path, raw), start=1):
            try:
                yield line.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise not_utf8(path, number, err.start, err) from err
