"""The page's translated files: each in a folder of its own under one folder this server made (``aiayn-downloads-*``
in the temporary folder), deleted once they are ``Limits.download_max_age_s`` old and, beyond
``Limits.downloads_kept`` files or ``Limits.download_bytes_kept`` bytes, oldest first; the whole folder when the
server stops. Nothing outside it is touched. Gradio serves them from there (``page.py``: a static path), copying none
into its own cache. And the uploads' count: ``BoundedUploads``, one file an upload (Gradio's own bound is 1000).
Torch-free."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aiayn.serve.limits import DEFAULT_LIMITS, Limits

PREFIX = "aiayn-downloads-"
UPLOAD_PATH = "/gradio_api/upload"
# Files one upload may carry: the page's upload box takes one file, gradio_client sends one a request. Gradio's
# multipart parser takes up to 1000 (a fixed setting of its upload route, no option of its own).
UPLOAD_FILES = 1
TOO_MANY_FILES = f'{{"error": "an upload carries at most {UPLOAD_FILES} file(s)"}}'.encode()


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


def boundary_of(scope: Scope) -> bytes | None:
    """A multipart body's boundary, from its ``Content-Type``; None where it names none."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-type" and b"boundary=" in value:
            return value.split(b"boundary=", 1)[1].split(b";", 1)[0].strip().strip(b'"') or None
    return None


class BoundedUploads:
    """ASGI middleware: an upload to the page (``POST /gradio_api/upload``) whose body begins a part past
    ``files`` is refused with 413 and one line of JSON before that part reaches Gradio; the parts are counted as
    the body streams, never read whole."""

    def __init__(self, app: ASGIApp, files: int = UPLOAD_FILES) -> None:
        self.app, self.files = app, files

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        boundary = boundary_of(scope) if scope["type"] == "http" and scope["path"] == UPLOAD_PATH else None
        if boundary is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        part = b"--" + boundary + b"\r\n"  # a part's start; the closing delimiter ends in "--"
        parts, tail, refused, started = 0, b"", False, False

        async def counted() -> Message:
            nonlocal parts, tail, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen = tail + message.get("body", b"")
                parts += seen.count(part)
                tail = seen[-(len(part) - 1) :]
                if parts > self.files:
                    refused = True
                    return {"type": "http.disconnect"}  # Gradio's parser stops; the answer is ours
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if not refused:
                started = started or message["type"] == "http.response.start"
                await send(message)

        try:
            await self.app(scope, counted, sending)
        except Exception:
            if not refused:
                raise
        if refused and not started:
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(TOO_MANY_FILES)).encode())]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": TOO_MANY_FILES})
