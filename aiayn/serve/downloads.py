"""The page's translated files: each in a folder of its own under one folder this server made (``aiayn-downloads-*``
in the temporary folder), deleted once they are ``Limits.download_max_age_s`` old and, beyond
``Limits.downloads_kept`` files or ``Limits.download_bytes_kept`` bytes, oldest first; the whole folder when the
server stops. Nothing outside it is touched. Torch-free."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from aiayn.serve.limits import DEFAULT_LIMITS, Limits

PREFIX = "aiayn-downloads-"


class Downloads:
    """Where the page writes each translated file; ``clock`` is ``time.time`` (a test's own clock elsewhere)."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, clock: Callable[[], float] = time.time) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        self.limits, self.clock = limits, clock
        self.written: list[tuple[float, Path, int]] = []  # (when, its folder, its bytes), oldest first
        self.lock = threading.Lock()
        weakref.finalize(self, shutil.rmtree, self.root, True)  # at exit too

    def write(self, name: str, text: str) -> Path:
        """``text`` as the file ``name`` (UTF-8) in a new folder, after the files too old or too many are deleted."""
        data = text.encode("utf-8")
        with self.lock:
            self.prune(len(data))
            folder = Path(tempfile.mkdtemp(dir=self.root))
            out = folder / name
            out.write_bytes(data)
            self.written.append((self.clock(), folder, len(data)))
        return out

    def prune(self, incoming: int) -> None:
        """Delete the files past their age, then the oldest while the kept ones and ``incoming`` bytes would be more
        than the limits allow."""
        limits, now = self.limits, self.clock()
        while self.written and (
            self.written[0][0] <= now - limits.download_max_age_s
            or len(self.written) >= limits.downloads_kept
            or sum(size for _, _, size in self.written) + incoming > limits.download_bytes_kept
        ):
            _, folder, _ = self.written.pop(0)
            shutil.rmtree(folder, ignore_errors=True)
